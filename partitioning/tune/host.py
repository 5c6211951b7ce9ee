"""The host link: what offload keeps in host memory and moves over the link each step, and what that costs.

Offloaded state (``train.offload``, :mod:`partitioning.train.offload`) and
activations (``remat: offload``) cross between host memory and the device at
``Hardware.host_bandwidth`` bytes/s in each direction (PCIe; the two directions
at once). Per step and device, as :class:`~partitioning.tune.comm.Comm` terms
over the pseudo-axis ``host`` (so they are overlapped with the compute of
their phase like any collective):

- ``remat: offload``: the saved activations go to the host in the forward
  pass and come back in the backward one (once per micro-batch);
- ``params``: to the device for the passes (forward); back after an update
  on the device;
- ``optimizer``, updated on the device: the state comes in and goes back in
  the update phase (the two directions overlap: the state's bytes once);
- ``optimizer``, updated on the host: the gradients (and the params, unless
  they live there) go to the host and the new params come back; the update
  itself streams params, gradients and the state through the host's memory
  (``Hardware.host_memory_bandwidth``), a term of its own.

Example::

    >>> from partitioning.tune.host import host_transfers
    >>> from partitioning.tune.space import Candidate
    >>> c = Candidate((("fsdp", 8),), "fsdp", offload=("optimizer",))
    >>> state = {"params": 2e9, "gradients": 2e9, "optimizer": 4e9}
    >>> comm, other = host_transfers(c, state, 0.0, pt.tune.hardware("h100"))
    >>> [(x.phase, x.bytes, round(x.seconds, 4)) for x in comm], other    # 4 GB each way at 64 GB/s
    ([('update', 8000000000.0, 0.0625)], {})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioning.plan.memory_kinds import state_split
from partitioning.tune.comm import Comm
from partitioning.tune.hardware import Hardware

AXIS = ("host",)


def unpriced(c: Any, hw: Hardware) -> str | None:
    """Why candidate ``c``'s offload cannot be priced on ``hw`` (a figure the profile lacks), or None."""
    if not (c.offload or c.remat == "offload"):
        return None
    if hw.host_bandwidth is None:
        return (
            f"offload: the {hw.name} profile has no host_bandwidth (the host link is not published for it; "
            "give it in a hardware file)"
        )
    if "optimizer" in c.offload and c.offload_update == "host" and hw.host_memory_bandwidth is None:
        return f"offload: the {hw.name} profile has no host_memory_bandwidth to price an update on the host"
    return None


def priced_remats(policies: Any, hw: Hardware) -> tuple[Any, ...]:
    """``policies`` without ``offload`` when ``hw`` has no host link to price it over (the CPU)."""
    return tuple(p for p in policies if p != "offload" or hw.host_bandwidth)


def _comm(phase: str, nbytes: float, seconds: float, what: str) -> Comm:
    return Comm(AXIS, "host-transfer", phase, float(nbytes), 1.0, 1, float(seconds), what)


def host_transfers(
    c: Any, state: Mapping[str, float], host_activations: float, hw: Hardware
) -> tuple[list[Comm], dict[str, float]]:
    """``(host-link terms, other seconds)`` of one step of candidate ``c`` (see the module docstring).

    ``state``: per-device ``params``, ``gradients`` (the trainable params' bytes) and ``optimizer`` bytes;
    ``host_activations``: the bytes ``remat: offload`` keeps on the host per micro-batch.
    """
    bw = float(hw.host_bandwidth or 0)
    if not bw:
        return [], {}
    p, g, o = (float(state.get(k, 0.0)) for k in ("params", "gradients", "optimizer"))
    out, other = [], {}
    if host_activations:
        n = host_activations * c.grad_accum
        out.append(_comm("fwd", n, n / bw, "saved activations to the host (remat: offload)"))
        out.append(_comm("bwd", n, n / bw, "saved activations back to the device (remat: offload)"))
    off_p, off_o = "params" in c.offload, "optimizer" in c.offload
    host_update = off_o and c.offload_update == "host"
    if off_p:
        out.append(_comm("fwd", p, p / bw, "offloaded params to the device for the passes"))
    if off_o and not host_update:
        out.append(_comm("update", 2 * o, o / bw, "optimizer state to the device for the update and back"))
    if host_update:
        # Gradients (and params that live on the device) out, new params back: the directions overlap.
        to_host, back = g + (0.0 if off_p else g), (0.0 if off_p else g)
        what = "gradients to the host update, params back"
        out.append(_comm("update", to_host + back, max(to_host, back) / bw, what))
        other["host update"] = (2 * g + g + 2 * o) / float(hw.host_memory_bandwidth or bw)
    elif off_p:
        out.append(_comm("update", p, p / bw, "updated params back to the host"))
    return out, other


def host_bytes(c: Any, state: Mapping[str, float], host_activations: float) -> float:
    """Bytes per device in host memory: the offloaded state, the copies a host update makes, the activations."""
    split = state_split(state["params"], state["optimizer"], state["gradients"], c.offload, c.offload_update)
    return split["host"] + host_activations


__all__ = ["host_transfers", "host_bytes", "unpriced", "priced_remats"]
