"""Device and host bytes: where a compiled step's buffers live, and a plan's state split by memory kind.

A sharding's memory kind (``device`` or ``pinned_host``) says where an array
lives; offloaded train state (``train.offload``) is laid out by the rule table
as always, in host memory. Two views of the split:

- **compiled**: XLA marks host buffers in the compiled module's entry layout
  with memory space 5 (``f32[8,256]{1,0:S(5)}``) and says which outputs alias
  which arguments (``input_output_alias``). :func:`host_buffers` reads both, per
  device, so the compiled memory figures can be split: XLA's CPU backend folds
  host buffers into its ``argument`` / ``output`` sizes (every memory is RAM
  there), accelerators report them apart (``host_argument_size_in_bytes``, ...).
- **planned**: :func:`state_split` splits a plan's per-device state bytes by
  where they are in each phase of a step: gradients always on the device,
  offloaded params / optimizer state on the host between steps and where the
  update runs.

Example::

    >>> from partitioning.plan.memory_kinds import host_buffers
    >>> text = ("HloModule jit_f, input_output_alias={ {1}: (1, {}, may-alias) }, entry_computation_layout="
    ...         "{(f32[128,1024]{1,0}, f32[128,1024]{1,0:S(5)})->(f32[128,1024]{1,0}, f32[128,1024]{1,0:S(5)})}")
    >>> host_buffers(text)         # one 512 KiB argument and one output on the host, the output aliasing it
    {'host_argument': 524288, 'host_output': 524288, 'host_alias': 524288}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

HOST_SPACE = "S(5)"  # XLA's memory space of pinned host buffers
_BYTES = {"pred": 1, "bf16": 2, "f16": 2, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](\{[^{}]*\})?")
_ALIAS = re.compile(r"\{([\d,\s]*)\}:\s*\((\d+),")


def _dtype_bytes(dtype: str) -> float:
    if dtype in _BYTES:
        return _BYTES[dtype]
    if dtype.startswith("f8") or dtype.startswith("f4"):
        return 1 if dtype.startswith("f8") else 0.5
    bits = re.search(r"(\d+)$", dtype)
    return int(bits.group(1)) / 8 if bits else 0


def _buffers(side: str) -> list[tuple[float, bool]]:
    """``(bytes, on the host)`` of each array in one side of an entry layout, in order."""
    out = []
    for dtype, dims, layout in _SHAPE.findall(side):
        if dtype == "token":
            continue
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        out.append((n * _dtype_bytes(dtype), HOST_SPACE in (layout or "")))
    return out


def _entry_layout(text: str) -> tuple[str, str] | None:
    """The (arguments, outputs) text of the module's ``entry_computation_layout={(...)->...}``."""
    head = text.split("\n", 1)[0]
    i = head.find("entry_computation_layout={")
    if i < 0:
        return None
    body, depth = head[i + len("entry_computation_layout={") :], 1
    for j, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            body = body[:j]
            break
    args, _, outs = body.partition(")->")
    return args, outs


def host_buffers(text: str) -> dict[str, int]:
    """Per-device bytes of a compiled module's host arguments, host outputs and the host outputs aliasing an
    argument (``compiled.as_text()``); zeros when nothing lives on the host."""
    out = {"host_argument": 0, "host_output": 0, "host_alias": 0}
    layout = _entry_layout(text or "")
    if layout is None:
        return out
    args, outs = _buffers(layout[0]), _buffers(layout[1])
    out["host_argument"] = int(sum(n for n, host in args if host))
    out["host_output"] = int(sum(n for n, host in outs if host))
    head = text.split("\n", 1)[0]
    m = re.search(r"input_output_alias=\{(.*?)\}\s*,\s*\w+=", head)
    for index, param in _ALIAS.findall(m.group(1) if m else ""):
        idx = [int(x) for x in index.replace(" ", "").split(",") if x]
        k = idx[0] if idx else 0
        if k < len(outs) and outs[k][1] and int(param) < len(args) and args[int(param)][1]:
            out["host_alias"] += int(outs[k][0])
    return out


def split_compiled(stats: Mapping[str, int], text: str, reported: Mapping[str, int] | None = None) -> dict[str, int]:
    """XLA's memory figures (``argument``, ``output``, ``alias``, ``temp``) as device-only figures plus the host's.

    ``reported``: XLA's own ``host_*`` sizes; when it reports none, the host buffers of the entry layout are
    taken out of the device figures (XLA's CPU backend counts them there).
    """
    reported = dict(reported or {})
    if any(reported.get(k) for k in ("host_argument", "host_output", "host_temp")):
        host = {k: int(reported.get(k, 0)) for k in ("host_argument", "host_output", "host_alias", "host_temp")}
        device = {k: int(stats[k]) for k in ("argument", "output", "alias", "temp")}
    else:
        host = {**host_buffers(text), "host_temp": int(reported.get("host_temp", 0))}
        device = {
            "argument": int(stats["argument"]) - host["host_argument"],
            "output": int(stats["output"]) - host["host_output"],
            "alias": max(0, int(stats["alias"]) - host["host_alias"]),
            "temp": int(stats["temp"]),
        }
    out = {**device, **host}
    out["host"] = host["host_argument"] + host["host_output"] - host["host_alias"] + host["host_temp"]
    return out


def state_split(
    params: float, optimizer: float, gradients: float, offload: Any = (), update: str = "device"
) -> dict[str, float]:
    """Per-device state bytes by memory kind, with ``offload`` (names of
    :data:`~partitioning.train.offload.OFFLOADABLE`) on the host and the optimizer update run where ``update``
    says (:mod:`partitioning.train.offload`):

    - ``passes``: on the device during the forward and backward passes (offloaded params come to the
      device for them; an offloaded optimizer state does not);
    - ``update``: on the device during the optimizer update (an offloaded optimizer state comes to it with
      ``update="device"``);
    - ``device``: the larger; ``host``: on the host (the stored state, and with ``update="host"`` the
      gradients and params copied over for the update).

    Example::

        >>> from partitioning.plan.memory_kinds import state_split
        >>> state_split(100, 200, 100, ["optimizer"])     # the update brings the optimizer state back
        {'passes': 200, 'update': 400, 'device': 400, 'host': 200}
        >>> state_split(100, 200, 100, ["optimizer"], update="host")
        {'passes': 200, 'update': 200, 'device': 200, 'host': 400}
    """
    off = set(offload or ())
    off_p, off_o = "params" in off, "optimizer" in off
    host_update = off_o and update == "host"
    passes = params + gradients + (0 if off_o else optimizer)
    on_update = params + gradients + (0 if host_update else optimizer)
    host = (params if off_p else 0) + (optimizer if off_o else 0)
    if host_update:
        host += gradients + (0 if off_p else params)
    return {"passes": passes, "update": on_update, "device": max(passes, on_update), "host": host}


def per_array(plan: Any) -> dict[str, tuple[int, int]]:
    """``{param path: (device bytes, host bytes)}`` per device: each parameter with its gradient and its
    optimizer state, by where each is during the forward and backward passes."""
    off = set(plan.offload)
    out = {}
    for leaf in plan.params:
        grad = leaf.per_device_bytes if plan.trains(leaf) else 0
        stored = leaf.per_device_bytes
        out[leaf.path] = [grad + stored * ("params" not in off), stored * ("params" in off)]
    for leaf in plan.opt_state:
        owner = next((p for p in out if leaf.path.endswith("/" + p[len("params/") :])), None)
        if owner is not None:
            out[owner][1 if "optimizer" in off else 0] += leaf.per_device_bytes
    return {p: (int(d), int(h)) for p, (d, h) in out.items()}


__all__ = ["host_buffers", "split_compiled", "state_split", "per_array", "HOST_SPACE"]
