"""The compiled view (partitioning.plan.compiled): a collective exactly when the layout needs one, and the
self-check of compiled shardings against the rules."""

import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.mesh import make_mesh
from partitioning.plan import hlo
from partitioning.plan.compiled import compiled_view
from partitioning.train import Trainer


@pytest.fixture
def view(make_plan, batch_size, seq_len):
    """view(model, mesh shape, rules) -> (plan, compiled view of the sgd train step, checked against the plan)."""

    def _view(model, mesh_shape, rules):
        mesh = make_mesh(mesh_shape)
        tx = optax.sgd(0.1)
        trainer = Trainer(model, tx, mesh, rules, batch_size=batch_size, seq_len=seq_len)
        p = make_plan(model, dict(mesh.shape), rules, tx=tx)
        return p, compiled_view(
            trainer.lower_train_step,
            expected=p.expected_specs(),
            input_names=("", "batch"),
            output_names=("", "metrics"),
        )

    return _view


def _counts(compiled):
    return {k: v["count"] for k, v in compiled["collectives"].items()}


def test_replicated_everything_needs_no_collective(view, make_mlp):
    _, v = view(make_mlp(), {"data": 8}, pt.Rules([("batch", None)]))
    assert _counts(v) == dict.fromkeys(hlo.KINDS, 0)


def test_dp_gives_gradient_all_reduce_only(view, make_mlp):
    p, v = view(make_mlp(), {"data": 8}, "dp")
    c = _counts(v)
    assert c["all-reduce"] >= 1 and c["all-gather"] == 0 and c["reduce-scatter"] == 0
    # every gradient is summed over the data axis: at least the params' bytes
    assert v["collectives"]["all-reduce"]["bytes"] >= p.totals["params"]["total"]
    assert v["sharding_check"]["mismatches"] == []
    assert v["sharding_check"]["checked"] >= len(p.params)


def test_fsdp_gives_all_gather_and_reduce_scatter(view, make_mlp):
    p, v = view(make_mlp(), {"fsdp": 8}, pt.Rules([("batch", "fsdp"), ("embed", "fsdp")]))
    c = _counts(v)
    assert c["all-gather"] >= 1 and c["reduce-scatter"] >= 1
    # each MLP matrix is gathered whole before use, and its gradient reduce-scattered
    mats = ["f32[32,256]", "f32[32,256]", "f32[256,32]", "f32[256,32]"]
    gathered = [s for o in v["collective_ops"] if o["kind"] == "all-gather" for s in o["shapes"]]
    scattered = [s for o in v["collective_ops"] if o["kind"] == "reduce-scatter" for s in o["shapes"]]
    for shapes in (gathered, scattered):
        assert sorted(s for s in shapes if s in mats) == sorted(mats)
    assert all(o["group_size"] == 8 for o in v["collective_ops"] if o["kind"] == "reduce-scatter")


def test_tp_mlp_gives_activation_all_reduce_without_weight_movement(view, make_mlp, batch_size, seq_len):
    # batch replicated (no data axis > 1): no gradient reduction, no weight gathers
    p, v = view(make_mlp(), {"data": 1, "tensor": 8}, pt.Rules([("batch", "data"), ("mlp", "tensor")]))
    c = _counts(v)
    assert c["all-reduce"] >= 2  # the row-parallel wo in forward and backward
    assert c["all-gather"] == 0 and c["reduce-scatter"] == 0
    ar = [o for o in v["collective_ops"] if o["kind"] == "all-reduce" and o["bytes"] == batch_size * seq_len * 32 * 4]
    assert ar, "expected an all-reduce of a (batch, length, embed) activation"


def test_self_check_reports_a_difference_by_path(make_mlp, make_plan, batch_size, seq_len):
    model = make_mlp()
    mesh = make_mesh({"fsdp": 8})
    rules = pt.Rules([("batch", "fsdp"), ("embed", "fsdp")])
    trainer = Trainer(model, optax.sgd(0.1), mesh, rules, batch_size=batch_size, seq_len=seq_len)
    p = make_plan(model, {"fsdp": 8}, rules, tx=optax.sgd(0.1))
    expected = p.expected_specs() | {"params/wi_0": P(None, "fsdp")}
    v = compiled_view(
        trainer.lower_train_step, expected=expected, input_names=("", "batch"), output_names=("", "metrics")
    )
    diffs = {(d["side"], d["path"]): d for d in v["sharding_check"]["mismatches"]}
    assert set(diffs) == {("input", "params/wi_0"), ("output", "params/wi_0")}
    assert diffs[("input", "params/wi_0")]["expected"] == "P(None, 'fsdp')"
    assert diffs[("input", "params/wi_0")]["compiled"] == "P('fsdp', None)"
