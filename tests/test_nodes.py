"""Node-aware meshes in one process: the hybrid device order, the refusals (Python and config, one line at
mesh.nodes), and the launchers' environments that --distributed reads (SLURM's srun, a JobSet's JAX_*)."""

import dataclasses

import numpy as np
import pytest

import partitioning as pt
from partitioning.devices import launcher_env
from partitioning.mesh import MeshSpec, _hybrid, mesh_node_ids, node_ids


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    """What the hybrid layout reads of a device: its id, process, platform and kind."""

    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


def _processes(arr):
    return np.vectorize(lambda d: d.process_index)(arr).tolist()


def test_each_nodes_devices_fill_the_axes_inside_a_node():
    devices = [FakeDevice(i, i // 4) for i in range(8)]  # 2 processes x 4 devices
    spec = MeshSpec.from_mapping({"fsdp": 4, "data": 2}, nodes={"data": 2})
    # jax.make_mesh would put devices 0-3 (process 0) on fsdp 0-1 of both data columns: every fsdp group
    # would cross processes. Across nodes only data: each fsdp column is one process.
    assert _processes(_hybrid(spec, devices, spec.resolve(8))) == [[0, 1], [0, 1], [0, 1], [0, 1]]
    assert node_ids({"fsdp": 4, "data": 2}, {"data": 2}).tolist() == [[0, 1], [0, 1], [0, 1], [0, 1]]
    # A factor of an axis across nodes: fsdp 0-1 on the first node, 2-3 on the second.
    spec = MeshSpec.from_mapping({"data": 2, "fsdp": 4}, nodes={"fsdp": 2})
    arr = _hybrid(spec, devices, spec.resolve(8))
    assert _processes(arr) == node_ids({"data": 2, "fsdp": 4}, {"fsdp": 2}).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert np.vectorize(lambda d: d.id)(arr).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_one_process_builds_the_same_mesh_with_or_without_nodes():
    plain = pt.make_mesh({"data": 2, "fsdp": -1})
    mesh = pt.make_mesh({"data": 2, "fsdp": -1}, nodes={"data": 2})
    assert mesh.devices.tolist() == plain.devices.tolist() and mesh.axis_names == plain.axis_names
    assert mesh_node_ids(mesh) is None
    spec = MeshSpec.from_mapping({"data": 4, "fsdp": -1, "tensor": 1}, nodes={"data": 2, "tensor": 1})
    assert spec.nodes == (("data", 2),) and spec.node_count == 2
    assert spec.split(32) == ({"data": 2, "fsdp": 8, "tensor": 1}, {"data": 2, "fsdp": 1, "tensor": 1})


@pytest.mark.parametrize(
    "shape, nodes, msg",
    [
        ({"data": 2, "fsdp": 4}, {"data": 3}, "nodes: data: 3 nodes do not divide its size 2; use 1 or 2"),
        ({"data": 2, "fsdp": -1}, {"fsdp": 3}, "nodes: fsdp: 3 nodes do not divide its size 4; use 1, 2 or 4"),
        ({"data": 2, "fsdp": 4}, {"dta": 2}, "nodes: 'dta' is not a mesh axis (data, fsdp); did you mean 'data'?"),
        ({"data": 2, "fsdp": 4}, {"data": 0}, "nodes: data: the number of nodes must be a positive integer, got 0"),
    ],
)
def test_a_split_that_does_not_divide_is_one_line(shape, nodes, msg):
    with pytest.raises(pt.MeshError) as e:
        pt.make_mesh(shape, nodes=nodes)
    assert str(e.value) == msg and e.value.arg == "nodes"


def test_a_long_list_of_divisors_names_the_nearest():
    assert pt.mesh.nodes_problem({"fsdp": 2048}, {"fsdp": 3}) == (
        "fsdp: 3 nodes do not divide its size 2048; use a divisor of 2048, e.g. 2 or 4"
    )


def test_nodes_that_are_not_the_processes_are_refused_with_what_would_work():
    devices = [FakeDevice(i, i // 2) for i in range(8)]  # 4 processes x 2 devices
    spec = MeshSpec.from_mapping({"data": 4, "fsdp": 2}, nodes={"data": 2})
    with pytest.raises(pt.MeshError) as e:
        _hybrid(spec, devices, spec.resolve(8))
    assert str(e.value) == (
        "nodes: {data: 2} puts the mesh on 2 nodes, but its devices belong to 4 processes (one per node); "
        "use nodes {data: 4}"
    )
    uneven = [FakeDevice(i, 0 if i < 6 else 1) for i in range(8)]  # 6 + 2 devices
    with pytest.raises(pt.MeshError) as e:
        _hybrid(spec, uneven, spec.resolve(8))
    assert str(e.value) == "nodes: {data: 2} needs 4 devices on each of 2 nodes, but the processes hold 6, 2"


def test_config_refusals_are_one_line_at_mesh_nodes(write, run_cli_in_process):
    text = (
        "model: {name: mlp}\nmesh:\n  shape: {data: 2, fsdp: -1}\n  nodes: {NODES}\nrules: fsdp\n"
        "train: {steps: 2, batch_size: 8, seq_len: 16}\n"
    )
    cfg = write("run.yaml", text.replace("NODES", "data: 3"))
    r = run_cli_in_process("check", cfg, "--devices", "8")
    assert r.returncode == 2
    assert r.stderr == f"error: {cfg}:4: mesh.nodes: data: 3 nodes do not divide its size 2; use 1 or 2\n"
    # The -1 axis is known once the devices are: still at mesh.nodes, and from shapes alone too.
    cfg = write("minus.yaml", text.replace("NODES", "fsdp: 3"))
    r = run_cli_in_process("check", cfg, "--devices", "8")
    assert r.stderr == f"error: {cfg}:4: mesh.nodes: fsdp: 3 nodes do not divide its size 4; use 1, 2 or 4\n"
    r = run_cli_in_process("check", cfg, "--devices", "4096")
    assert r.returncode == 2
    assert r.stderr == (
        f"error: {cfg}:4: mesh.nodes: fsdp: 3 nodes do not divide its size 2048; use a divisor of 2048, e.g. 2 or 4\n"
    )
    cfg = write("good.yaml", text.replace("NODES", "data: 2"))
    r = run_cli_in_process("check", cfg, "--devices", "8")
    assert r.returncode == 0, r.stderr
    assert "nodes: 2 x 4 devices (mesh.nodes {data: 2}); across nodes: data (2 nodes); inside one node: fsdp" in (
        r.stdout.splitlines()
    )


# -- the launchers' environments ----------------------------------------------------------------------------

SRUN = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_NODELIST": "gpu[017-018]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NUM_NODES": "2",
}


def test_srun_and_jobset_variables_say_who_is_who():
    s = launcher_env(SRUN)
    assert (s.name, s.coordinator, s.host, s.num_processes, s.process_id, s.per_node) == (
        "SLURM",
        None,
        "gpu017",
        2,
        1,
        1,
    )
    j = launcher_env({"JAX_COORDINATOR_ADDRESS": "llama-workers-0-0.llama:1234", "JAX_NUM_PROCESSES": "4",
                      "JAX_PROCESS_ID": "3", **SRUN})  # fmt: skip
    assert (j.name, j.coordinator, j.host, j.num_processes, j.process_id) == (
        "JAX_*",
        "llama-workers-0-0.llama:1234",
        "llama-workers-0-0.llama",
        4,
        3,
    )
    assert launcher_env({k: v for k, v in SRUN.items() if k != "SLURM_LOCALID"}) is None  # not all srun sets
    assert launcher_env({"JAX_COORDINATOR_ADDRESS": "h:1"}) is None  # jax detects the rest (Kubernetes' API)


@pytest.mark.parametrize(
    "env, msg",
    [
        (
            {"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "0"},
            "--distributed: JAX_NUM_PROCESSES, JAX_PROCESS_ID is set but not JAX_COORDINATOR_ADDRESS; set all three "
            "(docs/multihost.md) or none",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "four", "JAX_PROCESS_ID": "0"},
            "--distributed: JAX_NUM_PROCESSES must be an integer >= 1, got 'four'",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "4"},
            "--distributed: JAX_PROCESS_ID must be in [0, 4), got 4",
        ),
    ],
)
def test_a_broken_launcher_environment_is_one_line(env, msg):
    with pytest.raises(pt.MeshError) as e:
        launcher_env(env)
    assert str(e.value) == msg


def test_one_process_per_node_under_srun_drives_every_gpu_of_its_node():
    from partitioning.devices import _slurm_gpus

    one_per_node = launcher_env(SRUN)
    assert _slurm_gpus(one_per_node, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}) == list(range(8))
    assert _slurm_gpus(one_per_node, {"SLURM_GPUS_ON_NODE": "4"}) == [0, 1, 2, 3]
    assert _slurm_gpus(one_per_node, {}) is None  # nothing says how many: jax's default
    per_gpu = launcher_env(SRUN | {"SLURM_NTASKS": "16"})  # 8 tasks per node: one GPU each, jax's own way
    assert per_gpu.per_node == 8 and _slurm_gpus(per_gpu, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}) is None
