"""The workload: a model's shape read off its parameters' logical names, its FLOPs, and its activation memory.

:func:`workload` reads, from the plan's parameter layouts (shapes and logical
names, no config): the parameter count, the widths ``embed`` (D), ``mlp`` (F),
``heads`` (H), ``kv_heads`` (G), ``kv`` (K), ``vocab`` (V) and the number of
layers (the ``layers`` axis of scanned parameters, else the numbered blocks).

FLOPs per step (analytic, the usual transformer count): every matmul weight
costs 2 FLOPs per token forward and 4 backward (2: a frozen weight has no
weight gradient), and attention ``4 T H K`` per token and layer forward
(``QK^T`` and ``PV``); ``remat: full`` runs the forward again in the backward
pass, ``dots_no_batch`` its attention products (the matmuls with batch
dimensions, which it does not save), ``dots`` no matmul. The model FLOPs of
MFU leave the recomputation out: ``6 N tokens + 12 L T H K tokens``. What the
hardware runs, shape by shape, is :mod:`partitioning.tune.compute`'s.

Activation bytes per device (:func:`activation_bytes`), for a transformer
block of the names above, with ``s`` the compute dtype's bytes and each
tensor's per-device size from the rule walk of its activation names:

- ``remat: none`` keeps per layer ``s (6R + 2Q + 2KV + 4M) + (8 + s) S + 8R``
  (R residual ``(batch, length, embed)``, Q ``(.., heads, kv)``, KV
  ``(.., kv_heads, kv)``, M ``(.., mlp)``, S the ``(batch, heads, length, length)``
  attention scores: float32 scores and probabilities, and the probabilities
  in the compute dtype; 8R the float32 norm inputs and the row-parallel
  partial sums);
- ``dots`` keeps the matmul outputs: ``s (2R + 2Q + 2KV + 2M + S)``;
- ``dots_no_batch`` keeps those without batch dimensions (the projections,
  not the attention products): ``s (2R + Q + 2KV + 2M)``;
- ``full`` keeps only each layer's input ``s R`` and recomputes one layer
  (the ``none`` set once) in the backward pass;
- ``offload`` keeps each layer's input ``s R`` on the device and what
  ``dots_no_batch`` keeps in host memory (``host``, not in the device total:
  written in the forward pass and read back in the backward one), recomputing
  the attention products as ``dots_no_batch`` does;

(``M`` counted for a gated MLP's two input matrices, half of it for one;) with
a fused attention kernel (``attention: fused``: cuDNN, flash) ``S`` is a float32
log-sum-exp per query and head, not the ``T x T`` scores;

plus the float32 logits (three copies: logits, softmax, their gradient; of one
micro-batch when pipelined, as the recomputed layer), the weights one layer
gathers under FSDP (twice, in the compute dtype on an accelerator, and the
largest one's gradient in the params' dtype before its reduce-scatter) and, with
micro-batches, a float32 gradient accumulator. An estimate, within about 25% of XLA's compiled ``temp`` for the
reference GPT in float32 on the CPU (tests/tune/test_workload.py); XLA's CPU
backend computes bfloat16 in float32, so its compiled figure for a bfloat16
model is above this estimate (and above what a TPU or GPU needs). The tuner
compiles its finalists: the compiled view is the measure.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> llama70b = GPT(vocab_size=128_256, embed=8192, heads=64, kv_heads=8, mlp=28672, layers=80)
    >>> params, opt_state = pt.abstract_train_state(llama70b, optax.adamw(1e-4), batch_size=256, seq_len=2048)
    >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 256, "tensor": 8}, "fsdp_tp")
    >>> w = pt.tune.workload(plan.params, batch_size=256, seq_len=2048, compute_dtype="bfloat16")
    >>> w.layers, w.embed, w.mlp, w.flops_per_step("full")["total"] > 0
    (80, 8192, 28672, True)
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from partitioning.finetune.quantize import weight_counts
from partitioning.layout import LeafLayout
from partitioning.resolve import IndivisibleWarning, axes_tuple
from partitioning.rules import Rules

REMATS = ("none", "dots", "dots_no_batch", "offload", "full")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one train step computes: parameter count, widths, layers, tokens and dtypes.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
        >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
        >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
        >>> w.tokens, w.flops_per_step("full")["total"] > w.flops_per_step("none")["total"]   # remat recomputes
        (4096, True)
    """

    params: int
    matmul_params: int  # parameters used in matmuls (lookup tables left out)
    batch: int  # global batch (sequences)
    seq_len: int
    layers: int
    embed: int
    mlp: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    vocab: int = 0
    compute_bytes: int = 4  # bytes of the compute dtype (activations)
    expert_params: int = 0  # matmul parameters with an `expert` dimension (a mixture of experts)
    experts: int = 0
    expert_fraction: float = 1.0  # of each expert's weights' dense work done: capacity / tokens per group
    attention: str = "xla"  # xla (einsums: T x T scores in memory) | fused (a flash kernel: O(T)) | auto (by hardware)
    mlp_inputs: int = 2  # input matrices of the MLP: 2 gated (SwiGLU), 1 (ReLU / GeLU)
    frozen_params: int = 0  # matmul parameters that do not train: no weight gradient (LoRA's base)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def active_matmul_params(self) -> float:
        """Matmul parameters one token uses: an expert's weights only on the tokens routed to it."""
        return self.matmul_params - self.expert_params + self.expert_params * self.expert_fraction

    def flops_per_step(self, remat: str = "none") -> dict[str, float]:
        """Analytic FLOPs of one step: ``fwd``, ``bwd``, ``recompute``, ``total`` and ``model`` (for MFU)."""
        attn = 4 * self.seq_len * self.heads * self.head_dim * self.layers
        fwd = self.tokens * (2 * self.active_matmul_params + attn)
        recompute = {"full": fwd, "dots_no_batch": self.tokens * attn, "offload": self.tokens * attn}.get(remat, 0.0)
        return {
            "fwd": float(fwd),
            "bwd": 2.0 * fwd - 2.0 * self.tokens * self.frozen_params,  # no weight gradient for frozen weights
            "recompute": float(recompute),
            "total": 3.0 * fwd + recompute,
            "model": 3.0 * fwd,
            "six_n": 6.0 * self.params * self.tokens,
        }


def param_path(path: str) -> str:
    """A leaf's path as ``frozen`` names it: without the ``params/`` of a train state's tree."""
    return path[len("params/") :] if path.startswith("params/") else path


def _dim(layouts: Sequence[LeafLayout], name: str) -> int:
    # strict=False: an array may name fewer dimensions than it has (the trailing ones are unnamed).
    sizes = [s for leaf in layouts if leaf.names for n, s in zip(leaf.names, leaf.shape, strict=False) if n == name]
    return max(sizes, default=0)


def _layers(layouts: Sequence[LeafLayout]) -> int:
    n = _dim(layouts, "layers")
    if n:
        return n
    blocks = {
        m.group(1)
        for leaf in layouts
        if leaf.names and "mlp" in leaf.names
        for m in [re.search(r"_(\d+)(?:/|$)", leaf.path)]
        if m
    }
    return max(1, len(blocks))


def workload(
    params: Sequence[LeafLayout],
    *,
    batch_size: int,
    seq_len: int,
    compute_dtype: Any = None,
    expert_layer: Mapping[str, Any] | None = None,
    attention: str = "xla",
    frozen: Collection[str] = (),
) -> Workload:
    """The :class:`Workload` of a model from its parameter layouts (``plan.params``).

    ``expert_layer``: a mixture of experts' traced record
    (:func:`partitioning.parallel.trace.recording`: ``experts``, ``capacity``,
    ``groups``), traced with this batch: each expert computes ``capacity`` of
    every group's tokens, so its weights cost ``capacity / group length`` of a
    dense layer's FLOPs, and its hidden activations are ``experts x capacity``
    slots per group instead of one per token. ``attention``: ``xla`` (the einsums), ``fused`` (a flash
    kernel) or ``auto`` (fused where the toolkit runs cuDNN: an NVIDIA GPU, a 16-bit compute dtype);
    ``frozen``: paths (without ``params/``) of params that do not train.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
        >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
        >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
        >>> w.layers, w.embed, w.mlp
        (4, 128, 512)
    """
    size = weight_counts(params)  # a quantized base (QLoRA) does the FLOPs of its float weights
    n = sum(size.values())
    lookup = sum(size[leaf.path] for leaf in params if leaf.names and tuple(leaf.names) == ("vocab", "embed"))
    # Matmul weights have two dimensions besides a scan's `layers` axis (norm scales have one).
    matmul = (
        sum(
            size[leaf.path]
            for leaf in params
            if len(leaf.shape) - (1 if leaf.names and "layers" in leaf.names else 0) >= 2
        )
        - lookup
    )
    dtype = (
        np.dtype(compute_dtype)
        if compute_dtype is not None
        else max((np.dtype(leaf.dtype) for leaf in params), key=lambda d: d.itemsize, default=np.dtype("float32"))
    )
    moe: dict[str, Any] = {}
    if expert_layer:
        group_len = batch_size * seq_len / max(1, int(expert_layer["groups"]))
        moe = {
            "experts": int(expert_layer["experts"]),
            "expert_fraction": min(1.0, int(expert_layer["capacity"]) / group_len),
            "expert_params": sum(
                leaf.size for leaf in params if leaf.names and "expert" in leaf.names and len(leaf.shape) >= 3
            ),
        }
    dims = (_layers(params), _dim(params, "embed"), _dim(params, "mlp"))
    ins = sum(
        leaf.size for leaf in params if leaf.names and [n for n in leaf.names if n != "layers"] == ["embed", "mlp"]
    )
    frozen_mm = sum(
        leaf.size
        for leaf in params
        if param_path(leaf.path) in frozen
        and len(leaf.shape) - (1 if leaf.names and "layers" in leaf.names else 0) >= 2
        and not (leaf.names and tuple(leaf.names) == ("vocab", "embed"))
    )
    return Workload(
        params=n,
        matmul_params=matmul,
        batch=int(batch_size),
        seq_len=int(seq_len),
        layers=_layers(params),
        embed=_dim(params, "embed"),
        mlp=_dim(params, "mlp"),
        heads=_dim(params, "heads"),
        kv_heads=_dim(params, "kv_heads") or _dim(params, "heads"),
        head_dim=_dim(params, "kv"),
        vocab=_dim(params, "vocab"),
        compute_bytes=dtype.itemsize,
        attention=attention,
        mlp_inputs=max(1, round(ins / math.prod(dims))) if ins and all(dims) else 2,
        frozen_params=frozen_mm,
        **moe,
    )


def local_elements(rules: Rules, mesh: Mapping[str, int], names: Sequence[Any], shape: Sequence[int]) -> float:
    """Elements per device of an activation with these logical names under ``rules`` on ``mesh``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IndivisibleWarning)
        spec = rules.resolve(tuple(names), tuple(shape), dict(mesh), on_indivisible="replicate")
    split = 1
    for entry in spec:
        for a in axes_tuple(entry):
            split *= mesh.get(a, 1)
    return math.prod(shape) / split


def context_split(rules: Rules, mesh: Mapping[str, int]) -> int:
    """``C``: the devices one sequence's ``length`` is split over under ``rules`` on ``mesh`` (1: not split)."""
    spec = rules.resolve(("batch", "length"))
    axes = axes_tuple(spec[1]) if spec is not None and len(spec) > 1 else ()
    return math.prod(mesh.get(a, 1) for a in axes)


def activation_shapes(w: Workload, micro_batch: int) -> dict[str, tuple[tuple[str | None, ...], tuple[int, ...]]]:
    """The activations of one block (names, global shape) that the estimate counts."""
    b, t = micro_batch, w.seq_len
    out: dict[str, tuple[tuple[str | None, ...], tuple[int, ...]]] = {
        "R": (("batch", "length", "embed"), (b, t, w.embed))
    }
    if w.mlp:
        out["M"] = (("batch", "length", "mlp"), (b, t, w.mlp))
    if w.heads and w.head_dim:
        out["Q"] = (("batch", "length", "heads", "kv"), (b, t, w.heads, w.head_dim))
        out["KV"] = (("batch", "length", "kv_heads", "kv"), (b, t, w.kv_heads, w.head_dim))
        out["S"] = (("batch", "heads", None, None), (b, w.heads, t, t))
    if w.vocab:
        out["V"] = (("batch", "length", "vocab"), (b, t, w.vocab))
    return out


def pipeline_share(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of the batch's per-layer work one device does pipelined: ``R M + S - 1`` iterations, each of
    ``L / (S R)`` layers on one of ``M`` micro-batches, over ``L`` layers on the whole batch."""
    s, m, r = int(stages), int(microbatches), int(repeats)
    return (r * m + s - 1) / (r * m * s)


def saved_bytes(none: float, R: float, Q: float, KV: float, M: float, S: float, s: int) -> dict[str, float]:
    """Per policy, the bytes one layer keeps on the device for the backward pass (see the module docstring);
    ``offload`` keeps ``dots_no_batch``'s on the host instead."""
    return {
        "none": none,
        "dots": s * (2 * R + 2 * Q + 2 * KV + 2 * M + S),
        "dots_no_batch": s * (2 * R + Q + 2 * KV + 2 * M),
        "offload": s * R,
        "full": s * R,
    }


def activation_bytes(
    w: Workload,
    rules: Rules,
    mesh: Mapping[str, int],
    *,
    remat: str,
    micro_batch: int,
    gathered_layer_bytes: float = 0.0,
    grad_bytes: float = 0.0,
    grad_accum: int = 1,
    stages: int = 1,
    microbatches: int = 1,
    repeats: int = 1,
    context: str | None = None,
    attention: str | None = None,
    gathered_grad_bytes: float | None = None,
) -> dict[str, float]:
    """Per-device activation memory of one step, by part (see the module docstring), and ``total``.

    ``attention``: ``xla`` or ``fused`` (default: the workload's; ``auto`` counts as ``xla`` here, the
    tuner resolves it per hardware). A fused kernel keeps a float32 log-sum-exp per query and head instead
    of the ``T x T`` scores. ``gathered_grad_bytes``: the gathered gradient held before its reduce-scatter
    (default ``gathered_layer_bytes``: the layer's weights in the params' own dtype; the tuner gives the
    largest single weight's, each gradient being reduced as the backward pass makes it).

    Pipelined (``stages`` S > 1, ``microbatches`` M, ``repeats`` R) a device keeps, for each of the
    ``R M + S - 1`` iterations of the schedule, the activations of one chunk of ``layers / (S R)``
    layers on one micro-batch.

    A ``length`` split over ``C`` devices (context parallelism) holds the scores of its own queries:
    with ``context="all_gather"`` a ``T/C x T`` block, kept for the backward pass like any other; with
    ``"ring"`` one ``T/C x T/C`` block at a time, never kept (the ring's backward pass recomputes it).
    """
    loc = {
        k: local_elements(rules, mesh, names, shape) for k, (names, shape) in activation_shapes(w, micro_batch).items()
    }
    R, M, Q, KV, S = (loc.get(k, 0.0) for k in ("R", "M", "Q", "KV", "S"))
    if w.experts:
        M *= w.experts * w.expert_fraction  # expert hidden activations: experts x capacity slots per group
    M *= w.mlp_inputs / 2  # the counts below are a gated MLP's (two input matrices)
    s = w.compute_bytes
    c = context_split(rules, mesh)
    S /= c  # a device's queries only
    block = S / c if context == "ring" and c > 1 else 0.0
    if block:
        S = 0.0  # the ring keeps inputs, output and log-sum-exp; its blocks live one at a time
    if (attention or w.attention) in ("fused", "cudnn", "flash") and w.seq_len:
        S, block = 4 * S / w.seq_len / s, 0.0  # the log-sum-exp, counted in the compute dtype's bytes
        none = s * (6 * R + 2 * Q + 2 * KV + 4 * M + S) + 8 * R
    else:
        none = s * (6 * R + 2 * Q + 2 * KV + 4 * M) + (8 + s) * S + 8 * R
    kept = saved_bytes(none, R, Q, KV, M, S, s)
    saved = kept.get(remat, none)
    share = 1 if stages <= 1 else pipeline_share(stages, microbatches, repeats)
    # Pipelined, one micro-batch at a time is recomputed, and its logits computed.
    one = 1 if stages <= 1 else 1 / max(1, microbatches)
    parts = {
        "layers": w.layers * saved * share,
        "recompute": none * one if remat != "none" else 0.0,
        "attention_block": (8 + s) * block,
        "logits": 3 * 4 * loc.get("V", 0.0) * one,
        "gathered_weights": 2 * gathered_layer_bytes
        + (gathered_layer_bytes if gathered_grad_bytes is None else gathered_grad_bytes),
        "grad_accumulator": grad_bytes if grad_accum > 1 else 0.0,
    }
    parts["total"] = sum(parts.values())
    if remat == "offload":  # in host memory: not part of the device total
        parts["host"] = w.layers * kept["dots_no_batch"] * share
    return parts


__all__ = [
    "Workload",
    "workload",
    "activation_bytes",
    "activation_shapes",
    "local_elements",
    "context_split",
    "pipeline_share",
    "REMATS",
    "param_path",
]
