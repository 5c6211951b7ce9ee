"""The compiled view: what XLA made of a step for a mesh.

:func:`compiled_view` lowers and compiles a function (given as ``lower_fn``
returning a ``jax.stages.Lowered``, e.g. ``trainer.lower_train_step``) and
reports XLA's per-device memory analysis, the collectives of the optimized HLO
(:mod:`partitioning.plan.hlo`) and a self-check: the compiled step's input and
output shardings read back as ``PartitionSpec`` s and compared, by path, with
the specs the rules asked for.

:func:`compile_in_child` runs the same in a child process on ``N`` simulated
CPU devices, for meshes larger than the devices this process has. The child
writes its result as JSON and leaves with ``os._exit(0)``: JAX's orderly
teardown of thousands of devices can take minutes.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> expected = {leaf.path: leaf.spec for leaf in trainer.state_layouts()}   # what the rules asked for
    >>> view = pt.plan.compiled_view(trainer.lower_train_step, expected=expected,
    ...                         input_names=("", "batch"), output_names=("", "metrics"))
    >>> view["status"], view["collectives"]["all-gather"]["count"] > 0, view["memory"]["temp"] > 0
    ('ok', True, True)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.fmt import fmt_spec
from partitioning.layout import path_str
from partitioning.mesh import mesh_node_ids, node_ids
from partitioning.plan.axes import collectives_by_axis, group_axes, group_nodes, nodes_by_axis
from partitioning.plan.flops import step_flops
from partitioning.plan.hlo import KINDS, collectives, summarize
from partitioning.plan.hlo_cost import op_costs, summarize_ops
from partitioning.plan.memory_kinds import split_compiled
from partitioning.resolve import axes_tuple

# XLA's CPU backend refuses programs for more devices than this ("Multiprocess
# computations aren't implemented on the CPU backend").
CPU_MAX_DEVICES = 2048
CPU_LIMIT_REASON = (
    f"XLA's CPU backend compiles for at most {CPU_MAX_DEVICES} devices (beyond that it fails with "
    f'"Multiprocess computations aren\'t implemented on the CPU backend"), so the compiled view is '
    f"not available for {{n}} simulated devices; the table above is exact. For the compiled view, "
    f"plan a {CPU_MAX_DEVICES}-device slice (--devices {CPU_MAX_DEVICES}) with the same per-device layout"
)


def normalize_spec(spec: Any, sizes: Mapping[str, int]) -> tuple:
    """A spec with size-1 mesh axes and trailing unsharded dims dropped (equivalent layouts compare equal)."""
    if spec is None:
        return ()
    out: list[Any] = []
    for entry in tuple(spec):
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            out.append(None)
            continue
        axes = tuple(a for a in axes_tuple(entry) if sizes.get(a, 1) > 1)
        out.append(axes or None)
    while out and out[-1] is None:
        out.pop()
    return tuple(out)


def _named_leaves(tree: Any, names: Sequence[str] | None) -> dict[str, Any]:
    """``{path: sharding}`` for a tuple of per-argument pytrees of shardings."""
    out = {}

    def is_leaf(x: Any) -> bool:
        return x is None or isinstance(x, jax.sharding.Sharding)

    for i, arg in enumerate(tree):
        prefix = names[i] if names and i < len(names) else str(i)
        for kp, leaf in jax.tree_util.tree_flatten_with_path(arg, is_leaf=is_leaf)[0]:
            p = path_str(kp)
            out["/".join(x for x in (prefix, p) if x)] = leaf
    return out


def sharding_check(
    compiled: Any,
    expected: Mapping[str, PartitionSpec],
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Compiled input / output shardings vs ``expected`` specs, by path.

    Only paths in ``expected`` are checked. Returns ``{"checked": n,
    "mismatches": [{"path", "side", "expected", "compiled"}], "unused_inputs": [...],
    "missing": [...]}`` (``unused_inputs``: inputs jit pruned because the step
    never reads them; ``missing``: expected paths the step does not have).
    """
    mesh_sizes: dict[str, int] = {}
    sides = {
        "input": _named_leaves(compiled.input_shardings[0], input_names),
        "output": _named_leaves(
            compiled.output_shardings if isinstance(compiled.output_shardings, tuple) else (compiled.output_shardings,),
            output_names,
        ),
    }
    for leaves in sides.values():
        for s in leaves.values():
            if isinstance(s, NamedSharding):
                mesh_sizes = {str(k): int(v) for k, v in s.mesh.shape.items()}
                break
    checked, mismatches, pruned = 0, [], []
    seen: set[str] = set()
    for side, leaves in sides.items():
        for path, s in leaves.items():
            if path not in expected:
                continue
            seen.add(path)
            if s is None:
                # jit prunes inputs the step never reads (e.g. an injected
                # learning rate that is recomputed): nothing to lay out.
                pruned.append(f"{side} {path}")
                continue
            checked += 1
            want = normalize_spec(expected[path], mesh_sizes)
            if isinstance(s, NamedSharding):
                got_spec, got = fmt_spec(s.spec), normalize_spec(s.spec, mesh_sizes)
            else:
                got_spec = str(s)
                got = () if getattr(s, "is_fully_replicated", False) else ("?",)
            if got != want:
                mismatches.append(
                    {"path": path, "side": side, "expected": fmt_spec(expected[path]), "compiled": got_spec}
                )
    missing = sorted(set(expected) - seen)
    return {"checked": checked, "mismatches": mismatches, "unused_inputs": pruned, "missing": missing}


def memory_stats(compiled: Any) -> dict[str, int] | None:
    """XLA's per-device memory analysis (bytes) of device memory, with ``peak_estimate`` = args + outputs -
    aliased + temp; host memory apart (``host_argument``, ``host_output``, ``host_alias``, ``host_temp`` and their
    ``host`` peak): offloaded state (:mod:`partitioning.plan.memory_kinds`)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if m is None:
        return None
    xla = {
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "alias": int(m.alias_size_in_bytes),
        "temp": int(m.temp_size_in_bytes),
    }
    reported = {
        k: int(getattr(m, f"{k}_size_in_bytes", 0) or 0)
        for k in ("host_argument", "host_output", "host_alias", "host_temp")
    }
    try:
        text = compiled.as_text() or ""
    except Exception:  # an executable without HLO text: no host buffers read off it
        text = ""
    out = split_compiled(xla, text, reported)
    out["generated_code"] = int(m.generated_code_size_in_bytes)
    out["peak_estimate"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def compiled_view(
    lower_fn: Callable[[], Any],
    *,
    expected: Mapping[str, PartitionSpec] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    nodes: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Lowers (``lower_fn()``), compiles, and reports memory, FLOPs, collectives and the sharding self-check.

    Which collectives cross nodes comes from ``nodes`` (``{axis: nodes}``, the
    mesh's ``nodes`` as on the cluster) or, without it, from the processes
    the compiled mesh's devices belong to (:func:`across_nodes`).

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> view = pt.plan.compiled_view(trainer.lower_train_step)
        >>> sorted(view["collectives"]["all-gather"])
        ['bytes', 'count']
    """
    t0 = time.perf_counter()
    lowered = lower_fn()
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    text = compiled.as_text() or ""
    ops = collectives(text)
    per_device = step_flops(compiled)
    devices = _num_devices(compiled)
    view: dict[str, Any] = {
        "status": "ok",
        "backend": jax.default_backend(),
        "devices": devices,
        "lower_s": round(t1 - t0, 3),
        "compile_s": round(t2 - t1, 3),
        "memory": memory_stats(compiled),
        # One device's FLOPs per step (cost analysis, loop trips counted) and all devices' together.
        "flops": None if per_device is None else {"per_device": per_device, "total": per_device * (devices or 1)},
        "collectives": summarize(ops),
        "collective_ops": [c.to_json() for c in ops],
    }
    mesh = _mesh_shape(compiled)
    if mesh:
        view["collectives_by_axis"] = collectives_by_axis(ops, mesh)
        ids = node_ids(mesh, nodes) if nodes else _built_nodes(compiled)
        if ids is not None:
            view.update(across_nodes(ops, view["collective_ops"], ids, list(mesh)))
    costs = op_costs(text)
    view["cost"] = summarize_ops(costs)  # FLOPs and bytes per phase, loops counted
    view["cost_ops"] = [c.to_json() for c in costs]
    if expected is not None:
        view["sharding_check"] = sharding_check(compiled, expected, input_names=input_names, output_names=output_names)
    return view


def across_nodes(ops: Sequence[Any], records: list[dict[str, Any]], ids: Any, names: Sequence[str]) -> dict[str, Any]:
    """What crosses nodes: each collective's record gets ``nodes`` (how many its widest group spans) and
    ``across_bytes`` (per device and execution, the share that crosses) and ``axes`` (the mesh axes it runs
    over); ``nodes`` says per mesh axis
    how many nodes its groups span, ``across_nodes`` sums the crossing collectives per kind.

    Example::

        >>> from partitioning.mesh import node_ids
        >>> from partitioning.plan.compiled import across_nodes
        >>> from partitioning.plan.hlo import Collective
        >>> op = Collective("all-gather", "all-gather", "ag", "main", ("f32[8]",), 32, 2, 1, "", groups="[4,2]<=[8]")
        >>> out = across_nodes([op], [op.to_json()], node_ids({"data": 2, "fsdp": 4}, {"data": 2}), ["data", "fsdp"])
        >>> out["nodes"], out["across_nodes"]["all-gather"]
        ({'count': 2, 'axes': {'data': 2, 'fsdp': 1}}, {'count': 0, 'bytes': 0})
    """
    flat, sizes = ids.reshape(-1), dict(zip(names, ids.shape, strict=True))
    totals = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for op, rec in zip(ops, records, strict=True):
        permute = op.kind == "collective-permute"
        spans, share = group_nodes(op.groups, flat, permute=permute)
        rec["nodes"], rec["across_bytes"] = spans, round(op.bytes * share)
        rec["axes"] = "+".join(group_axes(op.groups, sizes, permute=permute)) or "?"
        if spans > 1:
            totals[op.kind]["count"] += op.executions
            totals[op.kind]["bytes"] += op.executions * rec["across_bytes"]
    count = len(set(flat.tolist()))
    return {"nodes": {"count": count, "axes": nodes_by_axis(ids, names)}, "across_nodes": totals}


def _built_nodes(compiled: Any) -> Any:
    """The node of each position of the compiled step's mesh, from its devices (None: one node)."""
    for s in jax.tree.leaves(compiled.input_shardings):
        if isinstance(s, NamedSharding) and isinstance(s.mesh, jax.sharding.Mesh):
            return mesh_node_ids(s.mesh)
    return None


def _mesh_shape(compiled: Any) -> dict[str, int] | None:
    for s in jax.tree.leaves(compiled.input_shardings):
        if isinstance(s, NamedSharding):
            return {str(k): int(v) for k, v in s.mesh.shape.items()}
    return None


def _num_devices(compiled: Any) -> int | None:
    for s in jax.tree.leaves(compiled.input_shardings):
        if isinstance(s, jax.sharding.Sharding):
            return len(s.device_set)
    return None


def skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def failed(reason: str) -> dict[str, Any]:
    return {"status": "failed", "reason": " ".join(str(reason).split())}


# -- child process --------------------------------------------------------------------


def child_env(devices: int) -> dict[str, str]:
    """The environment of a child that simulates ``devices`` CPU devices."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_NUM_CPU_DEVICES"] = str(devices)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def compile_in_child(module: str, args: Sequence[str], devices: int, *, timeout: float = 900) -> dict[str, Any]:
    """Runs ``python -m module *args --out FILE`` on ``devices`` simulated CPU devices; returns FILE's JSON.

    The child is expected to write a compiled view (or a ``failed`` record) to
    FILE and exit with ``os._exit(0)``.
    """
    with tempfile.TemporaryDirectory(prefix="partitioning-plan-") as tmp:
        out = os.path.join(tmp, "compiled.json")
        cmd = [sys.executable, "-m", module, *args, "--out", out]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=child_env(devices), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return failed(f"compiling for {devices} simulated devices took longer than {timeout:.0f} s")
        wall = round(time.perf_counter() - t0, 3)
        if os.path.exists(out):
            with open(out) as f:
                view = json.load(f)
            view["child_wall_s"] = wall
            return view
        tail = [line for line in (proc.stderr or "").strip().splitlines() if line.strip()]
        return failed(f"the compile child exited with status {proc.returncode}: {tail[-1] if tail else 'no output'}")


def write_and_exit(path: str, view: Mapping[str, Any]) -> None:
    """Writes the child's result and leaves at once (skipping JAX's slow teardown)."""
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(view, f)
    os.replace(tmp, path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


__all__ = [
    "compiled_view",
    "across_nodes",
    "sharding_check",
    "memory_stats",
    "normalize_spec",
    "compile_in_child",
    "child_env",
    "write_and_exit",
    "CPU_MAX_DEVICES",
    "CPU_LIMIT_REASON",
]
