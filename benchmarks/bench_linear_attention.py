"""Linear attention (Qwen3.5's gated delta rule) vs full attention at a long sequence: step time and memory.

    python benchmarks/bench_linear_attention.py [--seq 8192] [--rounds 5] [--json out.json]

One layer of each, the same width (embed 1024, 16 value heads of 64 for the linear layer, 16 heads of 64
for the full one: Qwen3.5's 4:1 head ratio is kept with 8 key heads), batch 1, float32 on one CPU
device, forward and backward (``jax.grad`` of the summed output) jitted:

1. ``step_s``: the median time of a forward + backward (the sides alternate, reversed every other round,
   so both see the same machine load);
2. ``temp_bytes``: the compiled step's temporaries (XLA's memory analysis): the full layer's ``(t, t)``
   scores per head against the linear layer's ``(chunk, chunk)`` products and one state per chunk;
3. the ratios linear / full. The linear layer's cost grows as ``t``, the full one's as ``t^2``: the
   ratio falls as ``--seq`` grows.

Prints a JSON object (also written to ``--json``). The figures in the docs come from a run on an idle
machine; run it at ``--seq 512`` to see it work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import report, setup

EMBED, HEADS, HEAD = 1024, 16, 64


def layers():
    import jax.numpy as jnp

    from partitioning.models.attention import Attention
    from partitioning.models.linear_attention import GatedDeltaNet, LinearShape

    shape = LinearShape(key_heads=HEADS // 2, value_heads=HEADS, key_dim=HEAD, value_dim=HEAD, conv_kernel=4)
    return {
        "linear": GatedDeltaNet(shape, jnp.float32, jnp.float32),
        "full": Attention(HEADS, HEADS, HEAD, 10000.0, jnp.float32, jnp.float32),
    }


def compiled(layer, seq: int):
    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.key(0), (1, seq, EMBED), jnp.float32)
    params = jax.jit(layer.init)(jax.random.key(1), x[:, :16])

    def loss(p, x):
        return jnp.sum(layer.apply(p, x))

    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    exe = step.lower(params, x).compile()
    return exe, params, x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    setup(1)
    import jax

    sides = {name: compiled(layer, args.seq) for name, layer in layers().items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for exe, params, x in sides.values():  # warm up
        jax.block_until_ready(exe(params, x))
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            exe, params, x = sides[name]
            start = time.perf_counter()
            jax.block_until_ready(exe(params, x))
            times[name].append(time.perf_counter() - start)
    results: dict = {"seq": args.seq, "embed": EMBED, "heads": HEADS, "head_dim": HEAD, "rounds": args.rounds}
    for name, (exe, _, _) in sides.items():
        mem = exe.memory_analysis()
        results[name] = {"step_s": statistics.median(times[name]), "temp_bytes": int(mem.temp_size_in_bytes)}
    results["linear_over_full"] = {
        k: results["linear"][k] / results["full"][k] for k in ("step_s", "temp_bytes") if results["full"][k]
    }
    report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
