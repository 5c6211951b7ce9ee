"""The memory budget: does a layout's per-device peak fit the device, and if not, what takes the room.

The peak is XLA's compiled figure when the step was compiled (arguments +
outputs - aliased + temporaries: the state, the batch and every intermediate),
else the plan's analytic one (params + gradients + optimizer state per device;
activations not included, and said so). The budget is ``mesh.device_memory``,
else what the device reports (``memory_stats()["bytes_limit"]`` on GPUs and
TPUs; the CPU reports none).

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(embed=64, mlp=128, layers=4), optax.adamw(1e-3),
    ...                                             batch_size=8, seq_len=16)
    >>> from partitioning.plan.budget import check_budget
    >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 8}, "fsdp")
    >>> fit = check_budget(plan, budget=256 * 2**10)     # a 256 KiB device; compiled= XLA's figure if there is one
    >>> fit.fits, fit.peak, fit.top[0]
    (False, 394372, ('params/blocks/mlp/wi_0 (+grad, optimizer)', 65536))
    >>> raise fit.error()
    Traceback (most recent call last):
    ...
    partitioning.errors.ShardingError: mesh.device_memory: this layout needs 385.13 KiB per device ...
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax

from partitioning.errors import ShardingError
from partitioning.fmt import fmt_bytes, parse_bytes
from partitioning.plan.plan import Plan


def device_memory() -> int | None:
    """Bytes one device can hold, when the backend says (GPU / TPU); None on the CPU."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # backends without memory stats
        return None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


@dataclasses.dataclass(frozen=True)
class Budget:
    """A per-device peak against a budget, and the largest consumers of it."""

    budget: int | None
    peak: int
    source: str  # "compiled" | "analytic (params + gradients + optimizer; no activations)"
    top: tuple[tuple[str, int], ...]  # (what, bytes per device), largest first

    @property
    def fits(self) -> bool:
        return self.budget is None or self.peak <= self.budget

    def describe(self) -> str:
        """One line: the peak, the budget, and what takes the room."""
        room = "no budget set" if self.budget is None else f"budget {fmt_bytes(self.budget)}"
        top = ", ".join(f"{what} {fmt_bytes(n)}" for what, n in self.top)
        return f"peak {fmt_bytes(self.peak)} per device ({self.source}), {room}; largest: {top}"

    def error(self, where: str = "mesh.device_memory") -> ShardingError:
        """The refusal: numbers, the top three consumers, and what to change."""
        return ShardingError(
            f"{where}: this layout needs {fmt_bytes(self.peak)} per device ({self.source}), more than the budget "
            f"of {fmt_bytes(self.budget or 0)}; largest: "
            + ", ".join(f"{w} {fmt_bytes(n)}" for w, n in self.top)
            + "; shard more (fsdp / tensor axes), remat, a smaller batch, or raise mesh.device_memory",
            arg="device_memory",
        )


def consumers(plan: Plan, compiled: dict[str, int] | None = None, top: int = 3) -> tuple[tuple[str, int], ...]:
    """The largest per-device consumers of device memory: each parameter with its gradient and optimizer state
    (not an optimizer state offloaded and updated on the host: it never comes to the device), and temporaries."""
    by_param: dict[str, int] = {}
    for leaf in plan.params:
        # The param and its gradient (a frozen param has none).
        by_param[leaf.path] = (2 if plan.trains(leaf) else 1) * leaf.per_device_bytes
    with_opt = not ("optimizer" in plan.offload and plan.offload_update == "host")
    for leaf in plan.opt_state if with_opt else ():
        owner = next((p for p in by_param if leaf.path.endswith("/" + p[len("params/") :])), None)
        if owner is not None:
            by_param[owner] += leaf.per_device_bytes
    frozen = {f"params/{p}" for p in plan.frozen}
    also = "+grad, optimizer" if with_opt else "+grad"
    items = [(f"{p} ({'frozen' if p in frozen else also})", n) for p, n in by_param.items()]
    if compiled:
        items.append(("temporaries (activations, XLA scratch)", int(compiled["temp"])))
    return tuple(sorted(items, key=lambda x: -x[1])[:top])


def check_budget(plan: Plan, budget: int | None, compiled: dict[str, int] | None = None) -> Budget:
    """The layout's per-device peak against ``budget`` (compiled figures when given)."""
    if compiled:
        peak, source = int(compiled["peak_estimate"]), "compiled"
    elif not plan.offload:
        peak = int(plan.totals["total"]["per_device"])
        source = "analytic: params + gradients + optimizer state; activations not included"
    else:
        peak = int(plan.memory_kinds["device"]["per_device"])
        source = f"analytic: the state on the device, {', '.join(plan.offload)} offloaded; activations not included"
    return Budget(budget=budget, peak=peak, source=source, top=consumers(plan, compiled))


def host_memory() -> int | None:
    """Bytes of RAM of this machine (``os.sysconf``): the default host budget of one process; None where the
    system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def host_budget(setting: int | str | None) -> int | None:
    """A process's host memory: ``setting`` (``mesh.host_memory``: bytes, or a size such as ``1TiB``), else this
    machine's RAM (:func:`host_memory`)."""
    return parse_bytes(setting) if setting is not None else host_memory()


@dataclasses.dataclass(frozen=True)
class HostBudget:
    """The host memory offloaded state needs per process (``per_device`` x the ``devices`` a process drives).

    Example::

        >>> from partitioning.plan.budget import HostBudget
        >>> fit = HostBudget(budget=2 * 2**30, per_device=512 * 2**20, devices=8, source="analytic")
        >>> fit.fits, fit.describe()
        (False, 'host: 4.00 GiB per process (512.00 MiB per device x 8 devices, analytic), budget 2.00 GiB')
    """

    budget: int | None
    per_device: int
    devices: int
    source: str  # "compiled" | "analytic"

    @property
    def need(self) -> int:
        return self.per_device * self.devices

    @property
    def fits(self) -> bool:
        return self.budget is None or self.need <= self.budget

    def describe(self) -> str:
        room = "no budget known" if self.budget is None else f"budget {fmt_bytes(self.budget)}"
        return (
            f"host: {fmt_bytes(self.need)} per process ({fmt_bytes(self.per_device)} per device x {self.devices} "
            f"device{'s' if self.devices != 1 else ''}, {self.source}), {room}"
        )

    def error(self, where: str = "mesh.host_memory") -> ShardingError:
        """The refusal: the numbers, and what to change."""
        return ShardingError(
            f"{where}: the offloaded state needs {fmt_bytes(self.need)} of host memory per process "
            f"({fmt_bytes(self.per_device)} per device x {self.devices} devices, {self.source}), more than the "
            f"{fmt_bytes(self.budget or 0)} there is; offload less (train.offload), spread the state over more "
            "devices (fsdp), or raise mesh.host_memory",
            arg="host_memory",
        )


def check_host(plan: Plan, budget: int | None, devices: int, compiled: dict[str, int] | None = None) -> HostBudget:
    """The host bytes of ``plan``'s offloaded state for a process driving ``devices`` devices, against
    ``budget`` (compiled figures when given: the step's host buffers)."""
    if compiled and "host" in compiled:
        return HostBudget(budget, int(compiled["host"]), int(devices), "compiled")
    return HostBudget(budget, int(plan.memory_kinds["host"]["per_device"]), int(devices), "analytic")


def host_key(setting: int | str | None, where: Callable[..., str]) -> str:
    """Where a host-memory refusal points: ``mesh.host_memory`` when it is set, else ``train.offload``
    (``where``: a config's ``file:line: key`` of a key, :meth:`Config.where`)."""
    return where("mesh", "host_memory") if setting is not None else where("train", "offload")


def refuse_host(
    plan: Plan,
    setting: int | str | None,
    devices: int,
    where: Callable[..., str],
    compiled: dict[str, int] | None = None,
) -> HostBudget | None:
    """:func:`check_host` against :func:`host_budget` of ``setting`` (``mesh.host_memory``), raised at
    :func:`host_key` when it does not fit; None without offload."""
    if not plan.offload:
        return None
    host = check_host(plan, host_budget(setting), devices, compiled)
    if not host.fits:
        raise host.error(host_key(setting, where))
    return host


__all__ = [
    "Budget",
    "HostBudget",
    "check_budget",
    "check_host",
    "consumers",
    "device_memory",
    "host_budget",
    "host_key",
    "host_memory",
    "refuse_host",
]
