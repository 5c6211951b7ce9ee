"""The plan (eval_shape table, totals, warnings), the HLO collective parser and the compiled view."""

import math
import warnings

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.plan import hlo
from partitioning.plan.compiled import compiled_view, normalize_spec
from partitioning.config import load_config
from partitioning.mesh import make_mesh
from partitioning.config.build import plan_from_config as plan_for_config
from partitioning.plan import activation_names, build_plan
from partitioning.plan.plan import IdleAxis
from partitioning.train.state import abstract_train_state
from partitioning.layout import path_str
from partitioning.train import Trainer

B, T = 8, 16


def mlp(**kw):
    return pt.build_model("mlp", **({"vocab_size": 64, "embed": 32, "mlp": 256, "layers": 2} | kw))


def gpt(**kw):
    return pt.build_model("gpt", **({"vocab_size": 64, "embed": 32, "heads": 4, "mlp": 64, "layers": 2} | kw))


def plan(model, sizes, rules, tx=None, **kw):
    params, opt = abstract_train_state(model, tx or optax.adamw(1e-3), batch_size=B, seq_len=T)
    acts = activation_names(model, params, sizes, rules, batch_size=B, seq_len=T)
    return build_plan(params, opt, sizes, rules, activations=acts, **kw)


# -- exact sizes at scale (eval_shape only: cheap) --------------------------------------

def _bytes_from_specs(layouts, sizes):
    """Per-device bytes recomputed from shapes and specs, independently of LeafLayout."""
    total = 0
    for l in layouts:
        n = 1
        for i, s in enumerate(l.shape):
            entry = l.spec[i] if i < len(l.spec) else None
            axes = () if entry is None else ((entry,) if isinstance(entry, str) else entry)
            shards = math.prod(sizes[a] for a in axes)
            assert s % shards == 0, (l.path, i)
            n *= s // shards
        total += n * np.dtype(l.dtype).itemsize
    return total


@pytest.mark.parametrize("name, devices, n_params, norms, sharded_over", [
    ("llama3_70b", 2048, 70_553_706_496, 80 * 2 * 8192 + 8192, 2048),
    ("llama3_405b", 16384, 405_853_388_800, 126 * 2 * 16384 + 16384, 2048),
])
def test_llama_parameter_counts_and_per_device_bytes(repo, name, devices, n_params, norms, sharded_over):
    cfg = load_config(repo / "configs" / f"{name}.yaml")
    p, _ = plan_for_config(cfg, devices)
    assert p.devices == devices
    assert p.num_params == n_params
    # f32 params: every matrix is split over fsdp x tensor (256 x 8), the norm
    # scales (embed only) over fsdp; the data axis (8 on 16384 devices) replicates.
    assert (n_params - norms) % sharded_over == 0
    expect = 4 * ((n_params - norms) // sharded_over + norms // 256)
    assert p.totals["params"]["per_device"] == expect == _bytes_from_specs(p.params, p.mesh)
    assert p.totals["gradients"]["per_device"] == expect
    # adamw: two f32 moments per param, plus a few replicated scalars
    assert 2 * expect <= p.totals["optimizer"]["per_device"] <= 2 * expect + 64
    assert p.errors == [] and p.replicated == []
    idle = [IdleAxis("data", 8, False)] if devices == 16384 else []
    assert p.idle_axes == idle
    assert p.totals["total"]["per_device"] / p.totals["total"]["ideal"] == pytest.approx(devices / 2048, rel=1e-3)


# -- the table against a real sharded state --------------------------------------------------

def test_table_bytes_equal_real_shards_on_8_devices():
    model = gpt(kv_heads=2)
    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    tx = optax.adamw(1e-3)
    p = plan(model, dict(mesh.shape), "fsdp_tp", tx=tx)
    trainer = Trainer(model, tx, mesh, "fsdp_tp", batch_size=B, seq_len=T)
    state = trainer.init(jax.random.key(0))
    rows = {l.path: l for l in p.params + p.opt_state}
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    per_device = {d: 0 for d in mesh.devices.flat}
    seen = set()
    for kp, arr in leaves:
        path = path_str(kp)
        if path == "step":
            continue
        seen.add(path)
        shard_bytes = {s.device: s.data.nbytes for s in arr.addressable_shards}
        assert set(shard_bytes.values()) == {rows[path].per_device_bytes}, path
        assert normalize_spec(arr.sharding.spec, dict(mesh.shape)) == normalize_spec(rows[path].spec, dict(mesh.shape))
        for d, n in shard_bytes.items():
            per_device[d] += n
    assert seen == set(rows)
    want = p.totals["params"]["per_device"] + p.totals["optimizer"]["per_device"]
    assert set(per_device.values()) == {want}


# -- warnings -------------------------------------------------------------------------------

def test_replicated_large_matrix_is_warned():
    rules = pt.Rules([("batch", "fsdp"), ("vocab", "fsdp")])   # nothing shards the mlp matrices
    p = plan(mlp(), {"fsdp": 8}, rules)
    top = p.replicated[0]
    assert top.path in ("params/wi_0", "params/wo_0", "params/wi_1", "params/wo_1")
    assert top.shape in ((32, 256), (256, 32))
    per = 32 * 256 * 4
    assert top.per_device_cost == 4 * per          # param + gradient + adam mu + nu
    assert top.share == pytest.approx(4 * per / p.totals["total"]["per_device"])
    assert len(p.replicated) == 4
    msgs = [m for m in p.warnings() if m.startswith("replicated: ")]
    assert len(msgs) == 4
    assert "is whole on every device: 128.00 KiB per device" in msgs[0]
    assert f"({top.share:.1%} of per-device memory)" in msgs[0]
    assert p.replicated_share == pytest.approx(16 * per / p.totals["total"]["per_device"], rel=1e-3)


def test_fully_sharded_layout_has_no_replication_warning():
    p = plan(mlp(), {"fsdp": 8}, pt.Rules([("batch", "fsdp"), ("embed", "fsdp")]))
    assert p.replicated == []
    assert not [m for m in p.warnings() if m.startswith("replicated")]
    assert p.replicated_share == pytest.approx(0.0, abs=1e-3)   # only adam's count scalar


def test_uncovered_names_and_unused_rules():
    rules = pt.Rules([("batch", "data"), ("heads", "tensor"), ("vocab", "tensor")])
    p = plan(mlp(), {"data": 2, "tensor": 4}, rules)
    assert p.uncovered_names == ["embed", "length", "mlp"]
    assert [u.index for u in p.unused_rules] == [1]
    assert p.idle_axes == [IdleAxis("data", 2, False)]
    assert "mesh axis 'data' (size 2) shards no parameter: params, gradients and optimizer state are replicated 2x across it" in p.warnings()
    assert "rule 1 ['heads', 'tensor'] never claims a dimension of any parameter or activation (rules[1])" in p.warnings()
    # 'batch' only names activations: it fires through the forward pass
    assert 0 not in [u.index for u in p.unused_rules]


def test_indivisible_dimension_is_reported_not_raised():
    model = gpt(mlp=102)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = plan(model, {"data": 1, "fsdp": 1, "tensor": 4}, "fsdp_tp")
    msg = "params/blocks/mlp/wi_0: dim 2 ('mlp', size 102) is not divisible by mesh axes ('tensor',) of size 4"
    assert any(m.startswith(msg) for m in p.indivisible)
    assert any(m.startswith("error: " + msg) for m in p.warnings())
    assert [e.split(":")[0] for e in p.errors] == [
        "params/blocks/mlp/wi_0", "params/blocks/mlp/wi_1", "params/blocks/mlp/wo",
        "opt_state/0/mu/blocks/mlp/wi_0", "opt_state/0/mu/blocks/mlp/wi_1", "opt_state/0/mu/blocks/mlp/wo",
        "opt_state/0/nu/blocks/mlp/wi_0", "opt_state/0/nu/blocks/mlp/wi_1", "opt_state/0/nu/blocks/mlp/wo"]
    row = next(l for l in p.params if l.path == "params/blocks/mlp/wi_0")
    assert row.spec == P(None, "fsdp", None)        # mlp fell back to unsharded (fsdp has size 1)
    relaxed = plan(model, {"data": 1, "fsdp": 1, "tensor": 4}, "fsdp_tp", on_indivisible="replicate")
    assert relaxed.errors == [] and relaxed.indivisible == p.indivisible


def test_plan_json_keys():
    j = plan(mlp(), {"data": 1, "fsdp": 8}, "fsdp").to_json()
    assert set(j) >= {"mesh", "devices", "rules", "parameters", "leaves", "optimizer_leaves", "totals",
                      "replicated_share", "warnings", "errors"}
    assert set(j["totals"]) == {"params", "optimizer", "gradients", "total"}
    assert set(j["totals"]["params"]) == {"per_device", "total", "ideal"}
    assert set(j["warnings"]) == {"replicated", "uncovered_names", "unused_rules", "indivisible", "idle_axes",
                                  "messages"}
    row = next(r for r in j["leaves"] if r["path"] == "params/wi_0")
    assert row == {"path": "params/wi_0", "shape": [32, 256], "dtype": "float32", "logical": ["embed", "mlp"],
                   "spec": "P('fsdp', None)", "claimed_by": [{"rule": 1, "logical": "embed", "mesh_axes": "fsdp"}, None],
                   "per_device_bytes": 4 * 256 * 4, "total_bytes": 32 * 256 * 4, "replicated": False}


# -- HLO parser ----------------------------------------------------------------------------

HLO = """\
HloModule jit_step, is_scheduled=true, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}

%slice_fusion (param_0: f32[64,32], param_1: s32[]) -> f32[8,32] {
  %param_0 = f32[64,32]{1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %c = s32[] constant(0)
  %conv = f32[64,32]{1,0} convert(%param_0)
  ROOT %ds = f32[8,32]{1,0} dynamic-slice(%conv, %param_1, %c), dynamic_slice_sizes={8,32}
}

%body (p: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %p = (s32[], f32[8,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = f32[8,32]{1,0} get-tuple-element(%p), index=1
  %ag = f32[64,32]{1,0} all-gather(%w), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %ar = (f32[64,32]{1,0}, f32[4]{0}) all-reduce(%ag, %ag), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %g0 = f32[64,32]{1,0} get-tuple-element(%ar), index=0
  %g1 = f32[4]{0} get-tuple-element(%ar), index=1
  %f = f32[8,32]{1,0} fusion(%g0, %i), kind=kLoop, calls=%slice_fusion
  ROOT %t = (s32[], f32[8,32]{1,0}) tuple(%i, %f)
}

%cond (p: (s32[], f32[8,32])) -> pred[] {
  %p = (s32[], f32[8,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8,32]) -> f32[8,32] {
  %x = f32[8,32]{1,0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[8,32]{1,0}) tuple(%z, %x)
  %loop = (s32[], f32[8,32]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %cp = bf16[16,2]{1,0} collective-permute(%x), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %a2a = f32[8,32]{1,0} all-to-all(%x), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}
  ROOT %out = f32[8,32]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_hlo_collectives_counts_bytes_and_trip_counts():
    ops = {(c.name, c.kind): c for c in hlo.collectives(HLO)}
    ag = ops[("ag", "all-gather")]
    assert (ag.bytes, ag.group_size, ag.executions) == (64 * 32 * 4, 8, 5)
    rs = ops[("ar", "reduce-scatter")]          # element 0 is only ever sliced
    assert (rs.hlo_op, rs.bytes, rs.shapes, rs.executions) == ("all-reduce+dynamic-slice", 64 * 32 * 4, ("f32[64,32]",), 5)
    ar = ops[("ar", "all-reduce")]              # element 1 is used whole (here: unused)
    assert (ar.bytes, ar.group_size) == (16, 8)
    assert ops[("a2a", "all-to-all")].group_size == 4
    assert ops[("cp", "collective-permute")].bytes == 16 * 2 * 2
    s = hlo.summarize(hlo.collectives(HLO))
    assert s == {"all-gather": {"count": 5, "bytes": 5 * 8192}, "reduce-scatter": {"count": 5, "bytes": 5 * 8192},
                 "all-reduce": {"count": 5, "bytes": 5 * 16}, "all-to-all": {"count": 1, "bytes": 1024},
                 "collective-permute": {"count": 1, "bytes": 64}}


# -- the compiled view: a collective exactly when the layout needs one ----------------------

def _view(model, mesh_shape, rules, batch=B):
    mesh = make_mesh(mesh_shape)
    tx = optax.sgd(0.1)
    trainer = Trainer(model, tx, mesh, rules, batch_size=batch, seq_len=T)
    p = plan(model, dict(mesh.shape), rules, tx=tx)
    return p, compiled_view(trainer.lower_train_step, expected=p.expected_specs(),
                            input_names=("", "batch"), output_names=("", "metrics"))


def _counts(view):
    return {k: v["count"] for k, v in view["collectives"].items()}


def test_replicated_everything_needs_no_collective():
    _, v = _view(mlp(), {"data": 8}, pt.Rules([("batch", None)]))
    assert _counts(v) == dict.fromkeys(hlo.KINDS, 0)


def test_dp_gives_gradient_all_reduce_only():
    p, v = _view(mlp(), {"data": 8}, "dp")
    c = _counts(v)
    assert c["all-reduce"] >= 1 and c["all-gather"] == 0 and c["reduce-scatter"] == 0
    # every gradient is summed over the data axis: at least the params' bytes
    assert v["collectives"]["all-reduce"]["bytes"] >= p.totals["params"]["total"]
    assert v["sharding_check"]["mismatches"] == []
    assert v["sharding_check"]["checked"] >= len(p.params)


def test_fsdp_gives_all_gather_and_reduce_scatter():
    p, v = _view(mlp(), {"fsdp": 8}, pt.Rules([("batch", "fsdp"), ("embed", "fsdp")]))
    c = _counts(v)
    assert c["all-gather"] >= 1 and c["reduce-scatter"] >= 1
    # each MLP matrix is gathered whole before use, and its gradient reduce-scattered
    mats = ["f32[32,256]", "f32[32,256]", "f32[256,32]", "f32[256,32]"]
    gathered = [s for o in v["collective_ops"] if o["kind"] == "all-gather" for s in o["shapes"]]
    scattered = [s for o in v["collective_ops"] if o["kind"] == "reduce-scatter" for s in o["shapes"]]
    for shapes in (gathered, scattered):
        assert sorted(s for s in shapes if s in mats) == sorted(mats)
    assert all(o["group_size"] == 8 for o in v["collective_ops"] if o["kind"] == "reduce-scatter")


def test_tp_mlp_gives_activation_all_reduce_without_weight_movement():
    # batch replicated (no data axis > 1): no gradient reduction, no weight gathers
    p, v = _view(mlp(), {"data": 1, "tensor": 8}, pt.Rules([("batch", "data"), ("mlp", "tensor")]))
    c = _counts(v)
    assert c["all-reduce"] >= 2           # the row-parallel wo in forward and backward
    assert c["all-gather"] == 0 and c["reduce-scatter"] == 0
    ar = [o for o in v["collective_ops"] if o["kind"] == "all-reduce" and o["bytes"] == B * T * 32 * 4]
    assert ar, "expected an all-reduce of a (batch, length, embed) activation"


def test_self_check_reports_a_difference_by_path():
    model = mlp()
    mesh = make_mesh({"fsdp": 8})
    rules = pt.Rules([("batch", "fsdp"), ("embed", "fsdp")])
    trainer = Trainer(model, optax.sgd(0.1), mesh, rules, batch_size=B, seq_len=T)
    p = plan(model, {"fsdp": 8}, rules, tx=optax.sgd(0.1))
    expected = p.expected_specs() | {"params/wi_0": P(None, "fsdp")}
    v = compiled_view(trainer.lower_train_step, expected=expected, input_names=("", "batch"),
                      output_names=("", "metrics"))
    diffs = {(d["side"], d["path"]): d for d in v["sharding_check"]["mismatches"]}
    assert set(diffs) == {("input", "params/wi_0"), ("output", "params/wi_0")}
    assert diffs[("input", "params/wi_0")]["expected"] == "P(None, 'fsdp')"
    assert diffs[("input", "params/wi_0")]["compiled"] == "P('fsdp', None)"


def test_zero1_optimizer_rules_shard_only_the_optimizer_state():
    rules = pt.Rules([("batch", "data")])
    p = plan(mlp(), {"data": 8}, rules, optimizer_rules=pt.Rules([("embed", "data")]))
    t = p.totals
    assert t["params"]["per_device"] == t["params"]["total"]
    assert t["optimizer"]["per_device"] < t["optimizer"]["total"] / 7      # mu, nu split 8 ways (+ count)
    assert p.idle_axes == [IdleAxis("data", 8, True)]
    assert ("mesh axis 'data' (size 8) shards no parameter: params and gradients (the optimizer state is "
            "sharded over it) are replicated 8x across it") in p.warnings()
    # the replicated warning counts the param and its gradient, not the (sharded) moments
    assert p.replicated[0].per_device_cost == 2 * 32 * 256 * 4
