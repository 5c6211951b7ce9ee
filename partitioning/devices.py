"""Devices: simulated CPU devices for a mesh, and joining hosts with ``jax.distributed``.

Both must happen before JAX's backend starts (the first computation or device
query); after that they can only check and say how to fix it.

On a machine without accelerators a mesh of ``n`` devices runs on ``n``
simulated CPU devices (``jax_num_cpu_devices``). For several hosts, one process
per host joins the others with :func:`initialize_distributed`: on a cluster jax
detects by itself (Cloud TPU, SLURM, ...) no arguments are needed; anywhere
else — including several local processes on one machine, which is how
multi-host is tested here — pass the coordinator address, the number of
processes and this process's id. On the CPU the processes talk through gloo,
and each simulates its share of the devices.

Example::

    >>> import partitioning as pt
    >>> pt.simulate_devices(8)              # before any jax computation
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})   # 8 CPU devices
    >>> dict(mesh.shape)
    {'data': 1, 'fsdp': 8}
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from partitioning.errors import MeshError
from partitioning.peers import jax_timeouts, start_watch

# XLA's CPU backend compiles for at most this many devices, and simulating more only burns time.
MAX_SIMULATED = 2048


def _on_cpu() -> bool:
    # jax defines its flags as attributes of jax.config at runtime (unknown to type checkers).
    platforms = os.environ.get("JAX_PLATFORMS", "") or jax.config.jax_platforms or ""  # type: ignore[attr-defined]  # a runtime flag attribute
    return platforms in ("", "cpu")


def simulate_devices(n: int | None, *, quiet: bool = True) -> None:
    """Makes at least ``n`` devices visible, simulating CPU devices when needed.

    A no-op on accelerator platforms and when enough devices are visible.
    Raises :class:`MeshError` when the backend already started with fewer.

    Example::

        >>> from partitioning import simulate_devices
        >>> simulate_devices(8)
        >>> jax.device_count()
        8
    """
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise MeshError(f"the device count must be a positive integer, got {n!r}", arg="devices")
    if not _on_cpu():
        return  # a real accelerator platform: never simulate
    if n > MAX_SIMULATED:
        raise MeshError(
            f"{n:,} devices: the CPU simulates at most {MAX_SIMULATED:,}; `partitioning plan` and "
            f"`partitioning check` price bigger meshes from shapes alone",
            arg="devices",
        )
    try:
        current = jax.config.jax_num_cpu_devices  # type: ignore[attr-defined]  # a runtime flag attribute
        if current is not None and current >= n:
            return
        jax.config.update("jax_num_cpu_devices", max(n, current or 0))
    except RuntimeError:  # backend already started
        if jax.device_count() < n:
            raise MeshError(
                f"{n} devices are needed but jax already started with {jax.device_count()}: call "
                f"simulate_devices({n}) before any JAX computation (a fresh Python process), or set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before starting Python"
            ) from None
        return
    if jax.device_count() < n:
        raise MeshError(f"{n} devices are needed but only {jax.device_count()} are visible")
    if not quiet and jax.default_backend() == "cpu" and n > 1:
        print(f"simulating {n} CPU devices", file=sys.stderr, flush=True)


def initialize_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    global_devices: int | None = None,
    peer_timeout: float | None = None,
) -> None:
    """Joins this process to the others; must run before any jax computation.

    ``global_devices`` is the device count the run needs: on the CPU each
    process simulates ``global_devices / num_processes`` of them.
    ``peer_timeout`` (seconds) starts the watch of :mod:`partitioning.peers`: a
    process that dies or goes silent that long stops every other one with one
    line (jax's own heartbeat timeout is set above it).

    Example (not run: it waits for the other processes) — on every host, here process 0 of two on one
    machine, 4 CPU devices each::

        import partitioning as pt

        pt.initialize_distributed("127.0.0.1:1234", num_processes=2, process_id=0, global_devices=8)

    An incomplete set of arguments is refused before anything starts::

        >>> pt.initialize_distributed("127.0.0.1:1234", num_processes=2)
        Traceback (most recent call last):
        partitioning.errors.MeshError: multi-host needs all of --coordinator HOST:PORT, --num-processes N and \
--process-id I (or only --distributed on a cluster jax detects by itself)
    """
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise MeshError(
            "multi-host needs all of --coordinator HOST:PORT, --num-processes N and --process-id I "
            "(or only --distributed on a cluster jax detects by itself)"
        )
    if _on_cpu() and num_processes:
        if process_id is None or not 0 <= process_id < num_processes:
            raise MeshError(f"--process-id must be in [0, {num_processes}), got {process_id}")
        if global_devices:
            if global_devices % num_processes:
                raise MeshError(f"{global_devices} devices cannot be split evenly over {num_processes} processes")
            jax.config.update("jax_num_cpu_devices", global_devices // num_processes)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts: dict[str, Any] = jax_timeouts(peer_timeout) if peer_timeout else {}
    try:
        if all(given):
            jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id, **timeouts)
        else:
            jax.distributed.initialize(**timeouts)
    except (ValueError, RuntimeError) as e:
        what = f"joining {coordinator}" if all(given) else "--distributed: no cluster to join was detected"
        raise MeshError(
            f"{what} ({' '.join(str(e).split())[:160]}); on a machine jax cannot detect as a "
            f"cluster, pass --coordinator HOST:PORT, --num-processes N and --process-id I"
        ) from None
    host = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if peer_timeout and host and jax.process_count() > 1:
        start_watch(jax.process_index(), jax.process_count(), host.rsplit(":", 1)[0].strip("[]"), peer_timeout)
    if global_devices and jax.device_count() < global_devices:
        raise MeshError(
            f"the config needs {global_devices} devices but the {jax.process_count()} processes "
            f"have {jax.device_count()} together"
        )


__all__ = ["simulate_devices", "initialize_distributed", "MAX_SIMULATED"]
