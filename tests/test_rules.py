"""Rule resolution: agreement with Flax, explain, validation, context."""

import contextlib
import random

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning import boxes
from partitioning.rules import Rules

MESH_AXES = ["data", "fsdp", "tensor", "seq", "expert"]
LOGICAL = ["batch", "length", "embed", "heads", "kv", "mlp", "vocab", "layers", "norule"]
UNCONSTRAINED = P.UNCONSTRAINED


def _random_axes(rng):
    k = rng.random()
    if k < 0.2:
        return None
    if k < 0.25:
        return UNCONSTRAINED
    if k < 0.6:
        return rng.choice(MESH_AXES)
    return tuple(rng.sample(MESH_AXES, rng.randint(1, 3)))


def _random_case(rng, pool=LOGICAL):
    # Rules draw from all names but "norule", with repeats (fallbacks).
    named = [n for n in pool if n != "norule"]
    rules = [(rng.choice(named), _random_axes(rng)) for _ in range(rng.randint(0, 10))]
    if rng.random() < 0.5:  # a name with several rules: later ones are fallbacks
        name = rng.choice(named)
        rules += [(name, _random_axes(rng)) for _ in range(rng.randint(1, 3))]
        rng.shuffle(rules)
    ndim = rng.randint(0, 5)
    names = rng.sample(pool, ndim)
    names = [None if k < 0.12 else UNCONSTRAINED if k < 0.16 else n for n, k in ((n, rng.random()) for n in names)]
    return rules, tuple(names)


def test_agrees_with_flax_on_random_tables():
    rng = random.Random(1234)
    n_cases = 3000
    for case in range(n_cases):
        rules, names = _random_case(rng)
        ours = pt.logical_to_mesh_axes(names, rules)
        theirs = nn.logical_to_mesh_axes(names, rules)
        assert ours == theirs, f"case {case}: rules={rules} names={names}: ours {ours} != flax {theirs}"
        # The Rules method and the free function are one engine.
        assert Rules(rules).resolve(names) == theirs


# -- under a mesh, with names that may be mesh axes --------------------------------


def _contract(rules, names, mesh_axes):
    """DESIGN.md's contract, written independently of the toolkit: Flax's own walk (the unpatched function),
    then a name no rule mentions that is a mesh axis fills a dimension the rules left unassigned, if that axis
    is free. Returns (spec entries, which dims stay unassigned)."""
    from partitioning.context import _flax_logical_to_mesh_axes as flax_walk

    raw = flax_walk(names, rules)
    unassigned = nn.spmd._unassigned_axis
    used = {a for e in raw if e is not unassigned for a in jax.tree.leaves(e) if isinstance(a, str)}
    mentioned = {r for r, _ in rules}
    out, open_dims = [], []
    for i, (n, e) in enumerate(zip(names, raw, strict=True)):
        if e is unassigned and mesh_axes and n not in mentioned and n in mesh_axes and n not in used:
            e = n
        if e is unassigned:
            open_dims.append(i)
            e = None
        out.append(e)
    return out, open_dims


MIXED = LOGICAL + MESH_AXES  # logical names and mesh-axis names, in rules and in arrays


def _nnx_spec(names):
    from flax import nnx

    v = nnx.Param(jnp.zeros(()), out_sharding=names, eager_sharding=False)
    return nnx.get_partition_spec({"w": v})["w"].get_value()


@contextlib.contextmanager
def _recording_constraints(module):
    """Swaps ``module._with_sharding_constraint`` for a recorder of the spec it is handed (cheaper than a mock)."""
    seen = []
    real = module._with_sharding_constraint
    module._with_sharding_constraint = lambda x, spec, mesh=None: seen.append(spec)
    try:
        yield seen
    finally:
        module._with_sharding_constraint = real


def _constraint_spec(fn, seen, x, names, **kw):
    """The spec ``fn`` hands its sharding-constraint primitive (None: ``x`` left untouched)."""
    seen.clear()
    fn(x, names, **kw)
    return seen[-1] if seen else None


@pytest.mark.parametrize("with_mesh", [False, True], ids=["no-mesh", "mesh"])
def test_agrees_with_flax_under_a_mesh_with_mesh_axis_names(with_mesh):
    rng = random.Random(2025 + with_mesh)
    mesh = jax.make_mesh((1, 2, 2, 2, 1), tuple(MESH_AXES), axis_types=(jax.sharding.AxisType.Auto,) * 5)
    arrays = [np.zeros((2,) * rank) for rank in range(6)]  # the recorder never touches them
    scalar = arrays[0]
    rf = nn.spmd.RulesFallback
    for case in range(2000):
        rules, names = _random_case(rng, MIXED)
        table = Rules(rules)
        entries, open_dims = _contract(rules, names, MESH_AXES if with_mesh else ())
        want = P(*entries)
        where = f"case {case}: rules={rules} names={names}"
        with contextlib.ExitStack() as stack:
            if with_mesh:
                stack.enter_context(jax.set_mesh(mesh))
            stack.enter_context(pt.axis_rules(table))
            assert pt.logical_to_mesh_axes(names) == want, where
            assert pt.logical_to_mesh_axes(names, rules) == want, where
            assert nn.logical_to_mesh_axes(names) == want, where  # Flax's own function, inside the toolkit's context
            assert nn.logical_to_mesh_axes(names, rules) == want, where  # ...with the table passed as Flax takes it
            box = nn.LogicallyPartitioned(scalar, names)
            assert nn.logical_to_mesh(nn.get_partition_spec({"w": box}))["w"] == want, where
            if case % 4:
                continue  # NNX and the constraint paths on a quarter of the cases: the same walk, more machinery
            # (NNX reads an empty table as "no rules" and passes names through: Flax's behaviour, left alone.)
            if rules and names and all(isinstance(n, str) or n is None for n in names):
                assert _nnx_spec(names) == want, where
            xs = arrays[len(names)]
            for fn, module in ((nn.with_logical_constraint, nn.spmd), (pt.with_logical_constraint, boxes)):
                with _recording_constraints(module) as seen:
                    if not rules:  # no table: a constraint is the identity in both
                        assert _constraint_spec(fn, seen, xs, names) is None, where
                        continue
                    assert _constraint_spec(fn, seen, xs, names) == want, where
                    no_constraint = _constraint_spec(fn, seen, xs, names, fallback=rf.NO_CONSTRAINT)
                    assert no_constraint == (None if open_dims else want), where
                    if open_dims:
                        with pytest.raises(ValueError):
                            fn(xs, names, fallback=rf.RAISE_ERROR)
                    else:
                        assert _constraint_spec(fn, seen, xs, names, fallback=rf.RAISE_ERROR) == want, where


def test_flax_worked_example():
    rules = (("batch", "X"), ("features", "X"), ("heads", "Y"), ("batch", "Z"))
    names = ("batch", "length", "heads", "features")
    assert pt.logical_to_mesh_axes(names, rules) == P("X", None, "Y", None)


def test_none_rule_claims_dimension_unsharded_and_blocks_fallbacks():
    rules = Rules([("mlp", None), ("mlp", "tensor")])
    assert rules.resolve(("embed", "mlp")) == P(None, None)
    [_, d] = rules.explain(("embed", "mlp"))
    assert d.rule_index == 0 and d.mesh_axes is None
    assert "skipped rule 1 [mlp, tensor]: dim 1 already claimed by rule 0" in d.notes


def test_fallback_when_axis_is_taken():
    rules = Rules([("embed", "fsdp"), ("mlp", "fsdp"), ("mlp", "tensor")])
    assert rules.resolve(("embed", "mlp")) == P("fsdp", "tensor")
    assert rules.resolve(("mlp",)) == P("fsdp")


def test_explain_names_the_blocking_dimension():
    dims = Rules([("embed", "fsdp"), ("mlp", "fsdp")]).explain(("embed", "mlp"))
    assert str(dims[0]) == "dim 0 'embed' -> 'fsdp' by rule 0 [embed, fsdp]"
    assert str(dims[1]) == (
        "dim 1 'mlp' -> unsharded; skipped rule 1 [mlp, fsdp]: mesh axis 'fsdp' already used by dim 0 ('embed')"
    )


def test_explain_reports_names_without_rules():
    [d] = Rules([("embed", "fsdp")]).explain(("vocab",))
    assert not d.claimed and d.notes == ("no rule for 'vocab'",)


def test_explain_reports_indivisible_skip():
    rules = Rules([("mlp", "tensor"), ("mlp", "fsdp")])
    [d] = rules.explain(("mlp",), shape=(6,), mesh={"tensor": 4, "fsdp": 2})
    assert d.mesh_axes == "fsdp" and d.rule_index == 1
    assert d.notes == ("skipped rule 0 [mlp, tensor]: size 6 not divisible by 4",)


def test_duplicate_logical_name_is_an_error_naming_the_array():
    with pytest.raises(
        pt.RuleError,
        match=r"params/x: logical name\(s\) 'embed' used for more than one dimension of array \('embed', 'embed'\)",
    ):
        Rules([("embed", "fsdp")]).resolve(("embed", "embed"), path="params/x")


def test_unknown_mesh_axis_lists_axes_and_nearest():
    rules = Rules([("batch", "data"), ("mlp", "tensr")])
    with pytest.raises(pt.RuleError) as e:
        rules.validate({"data": 2, "fsdp": 2, "tensor": 2})
    assert str(e.value) == (
        "rules[1]: mesh axis 'tensr' is not a mesh axis (data, fsdp, tensor); did you mean 'tensor'?"
    )


@pytest.mark.parametrize(
    "pair, msg",
    [
        (("mlp",), r"rules\[0\]: a rule is a pair \[logical_name, mesh_axes\], got \('mlp',\)"),
        ((3, "x"), r"rules\[0\]: logical name must be a non-empty string, got 3"),
        (("mlp", 3), r"rules\[0\]: mesh axes must be null, a mesh axis name or a list of names, got int 3"),
        (("mlp", ["x", "x"]), r"rules\[0\]: mesh axis repeated in \['x', 'x'\]"),
    ],
)
def test_malformed_rules(pair, msg):
    with pytest.raises(pt.RuleError, match=msg):
        Rules([pair])


def test_indivisible_error_names_path_dim_sizes_axes():
    rules = Rules([("mlp", "tensor")])
    with pytest.raises(pt.ShardingError) as e:
        rules.resolve(("embed", "mlp"), (64, 3004), {"tensor": 8}, path="params/decoder/mlp/wi/kernel")
    assert str(e.value).startswith(
        "params/decoder/mlp/wi/kernel: dim 1 ('mlp', size 3004) is not divisible by mesh axes ('tensor',) of size 8"
    )


def test_indivisible_replicate_falls_back_with_warning():
    rules = Rules([("mlp", "tensor"), ("mlp", "fsdp")])
    with pytest.warns(pt.IndivisibleWarning, match=r"p: dim 0 \('mlp', size 6\) is not divisible"):
        spec = rules.resolve(("mlp",), (6,), {"tensor": 4, "fsdp": 2}, on_indivisible="replicate", path="p")
    assert spec == P("fsdp")
    with pytest.warns(pt.IndivisibleWarning):
        assert rules.resolve(("mlp",), (5,), {"tensor": 4, "fsdp": 2}, on_indivisible="replicate") == P(None)


def test_presets_load_and_resolve():
    assert set(pt.preset_names()) >= {"dp", "fsdp", "tp", "fsdp_tp", "seq"}
    assert Rules.preset("fsdp_tp").resolve(("embed", "mlp")) == P("fsdp", "tensor")
    assert Rules.preset("tp").resolve(("embed", "mlp")) == P(None, "tensor")
    assert Rules.preset("dp").resolve(("batch", "length", "embed")) == P("data", None, None)
    assert Rules.preset("seq").resolve(("batch", "length", "embed")) == P(("data", "fsdp"), "tensor", None)
    with pytest.raises(
        pt.RuleError,
        match=r"unknown rule preset 'fsdpp' \(presets: dp, ep, fsdp, fsdp_cp, fsdp_tp, pp, pp_fsdp, seq, tp\); "
        r"did you mean 'fsdp'\?",
    ):
        Rules.preset("fsdpp")


def test_rules_are_a_tuple_flax_accepts_and_pickle():
    import pickle

    rules = Rules([("embed", "fsdp"), ("mlp", ("fsdp", "tensor"))])
    assert isinstance(rules, tuple)
    assert nn.logical_to_mesh_axes(("mlp",), rules) == P(("fsdp", "tensor"))
    again = pickle.loads(pickle.dumps(rules))
    assert again == rules and again.origins == rules.origins


def test_logical_to_mesh_trees():
    rules = [("embed", "fsdp"), ("mlp", "tensor")]
    tree = {"a": P("embed", "mlp"), "b": P(None, "embed")}
    assert pt.logical_to_mesh(tree, rules) == nn.logical_to_mesh(tree, rules)


def test_batch_axes_default_to_the_batch_rules_and_can_be_declared():
    fsdp = Rules.preset("fsdp")
    assert fsdp.batch_axes == ("data", "fsdp") and fsdp.declared_batch_axes is None
    assert fsdp.batch_spec(2) == P(("data", "fsdp"), None)
    assert Rules([("embed", "fsdp")]).batch_axes == ()
    # Fallback rules for `batch` add their axes: every axis that can split the batch.
    assert Rules([("batch", "data"), ("batch", "fsdp")]).batch_axes == ("data", "fsdp")
    declared = fsdp.with_batch_axes(["data"])
    assert declared.batch_axes == ("data",) and declared.batch_spec(3) == P("data", None, None)
    assert list(declared) == list(fsdp)  # the table itself is unchanged
    assert pt.boxes.compute_spec(("embed", "mlp"), fsdp) == P(None, None)
    assert pt.boxes.compute_spec(("embed", "mlp"), declared) == P("fsdp", None)
    # MaxText-style names: the batch is `activation_batch`, declared so.
    maxtext = Rules([("activation_batch", ("data", "fsdp")), ("embed", "fsdp")], batch_axes=("data", "fsdp"))
    assert pt.boxes.compute_spec(("embed",), maxtext) == P(None)
    assert (declared + [("x", "data")]).batch_axes == ("data",)
    import pickle

    assert pickle.loads(pickle.dumps(declared)).batch_axes == ("data",)


def test_declared_batch_axes_are_validated_against_the_mesh():
    with pytest.raises(
        pt.RuleError, match=r"batch_axes: 'dat' is not a mesh axis \(data, fsdp\); did you mean 'data'\?"
    ):
        Rules.preset("fsdp").with_batch_axes(["dat"]).validate({"data": 1, "fsdp": 8})


def test_rules_parse_forms_with_batch_axes(write):
    r = Rules.parse({"preset": "fsdp", "extra": [["heads", "tensor"]], "batch_axes": ["data", "fsdp"]})
    assert r[0] == ("heads", "tensor") and r.declared_batch_axes == ("data", "fsdp")
    f = write("r.yaml", "batch_axes: data\nrules:\n  - [embed, fsdp]\n")
    assert Rules.from_yaml(f).declared_batch_axes == ("data",)
    bad = write("bad.yaml", "rules: []\nbatch_axis: data\n")
    with pytest.raises(
        pt.ConfigError,
        match=r"bad.yaml:2: batch_axis: unknown key \(valid: rules, batch_axes, follows, mesh\); "
        r"did you mean 'batch_axes'\?",
    ):
        Rules.from_yaml(bad)
    with pytest.raises(pt.ConfigError, match=r"rules.batch_axes: mesh axes must be names"):
        Rules.parse({"preset": "fsdp", "batch_axes": [1]}, "x.yaml", {}, ("rules",))


def test_fewer_names_than_dimensions_leave_the_trailing_ones_unsharded():
    rules = Rules.preset("fsdp")
    # Flax's DenseGeneral / attention kernels: ('embed', 'kv') on (embed, heads, head_dim).
    assert rules.resolve(("embed", "kv"), (64, 8, 8), {"data": 1, "fsdp": 8}) == P("fsdp", None, None)
    assert [str(d) for d in rules.explain(("embed",), (64, 8), {"fsdp": 8, "data": 1})][
        1
    ] == "dim 1 None -> unsharded; no name (a trailing dimension): unsharded"
    with pytest.raises(pt.ShardingError, match=r"^w: 3 logical names .* rank 2 \(shape \(64, 8\)\); give at most one"):
        rules.resolve(("embed", "mlp", "kv"), (64, 8), {"fsdp": 8, "data": 1}, path="w")


def test_mesh_axis_names_no_rule_mentions_resolve_to_that_axis_with_a_mesh():
    rules = Rules.preset("fsdp")
    mesh = {"data": 1, "fsdp": 4, "tensor": 2}
    assert rules.resolve(("embed", "tensor"), (64, 8), mesh) == P("fsdp", "tensor")
    # The rules go first: a mesh-axis name only fills a dimension they left, with an axis still free.
    assert rules.resolve(("fsdp", "embed"), (64, 8), mesh) == P(None, "fsdp")
    [d0, d1] = rules.explain(("fsdp", "embed"), (64, 8), mesh)
    assert not d0.by_mesh_axis and d0.mesh_axes is None and d1.rule_index == 1
    assert d0.notes == ("mesh-axis name 'fsdp': axis already used by dim 1 ('embed')",)
    assert rules.resolve(("tensor", "embed"), (8, 64), mesh) == P("tensor", "fsdp")
    [d0, _] = rules.explain(("tensor", "embed"), (8, 64), mesh)
    assert d0.by_mesh_axis and d0.rule_index is None
    # A rule that mentions the name wins; without a mesh the name is unsharded (Flax parity).
    assert Rules([("tensor", "fsdp")]).resolve(("tensor",), (8,), mesh) == P("fsdp")
    assert rules.resolve(("embed", "tensor")) == P("fsdp", None)
    with pytest.raises(pt.ShardingError, match=r"dim 1 \(mesh axis 'tensor', size 7\) is not divisible"):
        rules.resolve(("embed", "tensor"), (64, 7), mesh)
