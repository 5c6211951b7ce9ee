"""FLOPs of a compiled step, the 6·N·tokens estimate, device peaks and MFU.

``compiled.cost_analysis()["flops"]`` is XLA's count for one device's program,
but it counts a ``while`` body once, however many times the loop runs: a
GPT whose layers are scanned (``nn.scan``) or a step with gradient
accumulation would show a fraction of its work. :func:`step_flops` adds the
matrix multiplications (``dot`` and ``convolution``, 2 FLOPs per
multiply-add) of loop bodies once per extra iteration, with the trip counts
read from the optimized HLO (:mod:`partitioning.plan.hlo`).

For a transformer the usual estimate is ``6 · N · tokens`` per step (2 FLOPs
per parameter per token forward, 4 backward); the compiled count differs by
the attention scores (``12 · layers · seq_len · embed`` per token), the
embedding gather (no FLOPs) and a rematerialized forward pass, if any.

Peak dense bf16 TFLOP/s per device come from the vendors' data sheets
(:data:`PEAK_TFLOPS`); MFU is TFLOP/s achieved / peak. There is no peak for
CPUs: pass one (``--peak-tflops``) to get an MFU there.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> from partitioning.plan.flops import mfu
    >>> flops = pt.plan.step_flops(trainer.lower_train_step().compile())   # per device, per step
    >>> flops > 0, pt.plan.peak_tflops(jax.devices()[0])                 # no peak for a CPU
    (True, None)
    >>> round(mfu(1.23e12, step_time_s=0.01, peak=197.0), 2)          # a TPU v5e's 197 TFLOP/s
    0.62
"""

from __future__ import annotations

import math
import re
from typing import Any

from partitioning.plan.hlo import Instr, executions, parse

# Dense (no sparsity) bf16 peak per device, TFLOP/s, matched as a lower-case
# substring of jax's ``device.device_kind``; the first match wins, so longer
# names come first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    # NVIDIA data sheets give bf16 "with sparsity"; dense is half of it.
    # B200: HGX B200 data sheet, 36 PFLOPS bf16 sparse for 8 GPUs (https://www.nvidia.com/en-us/data-center/hgx/)
    ("b200", 2250.0),
    # H200 SXM: 1,979 TFLOPS sparse (https://www.nvidia.com/en-us/data-center/h200/)
    ("h200", 989.0),
    # H100 PCIe 1,513 / NVL 1,671 / SXM 1,979 TFLOPS sparse (https://www.nvidia.com/en-us/data-center/h100/)
    ("h100 pcie", 756.0),
    ("h100 nvl", 835.0),
    ("h100", 989.0),
    # A100 (SXM and PCIe): 312 TFLOPS dense bf16 (https://www.nvidia.com/en-us/data-center/a100/)
    ("a100", 312.0),
    # L40S: 733 TFLOPS sparse (https://www.nvidia.com/en-us/data-center/l40s/)
    ("l40s", 362.0),
    # L4: 242 TFLOPS sparse (https://www.nvidia.com/en-us/data-center/l4/)
    ("l4", 121.0),
    # Cloud TPU docs, "peak compute per chip (bf16)":
    # v6e 918 (https://cloud.google.com/tpu/docs/v6e), v5p 459 (https://cloud.google.com/tpu/docs/v5p),
    # v5e 197 (https://cloud.google.com/tpu/docs/v5e), v4 275 (https://cloud.google.com/tpu/docs/v4).
    ("tpu v6 lite", 918.0),
    ("tpu v6e", 918.0),
    ("tpu v5 lite", 197.0),
    ("tpu v5e", 197.0),
    ("tpu v5p", 459.0),
    ("tpu v5", 459.0),
    ("tpu v4", 275.0),
)

_DIMS = re.compile(r"\b(lhs|rhs)_contracting_dims=\{([\d,]*)\}")
_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")


def peak_tflops(device: Any) -> float | None:
    """The device's dense bf16 peak TFLOP/s from :data:`PEAK_TFLOPS`, or None (CPUs, unknown devices).

    Example::

        >>> pt.plan.peak_tflops(jax.devices()[0]) is None    # a CPU; 'TPU v5 lite' -> 197.0
        True
    """
    if getattr(device, "platform", "") == "cpu":
        return None
    kind = str(getattr(device, "device_kind", "")).lower()
    return next((peak for name, peak in PEAK_TFLOPS if name in kind), None)


def _dims(comp: dict[str, Instr], name: str) -> tuple[int, ...] | None:
    ins = comp.get(name)
    return ins.shape[0].dims if ins is not None and ins.shape else None


def matmul_flops(ins: Instr, comp: dict[str, Instr]) -> int:
    """2 x multiply-adds of one ``dot`` or ``convolution`` in computation ``comp`` (0 for any other op)."""
    if not ins.shape or ins.is_tuple:
        return 0
    out = math.prod(ins.shape[0].dims)
    if ins.op == "dot" and ins.operands:
        lhs = _dims(comp, ins.operands[0])
        dims = dict(_DIMS.findall(ins.attrs)).get("lhs", "")
        if lhs is None:
            return 0
        return 2 * out * math.prod(lhs[int(d)] for d in dims.split(",") if d)
    if ins.op == "convolution" and len(ins.operands) > 1:
        kernel = _dims(comp, ins.operands[1])
        m = _LABELS.search(ins.attrs)
        if kernel is None or not m or "o" not in m.group(1):
            return 0
        # Each output element sums over the kernel's window and input features (of its group).
        # (The kernel's input-feature dimension is already per feature group.)
        return 2 * out * (math.prod(kernel) // max(kernel[m.group(1).index("o")], 1))
    return 0


def loop_flops(text: str) -> tuple[int, int]:
    """(matmul FLOPs of one step with loop trips counted, the same with every loop run once), per device.

    The difference is what ``cost_analysis()`` misses.
    """
    module = parse(text)
    real = executions(module)
    once = executions(module, loops=False)  # what cost analysis counts
    total = once_total = 0
    for comp, instrs in module.computations.items():
        for ins in instrs.values():
            if ins.op in ("dot", "convolution"):
                f = matmul_flops(ins, module.computations[comp])
                total += f * real.get(comp, 0)
                once_total += f * once.get(comp, 0)
    return total, once_total


def step_flops(compiled: Any) -> float | None:
    """FLOPs one device does in one run of ``compiled``: ``cost_analysis()`` plus the loop iterations it skips.

    None when the backend has no cost analysis.

    Example::

        >>> compiled = jax.jit(lambda a, b: a @ b).lower(jnp.ones((64, 128)), jnp.ones((128, 32))).compile()
        >>> pt.plan.step_flops(compiled)    # 2 * 64 * 128 * 32
        524288.0
    """
    try:
        ca = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        return None
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else None
    if not ca or "flops" not in ca:
        return None
    base = float(ca["flops"])
    try:
        text = compiled.as_text() or ""
    except Exception:
        return base
    total, once = loop_flops(text)
    return base + max(total - once, 0)


def transformer_flops(num_params: int, tokens: int) -> float:
    """``6 · N · tokens``: training FLOPs of one step of a transformer (all devices together).

    Example::

        >>> round(pt.plan.transformer_flops(124_000_000, 32 * 1024) / 1e12, 1)    # TFLOPs per step
        24.4
    """
    return 6.0 * num_params * tokens


def mfu(flops_per_device: float, step_time_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved TFLOP/s per device over the peak (None without a peak).

    Example::

        >>> from partitioning.plan.flops import mfu
        >>> round(mfu(1e12, 0.01, 197.0), 4)       # 100 TFLOP/s on a 197 TFLOP/s chip
        0.5076
    """
    if not peak or step_time_s <= 0:
        return None
    return flops_per_device / step_time_s / 1e12 / peak


__all__ = ["PEAK_TFLOPS", "peak_tflops", "step_flops", "loop_flops", "matmul_flops", "transformer_flops", "mfu"]
