"""Nodes in the tuner: the placements of a mesh on a cluster's nodes, each link level priced, the fastest kept
(tensor inside a node), and written as mesh.nodes."""

import dataclasses
import math

import optax
import pytest
import yaml

import partitioning as pt
from partitioning.tune.comm import priced_comm
from partitioning.tune.nodes import default_nodes, placements
from partitioning.tune.price import price
from partitioning.tune.space import Candidate


def test_placements_split_the_node_count_over_the_axes_the_default_first():
    assert placements({"data": 4, "fsdp": 8}, 8) == [{"data": 4}, {"data": 2, "fsdp": 2}, {"fsdp": 4}]
    assert placements({"data": 2, "fsdp": 16}, 8) == [{"data": 2, "fsdp": 2}, {"fsdp": 4}]  # data 4 does not divide
    assert placements({"fsdp": 8, "tensor": 2}, 8) == [{"fsdp": 2}]  # tensor stays inside
    assert placements({"fsdp": 2, "tensor": 16}, 8) == [{"fsdp": 2, "tensor": 2}, {"tensor": 4}]  # unless it cannot
    assert placements({"data": 8}, 8) == [] and placements({"data": 12}, 8) == []  # one node; not whole nodes
    assert default_nodes({"stage": 4, "data": 8, "tensor": 8}, 8) == {"stage": 4, "data": 8}


@pytest.mark.parametrize("name", ["h100", "a100-80g", "v5e"])
@pytest.mark.parametrize(
    "mesh, axes",
    [
        ({"data": 4, "fsdp": 16, "tensor": 4}, ["fsdp"]),
        ({"data": 4, "fsdp": 16, "tensor": 4}, ["data", "fsdp"]),
        ({"data": 64, "tensor": 4}, ["tensor"]),
        ({"stage": 8, "data": 32, "tensor": 2}, ["stage"]),
    ],
)
def test_jax_make_mesh_layout_is_the_default_placement(name, mesh, axes):
    hw = pt.tune.hardware(name)
    nodes = default_nodes(mesh, hw.node_size)
    assert hw.bandwidth(mesh, axes, nodes=nodes) == hw.bandwidth(mesh, axes)
    assert hw.members_per_node(mesh, axes, nodes) == hw.members_per_node(mesh, axes)


def test_each_link_level_is_priced():
    h100, mesh = pt.tune.hardware("h100"), {"data": 4, "fsdp": 8}
    inside = priced_comm(h100, mesh, {"data": 4}, ("fsdp",), "all-gather", "fwd", 1e9, 1, "weights")
    across = priced_comm(h100, mesh, {"fsdp": 4}, ("fsdp",), "all-gather", "fwd", 1e9, 1, "weights")
    assert (inside.nodes, across.nodes) == (1, 4)
    nvlink, ib = h100.links
    # NVLink: XLA's measured all-gather of 8 H100s at 1 GB (393 of NVLink's 450 GB/s).
    assert inside.seconds == pytest.approx(1e9 / nvlink.curves["all-gather 8"].rate(1e9))
    assert 1e9 / inside.seconds / 1e9 == pytest.approx(392.5, abs=0.5)
    # 2 fsdp devices per node: 2 NICs each carrying half the buffer to 4 nodes, 46 us + 47 of their 50 GB/s.
    assert across.seconds == pytest.approx(46e-6 + 0.5e9 / (0.94 * 50e9))
    assert ib.rate("all-gather", 4, 0.5e9) == pytest.approx(0.5e9 / (46e-6 + 0.5e9 / 47e9))
    # A TPU slice's torus inside, the data-centre network across.
    v5e = pt.tune.hardware("v5e")
    assert v5e.bandwidth({"data": 2, "fsdp": 256}, ["data"], nodes={"data": 2}) == v5e.network_bandwidth * 1


@pytest.fixture(scope="module")
def wide_gpt():
    """A 0.9B GPT's abstract state and workload (batch 64 x 1024): big enough for the links to matter."""
    model = pt.model.build_model("gpt", vocab_size=32000, embed=2048, heads=16, mlp=8192, layers=16)
    params, opt = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=64, seq_len=1024)
    w = pt.tune.workload(pt.build_plan(params, opt, {"data": 1}, pt.Rules([])).params, batch_size=64, seq_len=1024)
    return params, opt, w


def test_price_keeps_the_fastest_placement_and_says_the_others(wide_gpt):
    params, opt, w = wide_gpt
    h100, fsdp = pt.tune.hardware("h100"), pt.Rules.preset("fsdp")
    c = Candidate((("fsdp", 16), ("data", 2)), "fsdp", remat="full")  # jax.make_mesh: fsdp across the 4 nodes
    r = price(params, opt, c, fsdp, w, h100, 80 * 2**30)
    assert r.fits and r.candidate.nodes == (("fsdp", 2), ("data", 2))  # half the gathers' bytes inside
    times = {tuple(n.items()): t for n, t in r.placements}
    assert list(times) == [(("fsdp", 2), ("data", 2)), (("fsdp", 4),)]  # the chosen first
    assert times[(("fsdp", 2), ("data", 2))] < 0.999 * times[(("fsdp", 4),)]
    assert r.analytic.step_time == pytest.approx(times[(("fsdp", 2), ("data", 2))])
    across = {x.label for x in r.analytic.comm if x.nodes > 1}
    assert across and all(set(a.split("+")) & {"fsdp", "data"} for a in across)
    assert r.candidate.label.endswith("nodes {fsdp: 2, data: 2}")
    assert "mesh.nodes={fsdp: 2, data: 2}" in r.candidate.overrides(fsdp, None)
    # Given the placement, it is priced as given (compiled candidates, --out configs).
    fixed = price(params, opt, Candidate(c.mesh, "fsdp", remat="full", nodes=(("fsdp", 4),)), fsdp, w, h100, 80 * 2**30)
    assert fixed.candidate.nodes == (("fsdp", 4),) and fixed.step_time == pytest.approx(times[(("fsdp", 4),)])
    # One node: nothing to place.
    one = price(params, opt, Candidate((("data", 1), ("fsdp", 8)), "fsdp", remat="full"), fsdp, w, h100, 80 * 2**30)
    assert one.candidate.nodes is None and one.placements == []
    assert "nodes" not in one.candidate.label and "mesh.nodes=null" in one.candidate.overrides(fsdp, None)


def test_the_default_placement_stays_unless_another_is_faster_by_a_tenth_of_a_percent(gpt_state, gpt_workload):
    _, params, opt = gpt_state  # a tiny model on the links' peaks and their fixed latency: the placements tie
    c = Candidate((("fsdp", 16), ("data", 2)), "fsdp")
    peaks = dataclasses.replace(pt.tune.hardware("h100"), links=())
    r = price(params, opt, c, pt.Rules.preset("fsdp"), gpt_workload, peaks, 2**30)
    times = {tuple(n.items()): t for n, t in r.placements}
    assert r.candidate.nodes == (("fsdp", 4),) and min(times.values()) > 0.999 * times[(("fsdp", 4),)]


def test_tune_out_writes_the_nodes_it_chose(write, tmp_path, run_cli_in_process):
    hw = write(
        "two_nodes.yaml",
        "name: small-nodes\npeak_flops: 1.0e14\nmemory: 16GiB\nmemory_bandwidth: 1.0e12\ntopology: nodes\n"
        "node_size: 4\nlink_bandwidth: 2.0e11\nnetwork_bandwidth: 1.0e10\n",
    )
    cfg = write(
        "run.yaml",
        "model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 2}\n"
        "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\ntrain: {steps: 2, batch_size: 8, seq_len: 16}\n",
    )
    out = tmp_path / "best.yaml"
    r = run_cli_in_process("tune", cfg, "--hardware", hw, "--compile", "0", "--rules", "fsdp", "--out", out)
    assert r.returncode == 0, r.stderr
    best = next(line for line in r.stdout.splitlines() if line.startswith("best: "))
    written = yaml.safe_load(out.read_text())
    nodes = written["mesh"]["nodes"]
    assert nodes and math.prod(nodes.values()) == 2  # 8 devices on 2 nodes of 4
    assert f"nodes {{{', '.join(f'{a}: {n}' for a, n in nodes.items())}}}" in best
    assert any(line.startswith("  nodes: {") and "on 2 nodes of 4 devices" in line for line in r.stdout.splitlines())
    cfg = pt.load_config(out)  # and it is a config check and train accept
    assert cfg.mesh.nodes == nodes
