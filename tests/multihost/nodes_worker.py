"""One process of a run whose nodes are local processes: 4 processes x 2 CPU devices, launched the way a
Kubernetes JobSet launches them (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID in the environment).

Usage: JAX_...=... python tests/multihost/nodes_worker.py OUT_DIR
Joins with pt.initialize_distributed() (what --distributed calls), builds node-aware meshes, records which
processes each mesh axis' groups span (from device.process_index), the refusals of a split that does not
match the processes (Python and config), and the losses of the shared run; process 0 writes nodes.json.
"""

import json
import os
import sys

out = sys.argv[1]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.pop("XLA_FLAGS", None)

import jax
import numpy as np

import partitioning as pt

pt.initialize_distributed(global_devices=8)

from partitioning.config.build import mesh_from_config
from tests.multihost.common import losses_on


def spans(mesh):
    """Per axis: the sorted process sets of its groups (every other axis fixed)."""
    procs = np.vectorize(lambda d: d.process_index)(mesh.devices)
    result = {}
    for i, name in enumerate(mesh.axis_names):
        rows = np.moveaxis(procs, i, -1).reshape(-1, procs.shape[i])
        result[name] = sorted({tuple(sorted(set(r.tolist()))) for r in rows})
    return result


def refusal(fn):
    try:
        fn()
    except pt.MeshError as e:
        return str(e)
    return None


record = {"process_count": jax.process_count(), "local": jax.local_device_count()}
# {fsdp: 2, data: 4}: jax.make_mesh would put both fsdp devices of a group on different processes; across
# nodes only data.
mesh = pt.make_mesh({"fsdp": 2, "data": 4}, nodes={"data": 4})
record["whole"] = spans(mesh)
# A factor of each axis across nodes: 2 x 2 nodes, each holding one fsdp device and two data devices.
record["factors"] = spans(pt.make_mesh({"fsdp": 2, "data": 4}, nodes={"data": 2, "fsdp": 2}))
record["refused"] = refusal(lambda: pt.make_mesh({"fsdp": 2, "data": 4}, nodes={"data": 2}))
cfg_path = os.path.join(out, f"refused{jax.process_index()}.yaml")
with open(cfg_path, "w") as f:
    f.write("model: {name: mlp}\nmesh:\n  shape: {fsdp: 2, data: 4}\n  nodes: {data: 2}\nrules: fsdp\n")
record["refused_config"] = refusal(lambda: mesh_from_config(pt.load_config(cfg_path)))
record["losses"] = losses_on(mesh)
if jax.process_index() == 0:
    with open(os.path.join(out, "nodes.json"), "w") as f:
        json.dump(record, f)
jax.distributed.shutdown()
