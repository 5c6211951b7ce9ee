"""The plan (partitioning.plan.plan): the eval_shape table, exact sizes at scale, totals, warnings, JSON."""

import math
import warnings

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.config import load_config
from partitioning.config.planning import plan_from_config as plan_for_config
from partitioning.layout import path_str
from partitioning.mesh import make_mesh
from partitioning.plan.compiled import normalize_spec
from partitioning.plan.plan import IdleAxis
from partitioning.train import Trainer

# -- exact sizes at scale (eval_shape only: cheap) --------------------------------------


def _bytes_from_specs(layouts, sizes):
    """Per-device bytes recomputed from shapes and specs, independently of LeafLayout."""
    total = 0
    for leaf in layouts:
        n = 1
        for i, s in enumerate(leaf.shape):
            entry = leaf.spec[i] if i < len(leaf.spec) else None
            axes = () if entry is None else ((entry,) if isinstance(entry, str) else entry)
            shards = math.prod(sizes[a] for a in axes)
            assert s % shards == 0, (leaf.path, i)
            n *= s // shards
        total += n * np.dtype(leaf.dtype).itemsize
    return total


@pytest.mark.parametrize(
    "name, devices, n_params, norms, sharded_over",
    [
        ("llama3_70b", 2048, 70_553_706_496, 80 * 2 * 8192 + 8192, 2048),
        ("llama3_405b", 16384, 405_853_388_800, 126 * 2 * 16384 + 16384, 2048),
    ],
)
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


def test_table_bytes_equal_real_shards_on_8_devices(make_gpt, make_plan, batch_size, seq_len):
    model = make_gpt(kv_heads=2)
    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    tx = optax.adamw(1e-3)
    p = make_plan(model, dict(mesh.shape), "fsdp_tp", tx=tx)
    trainer = Trainer(model, tx, mesh, "fsdp_tp", batch_size=batch_size, seq_len=seq_len)
    state = trainer.init(jax.random.key(0))
    rows = {leaf.path: leaf for leaf in p.params + p.opt_state}
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


def test_replicated_large_matrix_is_warned(make_plan, make_mlp):
    rules = pt.Rules([("batch", "fsdp"), ("vocab", "fsdp")])  # nothing shards the mlp matrices
    p = make_plan(make_mlp(), {"fsdp": 8}, rules)
    top = p.replicated[0]
    assert top.path in ("params/wi_0", "params/wo_0", "params/wi_1", "params/wo_1")
    assert top.shape in ((32, 256), (256, 32))
    per = 32 * 256 * 4
    assert top.per_device_cost == 4 * per  # param + gradient + adam mu + nu
    assert top.share == pytest.approx(4 * per / p.totals["total"]["per_device"])
    assert len(p.replicated) == 4
    msgs = [m for m in p.warnings() if m.startswith("replicated: ")]
    assert len(msgs) == 4
    assert "is whole on every device: 128.00 KiB per device" in msgs[0]
    assert f"({top.share:.1%} of per-device memory)" in msgs[0]
    assert p.replicated_share == pytest.approx(16 * per / p.totals["total"]["per_device"], rel=1e-3)


def test_fully_sharded_layout_has_no_replication_warning(make_plan, make_mlp):
    p = make_plan(make_mlp(), {"fsdp": 8}, pt.Rules([("batch", "fsdp"), ("embed", "fsdp")]))
    assert p.replicated == []
    assert not [m for m in p.warnings() if m.startswith("replicated")]
    assert p.replicated_share == pytest.approx(0.0, abs=1e-3)  # only adam's count scalar


def test_uncovered_names_and_unused_rules(make_plan, make_mlp):
    rules = pt.Rules([("batch", "data"), ("heads", "tensor"), ("vocab", "tensor")])
    p = make_plan(make_mlp(), {"data": 2, "tensor": 4}, rules)
    assert p.uncovered_names == ["embed", "length", "mlp"]
    assert [u.index for u in p.unused_rules] == [1]
    assert p.idle_axes == [IdleAxis("data", 2, False)]
    assert (
        "mesh axis 'data' (size 2) shards no parameter: params, gradients and optimizer state are replicated 2x "
        "across it" in p.warnings()
    )
    assert "rule 1 [heads, tensor] never claims a dimension of any parameter or activation (rules[1])" in p.warnings()
    # 'batch' only names activations: it fires through the forward pass
    assert 0 not in [u.index for u in p.unused_rules]


def test_indivisible_dimension_is_reported_not_raised(make_gpt, make_plan):
    model = make_gpt(mlp=102)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = make_plan(model, {"data": 1, "fsdp": 1, "tensor": 4}, "fsdp_tp")
    # One line per failure, naming each parameter once (its optimizer moments mu and nu fail with it).
    assert (
        p.errors
        == p.indivisible
        == [
            "params/blocks/mlp/wi_0, params/blocks/mlp/wi_1: dim 2 ('mlp', size 102) is not divisible by mesh axes "
            "('tensor',) of size 4 (presets/fsdp_tp.yaml:13: rules[4])",
            "params/blocks/mlp/wo: dim 1 ('mlp', size 102) is not divisible by mesh axes ('tensor',) of size 4 "
            "(presets/fsdp_tp.yaml:13: rules[4])",
        ]
    )
    assert "error: " + p.errors[0] + "; change the rule or the size, or set on_indivisible: replicate" in p.warnings()
    row = next(leaf for leaf in p.params if leaf.path == "params/blocks/mlp/wi_0")
    assert row.spec == P(None, "fsdp", None)  # mlp fell back to unsharded (fsdp has size 1)
    relaxed = make_plan(model, {"data": 1, "fsdp": 1, "tensor": 4}, "fsdp_tp", on_indivisible="replicate")
    assert relaxed.errors == [] and relaxed.indivisible == p.indivisible


def test_plan_json_keys(make_plan, make_mlp):
    j = make_plan(make_mlp(), {"data": 1, "fsdp": 8}, "fsdp").to_json()
    assert set(j) >= {
        "mesh",
        "devices",
        "rules",
        "parameters",
        "leaves",
        "optimizer_leaves",
        "totals",
        "memory_kinds",
        "replicated_share",
        "warnings",
        "errors",
    }
    assert set(j["totals"]) == {"params", "optimizer", "gradients", "total", "trainable", "frozen"}
    assert all(set(v) == {"per_device", "total", "ideal"} for v in j["totals"].values())
    kinds = j["memory_kinds"]
    assert kinds["device"]["per_device"] == j["totals"]["total"]["per_device"] and kinds["host"] == {"per_device": 0}
    assert j["totals"]["trainable"] == j["totals"]["params"] and j["totals"]["frozen"]["total"] == 0
    assert set(j["totals"]["params"]) == {"per_device", "total", "ideal"}
    assert set(j["warnings"]) == {
        "replicated",
        "uncovered_names",
        "unused_rules",
        "indivisible",
        "idle_axes",
        "messages",
    }
    row = next(r for r in j["leaves"] if r["path"] == "params/wi_0")
    assert row == {
        "path": "params/wi_0",
        "shape": [32, 256],
        "dtype": "float32",
        "logical": ["embed", "mlp"],
        "spec": "P('fsdp', None)",
        "claimed_by": [{"rule": 1, "logical": "embed", "mesh_axes": "fsdp"}, None],
        "per_device_bytes": 4 * 256 * 4,
        "total_bytes": 32 * 256 * 4,
        "replicated": False,
        "named_by": None,
        "memory_kind": "device",
    }


def test_zero1_optimizer_rules_shard_only_the_optimizer_state(make_plan, make_mlp):
    rules = pt.Rules([("batch", "data")])
    p = make_plan(make_mlp(), {"data": 8}, rules, optimizer_rules=pt.Rules([("embed", "data")]))
    t = p.totals
    assert t["params"]["per_device"] == t["params"]["total"]
    assert t["optimizer"]["per_device"] < t["optimizer"]["total"] / 7  # mu, nu split 8 ways (+ count)
    assert p.idle_axes == [IdleAxis("data", 8, True)]
    assert (
        "mesh axis 'data' (size 8) shards no parameter: params and gradients (the optimizer state is "
        "sharded over it) are replicated 8x across it"
    ) in p.warnings()
    # the replicated warning counts the param and its gradient, not the (sharded) moments
    assert p.replicated[0].per_device_cost == 2 * 32 * 256 * 4
