"""One process of a multi-process (multi-host) run: 2 processes x 4 CPU devices.

Usage: python tests/multihost/worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR
Trains a tiny GPT with FSDP over all 8 global devices, saves an orbax
checkpoint through the multi-host path, and (process 0) writes the losses.
"""

import json
import os
import sys

pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.pop("XLA_FLAGS", None)

import jax

jax.config.update("jax_num_cpu_devices", 8 // nproc)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)

from tests.multihost.common import losses_and_checkpoint

losses = losses_and_checkpoint(out)
if jax.process_index() == 0:
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump(
            {
                "losses": losses,
                "process_count": jax.process_count(),
                "device_count": jax.device_count(),
                "local": jax.local_device_count(),
            },
            f,
        )
jax.distributed.shutdown()
