"""Multi-host start-up: one process per host, joined with ``jax.distributed``.

On a cluster jax can detect (Cloud TPU, SLURM, ...) ``initialize()`` with no
arguments is enough. Anywhere else — including several local processes on
one machine, which is how multi-host is tested here — pass the coordinator
address, the number of processes and this process's id. On the CPU the
processes talk through gloo, and each simulates its share of the devices.

Example::

    # on every host (here: two processes on one machine, 4 CPU devices each)
    $ partitioning train cfg.yaml --coordinator 127.0.0.1:1234 --num-processes 2 --process-id 0
    $ partitioning train cfg.yaml --coordinator 127.0.0.1:1234 --num-processes 2 --process-id 1
"""

from __future__ import annotations

import os

from partitioning.errors import MeshError


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, global_devices: int | None = None) -> None:
    """Joins this process to the others; must run before any jax computation.

    ``global_devices`` is the device count the config asks for: on the CPU each
    process simulates ``global_devices / num_processes`` of them.
    """
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise MeshError("multi-host needs all of --coordinator HOST:PORT, --num-processes N and --process-id I "
                        "(or only --distributed on a cluster jax detects by itself)")
    import jax

    platforms = os.environ.get("JAX_PLATFORMS", "") or jax.config.jax_platforms or ""
    on_cpu = platforms in ("", "cpu")
    if on_cpu and num_processes:
        if not 0 <= process_id < num_processes:
            raise MeshError(f"--process-id must be in [0, {num_processes}), got {process_id}")
        if global_devices:
            if global_devices % num_processes:
                raise MeshError(f"{global_devices} devices cannot be split evenly over {num_processes} processes")
            jax.config.update("jax_num_cpu_devices", global_devices // num_processes)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if all(given):
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
    else:
        jax.distributed.initialize()
    if global_devices and jax.device_count() < global_devices:
        raise MeshError(f"the config needs {global_devices} devices but the {jax.process_count()} processes "
                        f"have {jax.device_count()} together")
