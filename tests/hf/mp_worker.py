"""One of 2 processes x 4 CPU devices: load_hf onto fsdp_tp over all 8, logits, save_hf (process 0 writes).

Usage: python tests/hf/mp_worker.py PROCESS_ID PORT FIXTURE OUT_DIR
"""

import json
import os
import sys

pid, port, fixture, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.pop("XLA_FLAGS", None)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import partitioning as pt  # noqa: E402
from partitioning.hf import weights as hf_module  # noqa: E402

readers = []


class CountingReader(hf_module.Reader):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.names = []
        readers.append(self)

    def tensor(self, s, *args):
        self.names.append(s.name)
        return super().tensor(s, *args)


hf_module.Reader = CountingReader
mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
model, variables = pt.hf.load_hf(fixture, mesh, "fsdp_tp")
tokens = np.load(os.path.join(fixture, "tokens.npy"))
batch = jax.make_array_from_process_local_data(
    jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), tokens, tokens.shape
)
with pt.sharding_context(mesh, "fsdp_tp"):
    logits = jax.jit(model.apply, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))(
        variables, batch
    )
diff = float(np.abs(np.asarray(logits.addressable_shards[0].data) - np.load(os.path.join(fixture, "logits.npy"))).max())
pt.hf.save_hf(model, variables, os.path.join(out, "saved"), max_shard_size="60KB")
fsdp_tp_bytes = readers[-1].bytes_read
# Pipeline stages over the processes: each reads the layers of its own stage only.
pt.hf.load_hf(fixture, pt.make_mesh({"stage": 2, "data": 4}), "pp")
pp_bytes = readers[-1].bytes_read
# Experts over the processes (expert: 2 across them, fsdp inside each): each reads its experts' tensors only.
pt.hf.load_hf(
    os.path.join(os.path.dirname(fixture), "mixtral"), pt.make_mesh({"data": 1, "expert": 2, "fsdp": 4}), "ep"
)
experts = sorted({int(n.split(".experts.")[1].split(".")[0]) for n in readers[-1].names if ".experts." in n})
multihost_utils.sync_global_devices("done")
with open(os.path.join(out, f"p{pid}.json"), "w") as f:
    json.dump({"diff": diff, "bytes_read": fsdp_tp_bytes, "pp_bytes_read": pp_bytes, "experts_read": experts}, f)
jax.distributed.shutdown()
