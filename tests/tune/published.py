"""Published training measurements, each row's exact layout, and what ``tune`` predicts for it.

Every row records its source. The model of a row is built from shapes alone
(abstract boxed parameters with the logical names the rules read), priced as
the one layout the source ran (:func:`partitioning.tune.price.price`: a
forced layout, no search) on the hardware profile of its chips, with the
profile's node (slice) size set to the source's slice.

MFU is compared under the source's own FLOP count: the published step time is
``source FLOPs / published FLOP/s``, the predicted MFU is ``source FLOPs /
(predicted step time x peak)``, so ``predicted / published MFU = published /
predicted step time``.

Sources:

- ``maxtext``: MaxText at commit 632f65147 (2023-12-15, "Refactor
  MaxText/configs/ and documentation"): the tables of
  ``MaxText/configs/{v5p,v5e,v4}/README.md`` (TFLOP/s per chip, MFU) and the
  scripts beside them (``global_parameter_scale``, ``per_device_batch_size``,
  ``ici_tensor_parallelism`` / ``ici_fsdp_parallelism``, ``remat_policy``);
  the model is ``MaxText/configs/base.yml`` at that commit (embed 2560, 8 heads
  of 256, MLP 8192 with one ReLU input matrix, 16 layers, vocabulary 32768,
  tied embedding, bfloat16 activations, float32 weights, sequence 2048) scaled
  as ``MaxText/pyconfig.py::get_individual_scales``; multi-slice rows put the
  slices on ``data`` (DCN); FLOPs as ``MaxText/train.py::calculate_training_tflops``
  (6 N tokens + causal attention). ``v5p-N`` and ``v4-N`` count TensorCores:
  N / 2 chips; ``v5e-N`` counts chips.
- ``megatron``: Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC'21, arXiv:2104.04473,
  Table 1 (GPT, vocabulary 51200, sequence 2048, A100 on Selene: 8 per node,
  fp16, full activation recomputation; tensor parallel inside a node,
  pipeline stages across nodes, micro-batches of one sequence); FLOPs as its
  Eq. 3 (which counts the recomputed forward pass).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from partitioning.boxes import LogicallyPartitioned
from partitioning.plan.plan import build_plan
from partitioning.rules import Rules
from partitioning.tune.hardware import PROFILES
from partitioning.tune.price import price
from partitioning.tune.space import Candidate
from partitioning.tune.workload import workload

MAXTEXT = "MaxText @ 632f65147: MaxText/configs/{hw}/README.md, MaxText/configs/{hw}/{script}.sh"
MEGATRON = "Narayanan et al. 2021 (arXiv:2104.04473), Table 1"


@dataclasses.dataclass(frozen=True)
class Row:
    """One published measurement and the layout it ran."""

    source: str  # "maxtext" | "megatron"
    cite: str
    name: str
    hardware: str  # profile name
    chips: int
    slices: int  # data-parallel slices over the data-centre network (1: one slice)
    # model
    embed: int
    heads: int
    head_dim: int
    mlp: int
    mlp_inputs: int  # input matrices of the MLP: 1 (ReLU / GeLU), 2 (gated)
    layers: int
    vocab: int
    seq: int
    # layout
    batch: int  # global, sequences
    tensor: int
    stages: int = 1
    microbatches: int = 1
    remat: str = "full"
    # measured
    tflops: float = 0.0  # published TFLOP/s per chip
    mfu: float = 0.0  # published MFU (the source's FLOPs / peak)

    @property
    def params(self) -> int:
        attn = 4 * self.embed * self.heads * self.head_dim
        mlp = (self.mlp_inputs + 1) * self.embed * self.mlp
        return self.layers * (attn + mlp + 2 * self.embed) + self.vocab * self.embed + self.embed

    @property
    def source_flops(self) -> float:
        """The source's FLOPs of one step, all chips."""
        tokens = self.batch * self.seq
        if self.source == "maxtext":
            attention = 12 * self.heads * self.layers * self.head_dim * self.seq * tokens / 2
            return 6 * self.params * tokens + attention
        h, s, l_, v = self.embed, self.seq, self.layers, self.vocab
        return 96 * self.batch * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))

    @property
    def published_step_time(self) -> float:
        return self.source_flops / (self.chips * self.tflops * 1e12)


def _maxtext_scale(scale: int) -> tuple[int, int, int, int]:
    """(embed, heads, mlp, layers) exponents of MaxText's global_parameter_scale (pyconfig.get_individual_scales)."""
    base, rem = divmod(int(math.log2(scale)), 3)
    heads = base + int(rem > 0)
    return base + int(rem > 1), heads, heads, base


def maxtext(hw: str, script: str, scale: int, per_device: int, tensor: int, remat: str, runs: dict) -> list[Row]:
    """Rows of one MaxText script: ``runs`` maps ``"<slices>x <hw>-<N>"`` to (TFLOP/s per chip, MFU %)."""
    e, h, m, lyr = _maxtext_scale(scale)
    out = []
    for label, (tflops, mfu) in runs.items():
        slices, kind = label.split("x ")
        n = int(kind.split("-")[1])
        chips = n // 2 if hw in ("v5p", "v4") else n
        total = int(slices) * chips
        out.append(
            Row(
                "maxtext",
                MAXTEXT.format(hw=hw, script=script),
                f"{scale}B {label}",
                hw,
                total,
                int(slices),
                embed=2560 * 2**e,
                heads=8 * 2**h,
                head_dim=256,
                mlp=8192 * 2**m,
                mlp_inputs=1,
                layers=16 * 2**lyr,
                vocab=32768,
                seq=2048,
                batch=per_device * total,
                tensor=tensor,
                remat={"minimal": "dots_no_batch", "full": "full"}[remat],
                tflops=tflops,
                mfu=mfu / 100,
            )
        )
    return out


def maxtext_custom(hw, script, dims, per_device, fsdp, remat, runs) -> list[Row]:
    """Rows of a MaxText script that sets the model's dims (base_emb_dim, ...) instead of a scale."""
    embed, heads, mlp, layers = dims
    out = []
    for label, (tflops, mfu) in runs.items():
        slices, kind = label.split("x ")
        chips = int(kind.split("-")[1]) // 2
        assert chips == fsdp, (label, fsdp)
        total = int(slices) * chips
        out.append(
            Row(
                "maxtext",
                MAXTEXT.format(hw=hw, script=script),
                f"{script} {label}",
                hw,
                total,
                int(slices),
                embed=embed,
                heads=heads,
                head_dim=256,
                mlp=mlp,
                mlp_inputs=1,
                layers=layers,
                vocab=32768,
                seq=2048,
                batch=per_device * total,
                tensor=1,
                remat={"minimal": "dots_no_batch", "full": "full"}[remat],
                tflops=tflops,
                mfu=mfu / 100,
            )
        )
    return out


def megatron(params_b, heads, hidden, layers, t, p, n, batch, tflops, pct) -> Row:
    """One row of Table 1: tensor t inside a node, p pipeline stages, micro-batches of one sequence."""
    d = n // (t * p)
    return Row(
        "megatron",
        MEGATRON,
        f"{params_b}B on {n} GPUs (t={t}, p={p})",
        "a100-80g",
        n,
        1,
        embed=hidden,
        heads=heads,
        head_dim=hidden // heads,
        mlp=4 * hidden,
        mlp_inputs=1,
        layers=layers,
        vocab=51200,
        seq=2048,
        batch=batch,
        tensor=t,
        stages=p,
        microbatches=batch // d if p > 1 else 1,
        remat="full",
        tflops=tflops,
        mfu=pct / 100,
    )


V5P = "v5p-128", "v5p-256", "v5p-512", "v5p-1024", "v5p-2048", "v5p-4096"
ROWS: list[Row] = [
    *maxtext("v5p", "32b", 32, 8, 4, "minimal", {"1x v5p-128": (328, 71.47), "2x v5p-128": (319, 69.43)}),
    *maxtext("v5p", "64b", 64, 4, 4, "minimal", {"1x v5p-128": (323, 70.31), "2x v5p-128": (309, 67.26)}),
    *maxtext(
        "v5p",
        "128b",
        128,
        2,
        8,
        "minimal",
        {
            "1x v5p-256": (315, 68.68),
            "2x v5p-256": (305, 66.34),
            "1x v5p-512": (316, 68.83),
            "2x v5p-512": (274, 59.66),
        },
    ),
    *maxtext("v5p", "256b", 256, 2, 8, "minimal", {"1x v5p-1024": (308, 67.09), "2x v5p-1024": (289, 62.99)}),
    *maxtext("v5p", "512b", 512, 2, 16, "full", {"1x v5p-1024": (294, 63.99), "2x v5p-1024": (282, 61.45)}),
    *maxtext(
        "v5p",
        "1024b",
        1024,
        2,
        16,
        "full",
        {
            "1x v5p-2048": (254, 55.35),
            "2x v5p-2048": (237, 51.55),
            "1x v5p-4096": (297, 64.80),
            "2x v5p-4096": (279, 60.83),
        },
    ),
    *maxtext(
        "v5e",
        "16b",
        16,
        6,
        1,
        "full",
        {
            "1x v5e-256": (120, 61.10),
            "2x v5e-256": (117, 59.37),
            "4x v5e-256": (117, 59.14),
            "8x v5e-256": (115, 58.27),
            "16x v5e-256": (111, 56.56),
            "32x v5e-256": (108, 54.65),
        },
    ),
    *maxtext(
        "v5e",
        "32b",
        32,
        4,
        1,
        "full",
        {
            "1x v5e-256": (132, 66.86),
            "2x v5e-256": (128, 64.81),
            "4x v5e-256": (126, 64.10),
            "8x v5e-256": (125, 63.67),
            "16x v5e-256": (123, 62.26),
            "32x v5e-256": (119, 60.40),
        },
    ),
    *maxtext(
        "v5e",
        "64b",
        64,
        2,
        1,
        "full",
        {
            "1x v5e-256": (118, 59.90),
            "2x v5e-256": (112, 56.66),
            "4x v5e-256": (110, 55.85),
            "8x v5e-256": (108, 54.96),
            "16x v5e-256": (105, 53.29),
            "32x v5e-256": (99, 50.18),
        },
    ),
    *maxtext(
        "v5e",
        "128b",
        128,
        1,
        16,
        "full",
        {
            "1x v5e-256": (110, 56.06),
            "2x v5e-256": (110, 55.82),
            "4x v5e-256": (108, 54.93),
            "8x v5e-256": (104, 52.93),
            "16x v5e-256": (100, 50.86),
            "32x v5e-256": (91, 46.25),
        },
    ),
    *maxtext_custom(
        "v4",
        "22b",
        (6144, 24, 24576, 48),
        16,
        64,
        "full",
        {"1x v4-128": (156, 56.7), "2x v4-128": (152, 55.2), "4x v4-128": (149, 54.3), "8x v4-128": (146, 53.2)},
    ),
    *maxtext_custom(
        "v4", "52b", (12288, 32, 49152, 32), 10, 192, "full", {"1x v4-384": (154, 56.0), "2x v4-384": (162, 58.9)}
    ),
    megatron(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    megatron(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    megatron(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    megatron(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    megatron(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    megatron(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    megatron(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    megatron(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    megatron(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    megatron(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
]


def _box(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    return LogicallyPartitioned(jax.ShapeDtypeStruct(shape, jnp.float32), names)


def abstract_params(row: Row) -> dict[str, Any]:
    """The row's decoder as boxed abstract params: scanned blocks with a ``layers`` axis, a tied embedding."""
    e, h, k, f, n = row.embed, row.heads, row.head_dim, row.mlp, row.layers
    block = {
        "q": _box((n, e, h, k), ("layers", "embed", "heads", "kv")),
        "k": _box((n, e, h, k), ("layers", "embed", "kv_heads", "kv")),
        "v": _box((n, e, h, k), ("layers", "embed", "kv_heads", "kv")),
        "o": _box((n, h, k, e), ("layers", "heads", "kv", "embed")),
        "wo": _box((n, f, e), ("layers", "mlp", "embed")),
        "norms": _box((n, 2, e), ("layers", None, "embed")),
    }
    for i in range(row.mlp_inputs):
        block[f"wi_{i}"] = _box((n, e, f), ("layers", "embed", "mlp"))
    # Tied: the table is also the output projection, a matmul (embed, vocab).
    table = _box((e, row.vocab), ("embed", "vocab"))
    return {"embedding": table, "blocks": block, "final_norm": _box((e,), ("embed",))}


def layout(row: Row) -> tuple[dict[str, int], Rules]:
    """The row's mesh (outermost first) and rules."""
    if row.source == "megatron":
        d = row.chips // (row.tensor * row.stages)
        mesh = {"stage": row.stages, "data": d, "tensor": row.tensor}
        return mesh, Rules([["layers", "stage"]]) + Rules.preset("tp")
    fsdp = row.chips // (row.slices * row.tensor)
    return {"data": row.slices, "fsdp": fsdp, "tensor": row.tensor}, Rules.preset("fsdp_tp")


def hardware_of(row: Row, efficiency: float | None = None) -> Any:
    """The row's profile: its chips per node (GPUs) / per slice (TPUs), and an efficiency if given."""
    hw = PROFILES[row.hardware]
    if row.source == "maxtext":
        hw = dataclasses.replace(hw, node_size=row.chips // row.slices)
    return hw if efficiency is None else dataclasses.replace(hw, efficiency=efficiency)


def predict(row: Row, efficiency: float | None = None) -> Any:
    """The priced :class:`~partitioning.tune.space.Result` of the row's layout."""
    params = abstract_params(row)
    opt_state = {"mu": params, "nu": params}
    mesh, rules = layout(row)
    plan = build_plan(params, None, {"data": 1}, Rules([]), on_indivisible="replicate")
    w = workload(plan.params, batch_size=row.batch, seq_len=row.seq, compute_dtype="bfloat16")
    records = []
    if row.stages > 1:
        records = [
            {
                "kind": "pipeline",
                "layers": row.layers,
                "stages": 1,
                "microbatches": 1,
                "repeats": 1,
                "shape": (row.batch, row.seq, row.embed),
                "dtype": "bfloat16",
                "batch_axes": ("data",),
            }
        ]
    c = Candidate(tuple(mesh.items()), row.source, row.remat, 1, False, row.microbatches)
    hw = hardware_of(row, efficiency)
    return price(params, opt_state, c, rules, w, hw, float("inf"), records=records, on_indivisible="replicate")


def predicted_mfu(row: Row, efficiency: float | None = None) -> float:
    """The row's MFU under its source's FLOP count, from the predicted step time."""
    r = predict(row, efficiency)
    return row.source_flops / (r.step_time * row.chips * PROFILES[row.hardware].peak_flops)


# Calibration: per profile, the rows at the extremes of what varies among its rows (model size, slices);
# the efficiency whose predictions are right on them on average (geometric mean). The other rows check.
CALIBRATION = {
    "v5p": lambda r: r.name.startswith(("128B", "1024B")),
    "v5e": lambda r: r.slices in (1, 32),
    "v4": lambda r: r.name == "22b 1x v4-128",
    "a100-80g": lambda r: r.name.startswith(("1.7B", "18.4B", "1008.0B")),
}


def calibrates(row: Row) -> bool:
    return CALIBRATION[row.hardware](row)


def _step_at(estimate: Any, efficiency: float) -> float:
    """The estimate's step time with its compute (and the bubble, a share of it) at ``efficiency``."""
    other = {k: v / efficiency if k == "pipeline bubble" else v for k, v in estimate.other.items()}
    compute = {p: c / efficiency for p, c in estimate.compute.items()}
    return dataclasses.replace(estimate, compute=compute, other=other).step_time


def calibrate() -> dict[str, float]:
    """Per profile, the efficiency (to 3 decimals) that makes the calibration rows' mean log error zero."""
    out = {}
    for name in CALIBRATION:
        rows = [(r, predict(r, 1.0).analytic) for r in ROWS if r.hardware == name and calibrates(r)]
        lo, hi = 0.05, 1.0
        for _ in range(50):
            k = (lo + hi) / 2
            mean = sum(math.log(r.published_step_time / _step_at(e, k)) for r, e in rows) / len(rows)
            lo, hi = (lo, k) if mean > 0 else (k, hi)  # published slower: lower the efficiency
        out[name] = round(k, 3)
    return out


def table(efficiency: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Every row: published and predicted MFU (the profiles' efficiency unless ``efficiency`` per hardware)."""
    out = []
    for row in ROWS:
        pred = predicted_mfu(row, (efficiency or {}).get(row.hardware))
        out.append(
            {
                "row": row,
                "published": row.mfu,
                "predicted": pred,
                "error": pred / row.mfu - 1,
                "calibration": calibrates(row),
            }
        )
    return out


if __name__ == "__main__":  # python -m tests.tune.published [--raw | --calibrate]: the docs/performance.md table
    import sys

    if "--calibrate" in sys.argv:
        print(calibrate())
        sys.exit(0)
    eff = {name: 1.0 for name in PROFILES} if "--raw" in sys.argv else None
    print("| source | row | chips | layout | remat | published MFU | predicted MFU | error | role |")
    print("|---|---|---:|---|---|---:|---:|---:|---|")
    for t in table(eff):
        r = t["row"]
        mesh, _ = layout(r)
        shape = ", ".join(f"{a} {n}" for a, n in mesh.items() if n > 1)
        if r.stages > 1:
            shape += f", M={r.microbatches}"
        print(
            f"| {r.source} | {r.name} | {r.chips} {r.hardware} | {shape} | {r.remat} | {t['published']:.1%} | "
            f"{t['predicted']:.1%} | {t['error']:+.1%} | {'calibration' if t['calibration'] else 'check'} |"
        )
