"""FLOPs and memory traffic of every op of a compiled step, read from optimized HLO text.

XLA's ``compiled.cost_analysis()`` counts the body of a ``while`` loop once,
whatever its trip count: a step that scans 80 layers, or accumulates
gradients over 4 micro-batches, is under-counted 80 or 4 times. Here every
top-level op (a fusion, a dot, a copy, ...) of every computation that runs is
priced and multiplied by how many times one step runs it
(:func:`partitioning.plan.hlo.executions`, from XLA's ``known_trip_count``):

- FLOPs: a dot or convolution ``2 x output elements x contracted size``; any
  other op one per output element (inside fusions too);
- bytes: what the op reads and writes in memory (its operands and its
  output), except that an in-place ``dynamic-update-slice`` (a scan stacking
  its per-layer outputs) moves only the update and a ``dynamic-slice`` reads
  only its slice;
- phase: ``fwd``, ``bwd`` (JAX's ``transpose(...)`` in the op's name) or
  ``update`` (the optimizer), from the op's metadata.

Collectives are left to :mod:`partitioning.plan.hlo`. The op list is the
input of a roofline: ``sum(max(flops / peak, bytes / bandwidth))``.

Example::

    >>> from partitioning.plan.hlo_cost import op_costs, summarize_ops
    >>> loss = lambda w, x: jnp.sum(jnp.tanh(x @ w))
    >>> compiled = jax.jit(jax.grad(loss)).lower(jnp.ones((128, 64)), jnp.ones((32, 128))).compile()
    >>> ops = op_costs(compiled.as_text())
    >>> sum(o.flops for o in ops) >= 2 * 32 * 128 * 64, sorted(summarize_ops(ops))
    (True, [...])
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from partitioning.plan.flops import matmul_flops
from partitioning.plan.hlo import KINDS, Instr, Module, _callees, executions, parse

_FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "while",
    "call",
    "conditional",
    "after-all",
    "partition-id",
    "replica-id",
    "iota",
    "copy-start",
    "copy-done",
    "send",
    "recv",
    "send-done",
    "recv-done",
    "opt-barrier",
    "custom-call",
}
_NESTED = (
    "fusion",
    "reduce",
    "map",
    "sort",
    "scatter",
    "reduce-window",
    "select-and-scatter",
    "all-reduce",
    "reduce-scatter",
    "all-reduce-start",
)
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class OpCost:
    """One op's cost per step (executions multiplied in)."""

    name: str
    op: str
    phase: str  # fwd | bwd | update
    flops: float
    bytes: float
    executions: int

    def to_json(self) -> list[Any]:
        return [self.name, self.op, self.phase, self.flops, self.bytes, self.executions]


def phase_of(op_name: str) -> str:
    """``bwd`` for JAX's transposed (backward) ops, ``fwd`` for the forward pass, ``update`` otherwise."""
    if "transpose(" in op_name:
        return "bwd"
    if "jvp(" in op_name or "checkpoint" in op_name or "remat" in op_name:
        return "fwd"
    return "update"


def _elements(ins: Instr) -> float:
    return float(sum(math.prod(a.dims) for a in ins.shape))


def _comp_flops(module: Module, name: str, memo: dict[str, float]) -> float:
    if name not in memo:
        memo[name] = 0.0
        comp = module.computations[name]
        total = 0.0
        for ins in comp.values():
            if ins.op in ("dot", "convolution"):
                total += matmul_flops(ins, comp)
            elif ins.op == "fusion":
                total += sum(_comp_flops(module, c, memo) for c in _callees(ins) if c in module.computations)
            elif ins.op not in _FREE:
                total += _elements(ins)
        memo[name] = total
    return memo[name]


def _param_uses(comp: dict[str, Instr]) -> dict[int, list[tuple[int, Instr]]]:
    """Fusion parameter index -> the instructions using it (through bitcasts)."""
    index = {i.name: int(i.args) for i in comp.values() if i.op == "parameter" and i.args.isdigit()}
    alias = dict(index)
    for ins in comp.values():
        if ins.op == "bitcast" and ins.operands and ins.operands[0] in alias:
            alias[ins.name] = alias[ins.operands[0]]
    uses: dict[int, list[tuple[int, Instr]]] = {}
    for ins in comp.values():
        if ins.op == "bitcast":
            continue
        for pos, o in enumerate(ins.operands):
            if o in alias:
                uses.setdefault(alias[o], []).append((pos, ins))
    return uses


def _fusion_bytes(module: Module, ins: Instr, comp: dict[str, Instr]) -> float:
    """Operands read plus output written, with in-place slices counted at their size."""
    callee = next((c for c in _callees(ins) if c in module.computations), None)
    body = module.computations.get(callee, {}) if callee else {}
    uses = _param_uses(body) if body else {}
    root = next((i for i in body.values() if i.root), None)
    while root is not None and root.op == "bitcast" and root.operands:
        root = body.get(root.operands[0])
    total = 0.0
    in_place = False
    for pos, o in enumerate(ins.operands):
        nbytes = comp[o].nbytes if o in comp else 0
        u = uses.get(pos, [])
        if u and all(op.op == "dynamic-slice" and p == 0 for p, op in u):
            nbytes = min(nbytes, sum(op.nbytes for _, op in u))
        elif u and all(op.op == "dynamic-update-slice" and p == 0 for p, op in u):
            in_place = True
            nbytes = 0
        total += nbytes
    if in_place and root is not None and root.op == "dynamic-update-slice" and len(root.operands) > 1:
        update = body.get(root.operands[1])
        return total + (update.nbytes if update is not None else 0)
    return total + ins.nbytes


def _op_name(module: Module, ins: Instr) -> str:
    """The JAX op name of an instruction, or of its fused computation's ops when the fusion has none."""
    m = _OP_NAME.search(ins.attrs)
    if m:
        return m.group(1)
    for c in _callees(ins):
        for inner in module.computations.get(c, {}).values():
            m = _OP_NAME.search(inner.attrs)
            if m:
                return m.group(1)
    return ""


def _enclosing_op_names(module: Module) -> dict[str, str]:
    """Per computation, the JAX op name of the nearest instruction up its call chain that has one.

    XLA drops ``op_name`` from some instructions it rewrites inside loop bodies
    (a pipeline's vmapped stage loop on the CPU keeps only a stack frame id):
    the loop that runs them still says which pass they belong to.
    """
    callers: dict[str, tuple[str, Instr]] = {}
    for cname, comp in module.computations.items():
        for ins in comp.values():
            for c in _callees(ins):
                callers.setdefault(c, (cname, ins))
    memo: dict[str, str] = {}

    def name(c: str) -> str:
        if c not in memo:
            memo[c] = ""  # a cycle (none in valid HLO) ends here
            if c in callers:
                parent, ins = callers[c]
                m = _OP_NAME.search(ins.attrs)
                memo[c] = m.group(1) if m else name(parent)
        return memo[c]

    return {c: name(c) for c in module.computations}


def op_costs(text: str) -> list[OpCost]:
    """Every priced op of a compiled step (see the module docstring)."""
    module = parse(text)
    runs = executions(module)
    enclosing = _enclosing_op_names(module)
    nested = {
        c
        for comp in module.computations.values()
        for i in comp.values()
        if i.op in _NESTED or i.op.endswith("-start")
        for c in _callees(i)
    }
    memo: dict[str, float] = {}
    out = []
    for cname, comp in module.computations.items():
        n = runs.get(cname, 0)
        if cname in nested or not n:
            continue
        for ins in comp.values():
            base = ins.op[: -len("-start")] if ins.op.endswith("-start") else ins.op
            if ins.op in _FREE or ins.op.endswith("-done") or base in KINDS:
                continue
            if ins.op == "fusion":
                flops = sum(_comp_flops(module, c, memo) for c in _callees(ins) if c in module.computations)
                nbytes = _fusion_bytes(module, ins, comp)
            else:
                flops = matmul_flops(ins, comp) if ins.op in ("dot", "convolution") else _elements(ins)
                nbytes = ins.nbytes + sum(comp[o].nbytes for o in ins.operands if o in comp)
                if ins.op == "dynamic-update-slice" and len(ins.operands) > 1 and ins.operands[1] in comp:
                    nbytes = 2 * comp[ins.operands[1]].nbytes
                elif ins.op == "dynamic-slice":
                    nbytes = 2 * ins.nbytes
            phase = phase_of(_op_name(module, ins) or enclosing.get(cname, ""))
            out.append(OpCost(ins.name, ins.op, phase, flops * n, nbytes * n, n))
    return out


def summarize_ops(ops: list[OpCost]) -> dict[str, dict[str, float]]:
    """Per phase (and ``total``): FLOPs and bytes per step."""
    out = {p: {"flops": 0.0, "bytes": 0.0} for p in ("fwd", "bwd", "update", "total")}
    for o in ops:
        for p in (o.phase, "total"):
            out[p]["flops"] += o.flops
            out[p]["bytes"] += o.bytes
    return out


__all__ = ["OpCost", "op_costs", "summarize_ops", "phase_of"]
