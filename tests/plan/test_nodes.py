"""Across nodes (partitioning.plan.axes, plan.compiled): which mesh axes and which collectives of a compiled step
cross nodes, and their bytes; what `plan --json` says of it."""

import json

import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.mesh import node_ids
from partitioning.plan.axes import group_nodes, node_layout, nodes_by_axis
from partitioning.plan.compiled import across_nodes
from partitioning.plan.hlo import collectives

SIZES = {"data": 2, "fsdp": 4}


def test_node_ids_follow_the_hybrid_layout_and_each_axis_says_its_nodes():
    assert node_ids({"data": 4, "fsdp": 8}, {"data": 2, "fsdp": 2})[:, ::4].tolist() == [[0, 1], [0, 1], [2, 3], [2, 3]]
    ids = node_ids({"stage": 2, "data": 2, "tensor": 2}, {"stage": 2})
    assert nodes_by_axis(ids, ["stage", "data", "tensor"]) == {"stage": 2, "data": 1, "tensor": 1}
    assert node_layout({"data": 4, "fsdp": 8}, {"fsdp": 4, "data": 1}) == {
        "count": 4,
        "per_node": 8,
        "split": {"fsdp": 4},
        "axes": {"data": 1, "fsdp": 4},
    }
    built = np.array([[0, 0, 1, 1], [0, 0, 1, 1]])  # each device's process, as a built mesh has it
    assert node_layout(SIZES, ids=built) == node_layout(SIZES, {"fsdp": 2})


@pytest.mark.parametrize(
    "text, permute, expected",
    [
        ("[2,4]<=[8]", False, (1, 0.0)),  # over fsdp: rows 0-3 and 4-7, each on one node of {data: 2}
        ("[4,2]<=[2,4]T(1,0)", False, (2, 1.0)),  # over data: 0 with 4, ...
        ("{}", False, (2, 1.0)),
        ("{{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}", True, (1, 0.0)),  # a ring inside each row
        ("{{0,4},{4,0},{1,2}}", True, (2, 2 / 3)),
    ],
)
def test_how_many_nodes_a_group_spans_and_how_much_crosses(text, permute, expected):
    assert group_nodes(text, node_ids(SIZES, {"data": 2}).reshape(-1), permute=permute) == pytest.approx(expected)


@pytest.fixture(scope="module")
def step(make_gpt):
    """One compiled FSDP train step on {data: 2, fsdp: 4}: its collectives (with their device groups)."""
    mesh = pt.make_mesh(SIZES)
    trainer = pt.Trainer(make_gpt(), optax.adamw(1e-3), mesh, "fsdp", batch_size=8, seq_len=16)
    return trainer, collectives(trainer.lower_train_step().compile().as_text())


def _crossing(ops, nodes):
    records = [op.to_json() for op in ops]
    out = across_nodes(ops, records, node_ids(SIZES, nodes), list(SIZES))
    return out, records


def test_data_across_nodes_keeps_the_fsdp_gathers_inside(step):
    _, ops = step
    out, records = _crossing(ops, {"data": 2})
    assert out["nodes"] == {"count": 2, "axes": {"data": 2, "fsdp": 1}}
    by_axes = {(r["kind"], r["axes"]): r["nodes"] for r in records}
    assert by_axes[("all-gather", "fsdp")] == 1 and by_axes[("all-reduce", "data")] == 2
    crossing = [r for r in records if r["nodes"] > 1]
    assert crossing and all("data" in r["axes"] for r in crossing)
    assert all(r["across_bytes"] == (r["bytes"] if r["nodes"] > 1 else 0) for r in records)
    for kind, total in out["across_nodes"].items():
        assert total["bytes"] == sum(r["executions"] * r["across_bytes"] for r in records if r["kind"] == kind)
    assert out["across_nodes"]["all-gather"] == {"count": 0, "bytes": 0}

    # FSDP across nodes instead: every weight gather crosses, the data all-reduce stays inside.
    out, records = _crossing(ops, {"fsdp": 2})
    gathers = [r for r in records if r["kind"] == "all-gather"]
    assert gathers and all(r["nodes"] == 2 for r in gathers)
    assert all(r["nodes"] == 1 for r in records if r["axes"] == "data")
    assert out["across_nodes"]["all-gather"]["bytes"] == sum(r["executions"] * r["bytes"] for r in gathers)


def test_the_compiled_view_says_it_when_given_the_nodes(step):
    trainer, ops = step
    view = pt.plan.compiled_view(trainer.lower_train_step, nodes={"data": 2})
    assert view["nodes"] == {"count": 2, "axes": {"data": 2, "fsdp": 1}}
    expected, _ = _crossing(ops, {"data": 2})
    assert view["across_nodes"] == expected["across_nodes"]
    assert {"nodes", "across_bytes", "axes"} <= set(view["collective_ops"][0])
    assert "nodes" not in pt.plan.compiled_view(trainer.lower_train_step)  # one process, no nodes: nothing


def test_plan_json_and_table_say_what_crosses(write, run_cli_in_process, tmp_path):
    cfg = write(
        "run.yaml",
        "model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 2}\n"
        "mesh: {shape: {data: 2, fsdp: 4}, nodes: {data: 2}}\nrules: fsdp\n"
        "train: {steps: 2, batch_size: 8, seq_len: 16}\n",
    )
    r = run_cli_in_process("plan", cfg, "--json", tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "nodes: 2 x 4 devices (mesh.nodes {data: 2}); across nodes: data (2 nodes); inside one node: fsdp" in lines
    assert "collectives per step (per device): which cross nodes" in lines
    report = json.loads((tmp_path / "plan.json").read_text())
    assert report["nodes"] == {"count": 2, "per_node": 4, "split": {"data": 2}, "axes": {"data": 2, "fsdp": 1}}
    view = report["compiled"]
    total = sum(v["bytes"] for v in view["across_nodes"].values())
    every = sum(c["executions"] * c["bytes"] for c in view["collective_ops"])
    assert next(x for x in lines if x.startswith("across nodes: ")).endswith(f"({total / every:.1%})")
    assert all(c["nodes"] == (2 if "data" in c["axes"] else 1) for c in view["collective_ops"])
