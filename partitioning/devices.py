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

import dataclasses
import os
import sys
from collections.abc import Mapping
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


# What srun sets that jax's SLURM detection reads (jax/_src/clusters/slurm_cluster.py): all of them or none.
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
# What a launcher that knows the ranks (a Kubernetes JobSet, a script) sets; jax reads the first by itself.
ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


@dataclasses.dataclass(frozen=True)
class Launcher:
    """Who is who in a multi-process run, as its launcher said (:func:`launcher_env`)."""

    name: str  # "JAX_*" or "SLURM"
    coordinator: str | None  # HOST:PORT when given (JAX_*); jax derives SLURM's from the job id
    host: str  # process 0's host (the peer watch connects to it)
    num_processes: int
    process_id: int
    per_node: int | None = None  # processes per node, when the launcher says


def launcher_env(environ: Mapping[str, str] | None = None) -> Launcher | None:
    """The launcher that set this process's ranks, from its environment: ``JAX_*`` variables (a JobSet, any
    script), else ``srun``'s (SLURM); None when neither (jax may still detect Cloud TPU, Kubernetes, MPI).

    Example::

        >>> from partitioning.devices import launcher_env
        >>> env = {"SLURM_JOB_ID": "4711", "SLURM_STEP_NODELIST": "gpu[017-020]", "SLURM_NTASKS": "4",
        ...        "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_NODES": "4"}
        >>> s = launcher_env(env)
        >>> s.name, s.host, s.num_processes, s.process_id, s.per_node
        ('SLURM', 'gpu017', 4, 2, 1)
        >>> launcher_env({"JAX_NUM_PROCESSES": "2"})
        Traceback (most recent call last):
        partitioning.errors.MeshError: --distributed: JAX_NUM_PROCESSES is set but not JAX_COORDINATOR_ADDRESS, \
JAX_PROCESS_ID; set all three (docs/multihost.md) or none
    """
    env = os.environ if environ is None else environ
    if any(k in env for k in ENV_VARS[1:]):
        missing = [k for k in ENV_VARS if not env.get(k)]
        if missing:
            given = ", ".join(k for k in ENV_VARS if env.get(k))
            raise MeshError(
                f"--distributed: {given} is set but not {', '.join(missing)}; set all three (docs/multihost.md) or none"
            )
        n, i = _int_var(env, "JAX_NUM_PROCESSES", 1), _int_var(env, "JAX_PROCESS_ID", 0)
        if i >= n:
            raise MeshError(f"--distributed: JAX_PROCESS_ID must be in [0, {n}), got {i}")
        address = env["JAX_COORDINATOR_ADDRESS"]
        return Launcher("JAX_*", address, address.rsplit(":", 1)[0].strip("[]"), n, i)
    if all(k in env for k in SLURM_VARS):
        n = _int_var(env, "SLURM_NTASKS", 1)
        nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or ""
        per_node = n // int(nodes) if nodes.isdigit() and int(nodes) > 0 else None
        host = first_host(env["SLURM_STEP_NODELIST"])
        return Launcher("SLURM", None, host, n, _int_var(env, "SLURM_PROCID", 0), per_node)
    return None


def _int_var(env: Mapping[str, str], key: str, least: int) -> int:
    try:
        v = int(env[key])
    except ValueError:
        v = least - 1
    if v < least:
        raise MeshError(f"--distributed: {key} must be an integer >= {least}, got {env[key]!r}")
    return v


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[001-004,9],login`` -> ``node001``), as jax picks process 0's.

    Example::

        >>> from partitioning.devices import first_host
        >>> first_host("gpu[017-020,031],cpu1"), first_host("a100-3,a100-4")
        ('gpu017', 'a100-3')
    """
    head = nodelist.split(",", 1)[0] if "[" not in nodelist.split(",", 1)[0] else nodelist
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    return prefix + rest.replace("-", ",").split(",", 1)[0].rstrip("]")


def _slurm_gpus(launch: Launcher, environ: Mapping[str, str]) -> list[int] | None:
    """One process per node under SLURM drives every GPU of its node: jax's detection would give it one
    (it assumes a process per GPU and makes only GPU ``SLURM_LOCALID`` visible)."""
    if launch.name != "SLURM" or launch.per_node != 1:
        return None
    visible = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("ROCR_VISIBLE_DEVICES") or ""
    count = len([d for d in visible.split(",") if d.strip()]) or int(environ.get("SLURM_GPUS_ON_NODE", "0") or 0)
    return list(range(count)) if count > 1 else None


def initialize_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    global_devices: int | None = None,
    peer_timeout: float | None = None,
) -> None:
    """Joins this process to the others; must run before any jax computation.

    With no arguments the launcher's environment says who is who
    (:func:`launcher_env`): ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``
    and ``JAX_PROCESS_ID`` (a Kubernetes JobSet, any script), else what
    ``srun`` sets (jax's own SLURM detection; one process per node then drives
    all the node's GPUs), else whatever jax detects (Cloud TPU, ...).
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
    launch = None if all(given) else launcher_env()
    kwargs: dict[str, Any] = jax_timeouts(peer_timeout) if peer_timeout else {}
    if launch is not None and launch.coordinator is not None:  # JAX_*: every rank given, nothing to detect
        coordinator, num_processes, process_id = launch.coordinator, launch.num_processes, launch.process_id
    elif launch is not None:  # SLURM: jax detects it (coordinator port from the job id)
        num_processes, process_id = launch.num_processes, launch.process_id
        if not _on_cpu() and (gpus := _slurm_gpus(launch, os.environ)):
            kwargs["local_device_ids"] = gpus
    explicit = coordinator is not None
    if _on_cpu() and num_processes:
        if process_id is None or not 0 <= process_id < num_processes:
            raise MeshError(f"--process-id must be in [0, {num_processes}), got {process_id}")
        if global_devices:
            if global_devices % num_processes:
                raise MeshError(f"{global_devices} devices cannot be split evenly over {num_processes} processes")
            jax.config.update("jax_num_cpu_devices", global_devices // num_processes)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        if explicit:
            jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id, **kwargs)
        else:
            jax.distributed.initialize(**kwargs)
    except (ValueError, RuntimeError) as e:
        what = (
            f"joining {coordinator}"
            if explicit
            else f"--distributed ({launch.name})"
            if launch
            else "--distributed: no cluster to join was detected"
        )
        raise MeshError(
            f"{what} ({' '.join(str(e).split())[:160]}); on a machine jax cannot detect as a "
            f"cluster, pass --coordinator HOST:PORT, --num-processes N and --process-id I"
        ) from None
    host = coordinator or (launch.host if launch else None) or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if peer_timeout and host and jax.process_count() > 1:
        start_watch(jax.process_index(), jax.process_count(), host.rsplit(":", 1)[0].strip("[]"), peer_timeout)
    if global_devices and jax.device_count() < global_devices:
        raise MeshError(
            f"the config needs {global_devices} devices but the {jax.process_count()} processes "
            f"have {jax.device_count()} together"
        )


__all__ = [
    "simulate_devices",
    "initialize_distributed",
    "launcher_env",
    "first_host",
    "MAX_SIMULATED",
    "SLURM_VARS",
    "ENV_VARS",
]
