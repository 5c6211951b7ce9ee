"""The compute term of the cost model: each phase's matmuls at the efficiency of their shapes, attention as it runs,
and the memory-bound work between them.

Per device and phase (forward, backward with any recomputation, optimizer update):

- **matmuls**, one per weight (a parameter with two or more dimensions besides a
  stacked ``layers`` axis; lookup tables ``(vocab, embed)`` excepted): the weight
  ``(K, N)`` in its compute layout (split over the axes that are not token axes:
  FSDP gathers) multiplies ``M`` tokens (the device's tokens per pass; an expert
  weight's ``capacity`` share of them, its experts batched). The input is the
  dimensions before ``embed`` (row-parallel projections into the residual stream)
  or ``embed`` itself (projections out of it). The forward pass runs ``(M, N, K)``,
  the backward pass the input gradient ``(M, K, N)`` and, for a weight that trains,
  its gradient ``(K, N, M)``: a frozen weight (LoRA's base, ``train.trainable``)
  costs no weight-gradient FLOPs. Each GEMM takes ``2 M N K / (peak x e(M, N, K))``
  with ``e`` the profile's GEMM table (:mod:`partitioning.tune.efficiency`; 1 without one);
- **attention**, by implementation (:func:`attention_kind`): a fused kernel
  (cuDNN's flash attention, MaxText's splash / cudnn_flash_te) computes the causal
  half of the scores as GEMMs of ``(B H T, T, head_dim)``, its backward pass 2.5
  times the forward (it recomputes the scores), and keeps ``O(T)`` per head; the
  einsums (``attention: xla``) compute the whole square, write the float32 scores
  and the probabilities to memory and read them back (12 bytes per score forward,
  18 backward), and keep the ``T x T`` probabilities for the backward pass;
- **memory-bound work**: norms, residual adds, rotary, the MLP's activation
  (``s (10 D + 3 F + 2 Q + 4 KV)`` bytes per token and layer forward, twice that
  backward, ``s`` the compute dtype's bytes), the float32 logits and their
  softmax (8 bytes per logit forward, 12 backward) at the HBM bandwidth; the
  optimizer update streams params, gradients and optimizer state through HBM.

The forward and backward terms are divided by the profile's ``efficiency``: the
share of the priced kernels' speed a training step keeps (launch gaps, the work
between kernels the model does not see), calibrated on published runs
(``tests/tune/published.py``). ``remat: full`` runs the forward matmuls and their
memory-bound work again in the backward pass, ``dots_no_batch`` (and ``offload``)
the attention products.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> from partitioning.tune.compute import compute_terms
    >>> model = GPT(vocab_size=32000, embed=2048, heads=16, mlp=8192, layers=16, dtype="bfloat16")
    >>> params, opt = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=2048)
    >>> plan = pt.build_plan(params, opt, {"data": 1, "fsdp": 8}, "fsdp")
    >>> w = pt.tune.workload(plan.params, batch_size=8, seq_len=2048, attention="fused")
    >>> c = compute_terms(plan.params, {"data": 1, "fsdp": 8}, pt.Rules.preset("fsdp"), w, pt.tune.hardware("h100"),
    ...                   remat="none", grad_accum=1)
    >>> sorted(c.seconds), c.seconds["bwd"] > c.seconds["fwd"] > 0
    (['bwd', 'fwd', 'update'], True)
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from partitioning.layout import LeafLayout
from partitioning.resolve import IndivisibleWarning, axes_tuple
from partitioning.rules import Rules
from partitioning.tune.comm import OWNED, token_axes
from partitioning.tune.hardware import Hardware
from partitioning.tune.workload import Workload, param_path

CAUSAL = 0.5  # a fused kernel skips the masked half of the scores
FLASH_BACKWARD = 2.5  # flash attention's backward pass: five GEMMs of the scores' size against the forward's two
# Per score, the memory traffic of the einsum path (attention: xla) beside its two GEMMs: the float32 scores, the
# mask, the softmax's passes and their gradients as XLA compiles them, ~100 bytes in all. Measured on one H200
# (benchmarks/results/gpu_h200_run2.json: the 2,048-token row sets it, the 4,096 row checks).
XLA_SCORE_BYTES = {"fwd": 40.0, "bwd": 60.0}
# A hand-fused softmax kernel over materialized scores (Megatron-LM's scale + mask + softmax, 16-bit): the
# scores read and the probabilities written; backward the probabilities and their gradient read, one written.
SOFTMAX_SCORE_BYTES = {"fwd": 4.0, "bwd": 6.0}
LOGIT_BYTES = {"fwd": 8.0, "bwd": 12.0}  # per logit: float32 logits and their softmax / gradient


@dataclasses.dataclass
class Compute:
    """A layout's compute per phase and device (see the module docstring)."""

    flops: dict[str, float]  # FLOPs actually run (matmuls and attention products)
    matmul: dict[str, float]  # seconds of matmuls and attention products at their shapes' efficiency
    memory: dict[str, float]  # seconds of memory-bound work at the HBM bandwidth
    hbm_bytes: dict[str, float]
    efficiency: float = 1.0

    @property
    def seconds(self) -> dict[str, float]:
        """Per phase: forward and backward at the profile's efficiency; the update as the memory it streams."""
        return {p: (self.matmul[p] + self.memory[p]) / (self.efficiency if p != "update" else 1.0) for p in self.matmul}

    @property
    def rate(self) -> float:
        """FLOP/s the matmuls run at, all phases together (their FLOPs over their seconds)."""
        t = sum(self.matmul.values())
        return sum(self.flops.values()) / t if t else 0.0


def attention_kind(w: Workload, hw: Hardware | None = None) -> str:
    """``fused``, ``xla`` or ``softmax`` (scores materialized, one fused softmax kernel: Megatron-LM's): the
    workload's attention, ``auto`` resolved as the toolkit resolves it (cuDNN on an
    NVIDIA GPU with a 16-bit compute dtype, the einsums elsewhere: the CPU, TPUs, float32).

    Example::

        >>> import dataclasses
        >>> from partitioning.tune.compute import attention_kind
        >>> w = pt.tune.Workload(params=1, matmul_params=1, batch=1, seq_len=8, layers=1, embed=8, compute_bytes=2,
        ...                      attention="auto")
        >>> attention_kind(w, pt.tune.hardware("h100")), attention_kind(w, pt.tune.hardware("v5p"))
        ('fused', 'xla')
    """
    kind = getattr(w, "attention", "xla")
    if kind != "auto":
        return "fused" if kind in ("fused", "cudnn", "flash") else "softmax" if kind == "softmax" else "xla"
    gpu = hw is not None and hw.topology == "nodes" and not hw.measured
    return "fused" if gpu and w.compute_bytes == 2 else "xla"


def _gemm(hw: Hardware, m: float, n: float, k: float) -> float:
    """Seconds of one ``(m, n, k)`` GEMM."""
    e = hw.gemm.efficiency(m, n, k) if hw.gemm is not None else 1.0
    return 2.0 * m * n * k / (hw.peak_flops * e)


def _split(rules: Rules, mesh: Mapping[str, int], names: Sequence[Any], shape: Sequence[int], tokens) -> float:
    """How many devices split an activation's non-token dimensions (its elements per device = size / this / tokens)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IndivisibleWarning)
        spec = rules.resolve(tuple(names), tuple(shape), dict(mesh), on_indivisible="replicate")
    return math.prod(mesh.get(a, 1) for e in spec for a in axes_tuple(e) if a not in tokens)


def _matmuls(leaf: LeafLayout, mesh: Mapping[str, int], tokens: Sequence[str], w: Workload, mt: float):
    """``(count, M, N, K)`` of one weight's forward GEMM per pass (None: not a matmul weight)."""
    names = list(leaf.names or ())
    names += [None] * (len(leaf.shape) - len(names))
    if tuple(names) == ("vocab", "embed"):
        return None  # a lookup table
    spec = list(leaf.spec) + [None] * (len(leaf.shape) - len(leaf.spec))

    def local(i: int) -> float:
        return leaf.shape[i] / math.prod(mesh.get(a, 1) for a in axes_tuple(spec[i]) if a not in tokens)

    count, m = 1.0, mt
    dims = []
    for i, n in enumerate(names):
        if n == "layers":
            count *= leaf.shape[i] / leaf.shards_per_dim[i]
        elif n in OWNED and "mlp" in names:  # an expert weight: its experts batched, each on its capacity share
            count *= leaf.shape[i] / leaf.shards_per_dim[i]
            m = mt * w.expert_fraction * leaf.shards_per_dim[i]
        else:
            dims.append(i)
    if len(dims) < 2:
        return None
    named = [names[i] for i in dims]
    cut = 1 if "embed" not in named or named.index("embed") == 0 else named.index("embed")
    k = math.prod(local(i) for i in dims[:cut])
    n = math.prod(local(i) for i in dims[cut:])
    return count, m, n, k


def compute_terms(
    params: Sequence[LeafLayout],
    mesh: Mapping[str, int],
    rules: Rules,
    w: Workload,
    hw: Hardware,
    *,
    remat: str,
    grad_accum: int,
    state_bytes: Mapping[str, float] | None = None,
    frozen: Collection[str] = (),
    microbatches: int = 1,
    recompute: float | None = None,
) -> Compute:
    """The :class:`Compute` of one layout (see the module docstring). ``frozen``: paths (without ``params/``) of
    params that do not train; ``microbatches``: the pipeline's ``M`` (a stage runs its layers on each);
    ``recompute``: the share of the forward weight matmuls the backward pass runs again, for a policy the
    toolkit has no name for (default: ``remat``'s: 1 for ``full``, else 0)."""
    tokens = token_axes(rules, mesh, w)
    stages = max(
        (
            leaf.shards_per_dim[list(leaf.names).index("layers")]
            for leaf in params
            if leaf.names and "layers" in leaf.names
        ),
        default=1,
    )
    passes = grad_accum * (microbatches if stages > 1 else 1)
    mt = w.tokens / passes / math.prod(mesh[a] for a in tokens)  # tokens per device and pass
    flops = {"fwd": 0.0, "bwd": 0.0, "update": 0.0}
    mm = {"fwd": 0.0, "bwd": 0.0, "update": 0.0}
    redo = {"full": 1.0}.get(remat, 0.0) if recompute is None else float(recompute)
    for leaf in params:
        shape = _matmuls(leaf, mesh, tokens, w, mt)
        if shape is None:
            continue
        count, m, n, k = shape
        f, fwd = 2.0 * m * n * k * count * passes, _gemm(hw, m, n, k) * count * passes
        trains = param_path(leaf.path) not in frozen
        bwd = _gemm(hw, m, k, n) * count * passes + (_gemm(hw, k, n, m) * count * passes if trains else 0.0)
        flops["fwd"] += f
        flops["bwd"] += f * (1 + trains) + redo * f
        mm["fwd"] += fwd
        mm["bwd"] += bwd + redo * fwd
    s = w.compute_bytes
    layers = w.layers / stages
    hbm = {"fwd": 0.0, "bwd": 0.0, "update": 0.0}
    b, t = max(1, w.batch // passes), w.seq_len
    if w.heads and w.head_dim:
        heads = w.heads / _split(rules, mesh, ("batch", "length", "heads", "kv"), (b, t, w.heads, w.head_dim), tokens)
        rows = mt * heads  # query rows of the scores per device and pass
        again = 1.0 if remat in ("full", "dots_no_batch", "offload") else 0.0
        runs = layers * passes
        kind = attention_kind(w, hw)
        if kind == "fused":
            f = 4.0 * rows * t * w.head_dim * CAUSAL * runs
            sec = _gemm(hw, rows, t, w.head_dim) * 2 * CAUSAL * runs
            flops["fwd"] += f
            flops["bwd"] += (FLASH_BACKWARD + again) * f
            mm["fwd"] += sec
            mm["bwd"] += (FLASH_BACKWARD + again) * sec
        else:
            f = 4.0 * rows * t * w.head_dim * runs
            sec = (_gemm(hw, rows, t, w.head_dim) + _gemm(hw, rows, w.head_dim, t)) * runs
            flops["fwd"] += f
            flops["bwd"] += (2 + again) * f
            mm["fwd"] += sec
            mm["bwd"] += (2 + again) * sec
            scores = rows * t * runs
            per = SOFTMAX_SCORE_BYTES if kind == "softmax" else XLA_SCORE_BYTES
            hbm["fwd"] += per["fwd"] * scores
            hbm["bwd"] += (per["bwd"] + again * per["fwd"]) * scores
    per_token = _elementwise(rules, mesh, w, b, tokens)
    redo_mem = redo
    hbm["fwd"] += s * per_token * mt * layers * passes
    hbm["bwd"] += (2 + redo_mem) * s * per_token * mt * layers * passes
    if w.vocab:
        v = w.vocab / _split(rules, mesh, ("batch", "length", "vocab"), (b, t, w.vocab), tokens)
        hbm["fwd"] += LOGIT_BYTES["fwd"] * v * mt * passes
        hbm["bwd"] += LOGIT_BYTES["bwd"] * v * mt * passes
    st = state_bytes or {}
    hbm["update"] = 2 * st.get("params", 0.0) + 2 * st.get("optimizer", 0.0) + st.get("gradients", 0.0)
    memory = {p: hbm[p] / hw.memory_bandwidth for p in hbm}
    return Compute(flops, mm, memory, hbm, hw.efficiency)


def _elementwise(rules: Rules, mesh: Mapping[str, int], w: Workload, b: int, tokens: Sequence[str]) -> float:
    """Elements per token and layer the memory-bound ops of one block touch in the forward pass, per device."""
    t = w.seq_len
    d = w.embed / _split(rules, mesh, ("batch", "length", "embed"), (b, t, w.embed), tokens)
    f = w.mlp / _split(rules, mesh, ("batch", "length", "mlp"), (b, t, w.mlp), tokens) if w.mlp else 0.0
    q = kv = 0.0
    if w.heads and w.head_dim:
        q = (
            w.heads
            * w.head_dim
            / _split(rules, mesh, ("batch", "length", "heads", "kv"), (b, t, w.heads, w.head_dim), tokens)
        )
        kv = (
            w.kv_heads
            * w.head_dim
            / _split(rules, mesh, ("batch", "length", "kv_heads", "kv"), (b, t, w.kv_heads, w.head_dim), tokens)
        )
    if w.experts:
        f *= w.experts * w.expert_fraction
    return 10 * d + 3 * f + 2 * q + 4 * kv


def local_tokens(rules: Rules, mesh: Mapping[str, int], w: Workload) -> float:
    """Tokens per device of the whole step (every micro-batch).

    Example::

        >>> from partitioning.tune.compute import local_tokens
        >>> w = pt.tune.Workload(params=1, matmul_params=1, batch=16, seq_len=128, layers=1, embed=8)
        >>> local_tokens(pt.Rules.preset("fsdp"), {"data": 2, "fsdp": 4}, w)
        256.0
    """
    return w.tokens / math.prod(mesh[a] for a in token_axes(rules, mesh, w))


__all__ = ["Compute", "compute_terms", "attention_kind", "local_tokens", "CAUSAL", "FLASH_BACKWARD"]
