"""Collectives in optimized HLO text: what a compiled step communicates.

Reads the text of ``compiled.as_text()`` (no XLA bindings, so it works on a
dump from any backend) and lists every all-gather, reduce-scatter,
all-reduce, all-to-all and collective-permute with its per-device bytes and
how many times one step executes it (instructions inside a ``while`` body
count once per iteration, from XLA's ``known_trip_count``).

``bytes`` is the per-device size of the collective's full buffer: the
gathered result of an all-gather, the input of a reduce-scatter, the reduced
buffer of an all-reduce, the exchanged buffer of an all-to-all or
collective-permute (for a permute in which only some devices send, the mean
over all devices: the buffer times the share of devices that are sources). Wire traffic of a ring algorithm is about
``(n-1)/n`` of that (twice for an all-reduce).

XLA's CPU backend never forms ``reduce-scatter``: it keeps the all-reduce and
slices each device's shard out of it. An all-reduce (or one element of a
combined tuple all-reduce) whose every use ends in a ``dynamic-slice`` of its
value is therefore reported as a reduce-scatter with
``hlo_op="all-reduce+dynamic-slice"`` — what GPU and TPU compilers turn it into.

Example::

    >>> from partitioning.plan.hlo import collectives, summarize
    >>> mesh = pt.make_mesh({"fsdp": -1})
    >>> w = jax.device_put(jnp.ones((512, 256)), jax.NamedSharding(mesh, jax.P("fsdp")))  # split over 8 devices
    >>> f = jax.jit(lambda w, x: x @ w, out_shardings=jax.NamedSharding(mesh, jax.P()))
    >>> text = f.lower(w, jnp.ones((4, 512))).compile().as_text()
    >>> summarize(collectives(text))
    {...}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections import defaultdict
from typing import Any

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    **dict.fromkeys(("pred", "s2", "u2", "s4", "u4", "s8", "u8"), 1),
    **dict.fromkeys(("s16", "u16", "f16", "bf16"), 2),
    **dict.fromkeys(("s32", "u32", "f32"), 4),
    **dict.fromkeys(("s64", "u64", "f64", "c64"), 8),
    "c128": 16,
    "token": 0,
}
_ARRAY = re.compile(r"\b(pred|token|bf16|[sufc]\d+|f8\w*|f4\w*)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<shape>.+?)\s(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_CALLEES = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'known_trip_count"?\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_PASS_THROUGH = {"bitcast", "copy", "reshape", "transpose", "convert", "get-tuple-element", "negate"}


@dataclasses.dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * _DTYPE_BYTES.get(self.dtype, 1)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass
class Instr:
    name: str
    op: str
    shape: list[Array]  # one entry per array (tuple shapes flattened)
    operands: list[str]
    attrs: str  # everything after the operand list
    args: str  # the raw operand text (a parameter's index)
    is_tuple: bool
    root: bool = False

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.shape)


@dataclasses.dataclass
class Module:
    computations: dict[str, dict[str, Instr]]
    entry: str | None
    num_partitions: int | None

    def users(self, comp: str) -> dict[str, list[Instr]]:
        out: dict[str, list[Instr]] = defaultdict(list)
        for ins in self.computations[comp].values():
            for o in ins.operands:
                out[o].append(ins)
        return out


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled step."""

    kind: str  # one of KINDS
    hlo_op: str  # the HLO opcode it came from
    name: str  # instruction name in the HLO
    computation: str
    shapes: tuple[str, ...]
    bytes: int  # per device, per execution (see module docstring)
    group_size: int | None  # devices taking part in each group
    executions: int  # per step (loop trip counts multiplied in)
    source: str  # jax op_name from the metadata, if any
    # The replica_groups / source_target_pairs text: which devices talk (plan.axes maps it to mesh axes).
    groups: str = dataclasses.field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "groups"} | {"shapes": list(self.shapes)}


def _operand_text(rest: str) -> tuple[str, str]:
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth == 0:
                return rest[:i], rest[i + 1 :]
    return rest, ""


def parse(text: str) -> Module:
    """Computations and instructions of an HLO module's text."""
    comps: dict[str, dict[str, Instr]] = {}
    entry = None
    current: dict[str, Instr] | None = None
    m = re.search(r"num_partitions=(\d+)", text.split("\n", 1)[0])  # the HloModule line
    num_partitions = int(m.group(1)) if m else None
    for line in text.splitlines():
        if current is None:
            cm = _COMP.match(line)
            if cm:
                current = comps.setdefault(cm.group("name"), {})
                if line.startswith("ENTRY"):
                    entry = cm.group("name")
            continue
        if line.startswith("}"):
            current = None
            continue
        im = _INSTR.match(line)
        if not im:
            continue
        shape_s = im.group("shape")
        operands_s, attrs = _operand_text(im.group("rest"))
        current[im.group("name")] = Instr(
            name=im.group("name"),
            op=im.group("op"),
            shape=[Array(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(shape_s)],
            operands=re.findall(r"%([\w.\-]+)", operands_s),
            attrs=attrs,
            args=operands_s.strip(),
            is_tuple=shape_s.lstrip().startswith("("),
            root=line.lstrip().startswith("ROOT"),
        )
    return Module(comps, entry, num_partitions)


def _callees(ins: Instr) -> list[str]:
    out = [c for _, c in _CALLEES.findall(ins.attrs)]
    for group in _BRANCHES.findall(ins.attrs):
        out += re.findall(r"%?([\w.\-]+)", group)
    return out


def executions(module: Module, loops: bool = True) -> dict[str, int]:
    """How many times one run of the entry computation runs each computation.

    With ``loops=False`` every loop body and condition counts once (how XLA's
    cost analysis walks a module).
    """
    edges: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for cname, instrs in module.computations.items():
        for ins in instrs.values():
            trip = None
            if ins.op == "while":
                m = _TRIP.search(ins.attrs)
                trip = int(m.group(1)) if m else 1
            for callee in _callees(ins):
                if not loops:
                    mult = 1
                elif ins.op == "while" and f"body=%{callee}" not in ins.attrs and f"body={callee}" not in ins.attrs:
                    mult = (trip or 1) + 1  # the condition runs once more than the body
                else:
                    mult = trip or 1
                edges[cname].append((callee, mult))
    counts: dict[str, int] = defaultdict(int)
    if module.entry is None:
        return {c: 1 for c in module.computations}

    def visit(comp: str, mult: int, depth: int) -> None:
        counts[comp] += mult
        if depth > 64:
            return
        for callee, m in edges.get(comp, ()):
            if callee in module.computations:
                visit(callee, mult * m, depth + 1)

    visit(module.entry, 1, 0)
    return dict(counts)


def _group_size(attrs: str, num_partitions: int | None) -> int | None:
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
        names = re.findall(r"'([^']+)'", m.group(2))
        if names and all(n in sizes for n in names):
            return math.prod(sizes[n] for n in names)
        return None
    m = re.search(r"replica_groups=\{\{([^}]*)\}", attrs)
    if m:
        return len([x for x in m.group(1).split(",") if x.strip()])
    if re.search(r"replica_groups=\{\}", attrs):
        return num_partitions
    return None


def _ends_in_slice(
    module: Module, comp: str, value: str, users_of, depth: int = 0, via_fusion_users: list | None = None
) -> bool:
    """True when every use of ``value`` (through layout/convert ops and fusion
    boundaries) ends in a dynamic-slice that takes ``value`` as its operand 0."""
    if depth > 12:
        return False
    users = users_of(comp).get(value, [])
    if not users:
        # the fusion's ROOT: continue with the fusion instruction's own users
        if not via_fusion_users:
            return False
        return all(_ends_in_slice(module, c, v, users_of, depth + 1) for c, v in via_fusion_users)
    for u in users:
        if u.op == "dynamic-slice" and u.operands and u.operands[0] == value:
            continue
        if u.op in _PASS_THROUGH:
            if not _ends_in_slice(module, comp, u.name, users_of, depth + 1, via_fusion_users):
                return False
            continue
        if u.op == "fusion":
            callee = next((c for c in _callees(u) if c in module.computations), None)
            if callee is None:
                return False
            params = [i for i in module.computations[callee].values() if i.op == "parameter"]
            ok = True
            for pos, o in enumerate(u.operands):
                if o != value:
                    continue
                p = next((i for i in params if i.args == str(pos)), None)
                if p is None or not _ends_in_slice(module, callee, p.name, users_of, depth + 1, [(comp, u.name)]):
                    ok = False
                    break
            if not ok:
                return False
            continue
        return False
    return True


_GROUPS = re.compile(
    r"(?:replica_groups|source_target_pairs)=(\{\{[\d,{} ]*\}\}|\{\}|\[[\d,]+\]<=\[[\d,]+\]"
    r"(?:T\([\d,]+\))?|mesh\[[^\]]*\](?:,\s*device_ids=\(\[[\d,]+\](?:T\([\d,]+\))?\))?"
    r"\s*\{[^}]*\})"
)


def _groups_text(attrs: str) -> str:
    m = _GROUPS.search(attrs)
    return m.group(1) if m else ""


_Collective = Collective


def collectives(text: str) -> list[Collective]:
    """Every collective of an optimized HLO module, with bytes and executions per step."""
    module = parse(text)
    runs = executions(module)
    cache: dict[str, dict[str, list[Instr]]] = {}

    def users_of(comp: str) -> dict[str, list[Instr]]:
        if comp not in cache:
            cache[comp] = module.users(comp)
        return cache[comp]

    out: list[Collective] = []
    for cname, instrs in module.computations.items():
        n_exec = runs.get(cname, 0)
        if n_exec == 0:
            continue
        for ins in instrs.values():
            op = ins.op
            if op.endswith("-done"):
                continue
            base = op[: -len("-start")] if op.endswith("-start") else op
            if base not in KINDS:
                continue
            group = _group_size(ins.attrs, module.num_partitions)
            src = re.search(r'op_name="([^"]*)"', ins.attrs)
            source = src.group(1) if src else ""
            groups = _groups_text(ins.attrs)
            Collective = functools.partial(_Collective, groups=groups)
            if base == "collective-permute" and not op.endswith("-start"):
                # Only the devices that are sources send: the mean per device over the step.
                pairs = groups.count("},{") + 1 if groups.startswith("{{") else None
                share = pairs / module.num_partitions if pairs and module.num_partitions else 1.0
                out.append(
                    Collective(
                        base,
                        op,
                        ins.name,
                        cname,
                        tuple(map(str, ins.shape)),
                        round(ins.nbytes * min(share, 1.0)),
                        group,
                        n_exec,
                        source,
                    )
                )
                continue
            if op.endswith("-start"):
                # async pairs: the start's tuple holds (operands, results, scratch)
                nbytes = max((a.nbytes for a in ins.shape), default=0)
                out.append(
                    Collective(base, op, ins.name, cname, tuple(map(str, ins.shape)), nbytes, group, n_exec, source)
                )
                continue
            if base == "reduce-scatter":
                nbytes = ins.nbytes * (group or 1)
                out.append(
                    Collective(base, op, ins.name, cname, tuple(map(str, ins.shape)), nbytes, group, n_exec, source)
                )
                continue
            if base != "all-reduce":
                out.append(
                    Collective(base, op, ins.name, cname, tuple(map(str, ins.shape)), ins.nbytes, group, n_exec, source)
                )
                continue
            # all-reduce: split a combined (tuple) all-reduce into scattered / kept elements
            if ins.is_tuple:
                gtes: dict[int, list[str]] = {}
                for u in users_of(cname).get(ins.name, []):
                    m = re.search(r"index=(\d+)", u.attrs)
                    if u.op == "get-tuple-element" and m:
                        gtes.setdefault(int(m.group(1)), []).append(u.name)
                elems = [(a, gtes.get(i, [])) for i, a in enumerate(ins.shape)]
                scattered = [
                    bool(names) and all(_ends_in_slice(module, cname, g, users_of) for g in names) for _, names in elems
                ]
            else:
                elems = [(ins.shape[0], [ins.name])] if ins.shape else []
                scattered = [_ends_in_slice(module, cname, ins.name, users_of)] if ins.shape else []
            for flag, hlo_op, kind in ((True, "all-reduce+dynamic-slice", "reduce-scatter"), (False, op, "all-reduce")):
                part = [a for (a, _), s in zip(elems, scattered, strict=True) if s == flag]
                if part:
                    out.append(
                        Collective(
                            kind,
                            hlo_op,
                            ins.name,
                            cname,
                            tuple(map(str, part)),
                            sum(a.nbytes for a in part),
                            group,
                            n_exec,
                            source,
                        )
                    )
    return out


def summarize(colls: list[Collective]) -> dict[str, dict[str, int]]:
    """Per kind: executions per step (``count``) and bytes per step (``bytes``)."""
    out = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for c in colls:
        out[c.kind]["count"] += c.executions
        out[c.kind]["bytes"] += c.executions * c.bytes
    return out


__all__ = ["KINDS", "Collective", "collectives", "summarize", "parse", "executions"]
