"""Hardware profiles (partitioning.tune.hardware): the table, the bandwidth of collectives over mesh axes,
profiles from YAML files, and one-line errors."""

import json

import pytest

from partitioning.errors import ConfigError
from partitioning.tune.hardware import PROFILES, collective_time, hardware, profile_names
from partitioning.tune.hardware_file import load_hardware


def test_every_profile_cites_its_sources_and_has_positive_numbers():
    assert set(profile_names()) == {"h100", "h200", "a100-80g", "v4", "v5e", "v5p", "cpu"}
    for name, hw in PROFILES.items():
        assert hw.sources and all(s.startswith("https://") for s in hw.sources), name
        assert hw.peak_flops > 1e14 and hw.memory > 10 * 2**30 and hw.memory_bandwidth > 5e11
        assert hw.link_bandwidth > hw.network_bandwidth > 0 and hw.overlap and not hw.measured


def test_published_chip_numbers():
    assert hardware("h100").peak_flops == 989e12 and hardware("h100").memory == 80 * 10**9
    assert hardware("v5p").peak_flops == 4.59e14 and hardware("v5p").link_bandwidth == 2 * 9e10
    assert hardware("A100").name == "a100-80g"  # aliases, any case


def test_torus_layout_puts_the_last_mesh_axis_on_the_smallest_dimension():
    v5p = hardware("v5p")
    assert v5p.torus_shape(2048) == (8, 16, 16)
    mesh = {"data": 1, "fsdp": 256, "tensor": 8}
    assert v5p.bandwidth(mesh, ["tensor"]) == 1.8e11  # one torus dimension
    assert v5p.bandwidth(mesh, ["fsdp"]) == 2 * 1.8e11  # two
    assert v5p.bandwidth({"data": 2048}, ["data"]) == 3 * 1.8e11
    assert v5p.bandwidth(mesh, ["data"]) == float("inf")  # a size-1 axis moves nothing


def test_nodes_inside_and_across():
    h100 = hardware("h100")
    assert h100.bandwidth({"data": 8}, ["data"]) == 450e9  # NVLink
    assert h100.bandwidth({"data": 2048}, ["data"]) == 8 * 50e9  # 8 NICs per node share the buffer
    assert h100.bandwidth({"fsdp": 256, "tensor": 8}, ["fsdp"]) == 50e9  # one GPU of each node per group
    assert h100.bandwidth({"fsdp": 128, "tensor": 16}, ["fsdp"]) == 50e9
    assert h100.bandwidth({"data": 64, "tensor": 2}, ["data"]) == 4 * 50e9  # 4 of a group per node


def test_collective_time_is_bytes_over_bandwidth_plus_latency():
    hw = hardware("v5p")
    assert collective_time(hw, "all-gather", 1e9, 8, 1e11) == pytest.approx(1e-5 + 1e-2)
    assert collective_time(hw, "all-reduce", 1e9, 8, 1e11, count=3) == pytest.approx(3e-5 + 2e-2)
    assert collective_time(hw, "all-reduce", 1e9, 1, 1e11) == 0.0


def test_unknown_profile_says_what_exists():
    with pytest.raises(ConfigError, match=r"no such profile.*did you mean 'h100'"):
        hardware("h10")


GOOD = """\
name: my-gpu
peak_flops: 4.0e14
memory: 48GiB
memory_bandwidth: 1.0e12
topology: nodes
node_size: 4
link_bandwidth: 2.0e11
network_bandwidth: 2.5e10
"""


def test_a_yaml_file_describes_any_machine(write):
    hw = load_hardware(write("gpu.yaml", GOOD))
    assert hw.name == "my-gpu" and hw.memory == 48 * 2**30 and hw.node_size == 4
    assert hw.bandwidth({"data": 8}, ["data"]) == 4 * 2.5e10


def test_yaml_errors_name_the_file_line_and_key(write):
    path = write("bad.yaml", GOOD.replace("peak_flops", "peak_flop").replace("topology: nodes", "topology: mesh"))
    with pytest.raises(ConfigError) as e:
        load_hardware(path)
    lines = str(e.value).splitlines()
    assert f"{path}:2: peak_flop: unknown key; did you mean 'peak_flops'?" in lines
    assert f"{path}:5: topology: expected 'nodes' or 'torus', got 'mesh'" in lines
    assert f"{path}: missing key 'peak_flops'" in lines


def test_a_yaml_file_gives_a_gemm_table_and_a_contention(write):
    points = [[m, n, k, 100.0 * (m + n + k) / 256 - 200.0] for m in (256, 512) for n in (256, 512) for k in (256, 512)]
    table = {"source": "my sweep", "date": "2026-01-01", "peak_flops": 4.0e14, "columns": ["m", "n", "k", "tflops"]}
    write("table.json", json.dumps(table | {"points": points}))
    hw = load_hardware(write("gpu.yaml", GOOD + "gemm: table.json\ncontention: 0.2\n"))
    assert hw.gemm.source == "my sweep" and hw.gemm.efficiency(512, 512, 512) == 1.0 and hw.contention == 0.2
    assert hw.gemm.efficiency(256, 256, 256) == 0.25
    path = write("bad.yaml", GOOD + "gemm: missing.json\ncontention: 1.5\nlinks: []\n")
    with pytest.raises(ConfigError) as e:
        load_hardware(path)
    lines = str(e.value).splitlines()
    assert f"{path}:9: gemm: cannot read {path.parent / 'missing.json'} as JSON (FileNotFoundError)" in lines
    assert f"{path}:10: contention: expected a share of a collective's time in [0, 1), got 1.5" in lines
    assert any(line.startswith(f"{path}:11: links: unknown key") for line in lines)


def test_every_profile_says_where_its_gemm_table_and_links_come_from():
    for name, hw in PROFILES.items():
        assert hw.gemm is not None and hw.gemm.source and hw.gemm.date, name
        assert len(hw.links) == 2 and all(link.source for link in hw.links), name
    assert PROFILES["h100"].gemm.measured and PROFILES["h200"].gemm is PROFILES["h100"].gemm  # XLA's sm_90 table
    assert not PROFILES["a100-80g"].gemm.measured and "271.2 of 312" in PROFILES["a100-80g"].gemm.source
    assert [link.name for link in PROFILES["h100"].links] == ["nvlink", "infiniband"]
    assert [link.name for link in PROFILES["v5p"].links] == ["ici", "dcn"]
