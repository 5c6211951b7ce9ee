"""Annotation tables from Python: rows by path, first match wins, boxed and unboxed leaves, the optimizer
state mirroring them, NNX and plain-pytree models, restore onto another layout, and every error."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import partitioning as pt

MESH = {"data": 1, "fsdp": 8}
ROWS = [[r"Dense_0/kernel$", ["embed", "mlp"]], [r"kernel$", ["mlp", "embed"]], [r"bias$", ["mlp"]]]


class TwoDense(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(32)(nn.relu(nn.Dense(128)(x)))


def abstract_two_dense():
    return jax.eval_shape(TwoDense().init, jax.random.key(0), jnp.zeros((8, 32)))


def test_first_matching_row_names_each_leaf_and_the_layout_says_which():
    layouts = {x.path: x for x in pt.tree_layouts(abstract_two_dense(), MESH, "fsdp", annotations=ROWS)}
    first, second = layouts["params/Dense_0/kernel"], layouts["params/Dense_1/kernel"]
    assert (first.names, first.spec, first.named_by) == (("embed", "mlp"), P("fsdp", None), "annotations[0]")
    assert (second.names, second.spec, second.named_by) == (("mlp", "embed"), P(None, "fsdp"), "annotations[1]")
    bias = layouts["params/Dense_1/bias"]
    assert bias.spec == P("fsdp") and bias.named_by == "annotations[2]"


def test_tree_shardings_and_specs_take_the_same_table():
    specs = pt.tree_specs(abstract_two_dense(), MESH, "fsdp", annotations=pt.Annotations(ROWS))
    assert specs["params"]["Dense_0"]["kernel"] == P("fsdp", None)
    mesh = pt.make_mesh(MESH)
    shardings = pt.tree_shardings(abstract_two_dense(), mesh, "fsdp", annotations=ROWS)
    assert shardings["params"]["Dense_1"]["kernel"].spec == P(None, "fsdp")


def test_a_boxed_leaf_is_overridden_and_explain_says_over_what():
    dense = nn.Dense(64, kernel_init=pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")))
    abstract = jax.eval_shape(dense.init, jax.random.key(0), jnp.zeros((8, 32)))
    kernel = pt.tree_layouts(abstract, MESH, "fsdp", annotations=[["kernel", ["embed", "mlp"]]])[-1]
    assert kernel.names == ("embed", "mlp") and kernel.spec == P("fsdp", None)
    assert kernel.named_by == "annotations[0] (over the model's ('mlp', 'embed'))"
    # Unmatched leaves keep their own names.
    kept = pt.tree_layouts(abstract, MESH, "fsdp", annotations=[["bias", [None]]])[-1]
    assert kept.names == ("mlp", "embed") and kept.named_by is None


def test_the_trainer_and_the_abstract_state_give_adam_moments_the_same_names():
    rows = pt.Annotations(ROWS)
    batch = {"inputs": jnp.zeros((8, 32)), "targets": jnp.zeros((8,), jnp.int32)}
    params, opt = pt.abstract_train_state(TwoDense(), optax.adam(1e-3), batch=batch, annotations=rows)
    assert opt[0].mu["Dense_1"]["kernel"].names == ("mlp", "embed")
    assert opt[0].nu["Dense_0"]["kernel"].named_by == "annotations[0]"
    trainer = pt.Trainer(
        TwoDense(), optax.adam(1e-3), pt.make_mesh(MESH), "fsdp", batch=batch, task="classification", annotations=rows
    )
    s = trainer.state_shardings
    assert s.params["Dense_0"]["kernel"].spec == P("fsdp", None)
    assert s.opt_state[0].mu["Dense_0"]["kernel"].spec == P("fsdp", None)
    assert s.opt_state[0].nu["Dense_1"]["kernel"].spec == P(None, "fsdp")


def test_an_optimizer_state_on_its_own_matches_as_its_parameter():
    anchored = [[r"^params/Dense_0/kernel$", ["embed", "mlp"]]]
    opt = jax.eval_shape(optax.adam(1e-3).init, pt.unbox(abstract_two_dense()["params"]))
    layouts = {
        x.path: x
        for x in pt.tree_layouts({"opt_state": opt}, MESH, "fsdp", annotations=anchored, warn_replicated=False)
    }
    assert layouts["opt_state/0/mu/Dense_0/kernel"].spec == P("fsdp", None)
    assert layouts["opt_state/0/nu/Dense_0/kernel"].named_by == "annotations[0]"


def test_nnx_variables_and_plain_pytrees_are_annotated():
    model = pt.NNXModel(lambda rngs: nnx.Linear(64, 256, rngs=rngs))
    layouts = pt.tree_layouts(
        model.abstract((jnp.zeros((8, 64)),), {}), MESH, "fsdp", annotations=[["kernel", ["embed", "mlp"]]]
    )
    assert [(x.path, x.spec) for x in layouts] == [("params/bias", P()), ("params/kernel", P("fsdp", None))]
    tree = {"w": jax.ShapeDtypeStruct((64, 256), jnp.float32), "layers": [jax.ShapeDtypeStruct((256,), jnp.float32)]}
    specs = pt.tree_specs(tree, MESH, "fsdp", annotations=[[r"^w$", ["embed", "mlp"]], [r"layers/\d+", ["mlp"]]])
    assert specs == {"w": P("fsdp", None), "layers": [P("fsdp")]}


def test_restore_onto_another_layout_names_a_checkpoint_that_recorded_none(tmp_path):
    mesh = pt.make_mesh(MESH)
    x = jnp.zeros((8, 32))
    abstract = abstract_two_dense()
    shardings = pt.tree_shardings(abstract, mesh, "fsdp", annotations=ROWS)
    params = pt.unbox(jax.jit(TwoDense().init, out_shardings=shardings)(jax.random.key(0), x))
    pt.save_checkpoint(tmp_path / "ck", 1, params)  # no abstract: the checkpoint records no names
    tp = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    restored = pt.restore_checkpoint(tmp_path / "ck", mesh=tp, rules="fsdp_tp", annotations=ROWS)
    assert restored["params"]["Dense_0"]["kernel"].sharding.spec == P("fsdp", "tensor")
    assert restored["params"]["Dense_1"]["kernel"].sharding.spec == P("tensor", "fsdp")
    np.testing.assert_array_equal(restored["params"]["Dense_1"]["kernel"], params["params"]["Dense_1"]["kernel"])
    target = pt.abstract_target(abstract, tp, "fsdp_tp", annotations=ROWS)
    assert target["params"]["Dense_1"]["bias"].sharding.spec == P("tensor")


@pytest.mark.parametrize(
    "rows, message",
    [
        ([["kernel", ["embed"]]], r"^annotations\[0\]: 1 names \['embed'\] for params/Dense_0/kernel of rank 2 "),
        ([["kernel(", ["embed", "mlp"]]], r"^annotations\[0\]: 'kernel\(' is not a regular expression: missing \)"),
        ([["kernel", "embed"]], r"^annotations\[0\]: names must be a list of logical names or null"),
        ([["kernel", ["embed", "embed"]]], r"^annotations\[0\]: 'embed' names more than one dimension"),
        ([["kernel"]], r"^annotations\[0\]: a row is \[path_regex, names\]"),
    ],
)
def test_bad_rows_are_one_line_naming_the_row(rows, message):
    with pytest.raises(pt.annotations.AnnotationError, match=message) as e:
        pt.tree_layouts(abstract_two_dense(), MESH, "fsdp", annotations=rows)
    assert isinstance(e.value, pt.PartitioningError) and "\n" not in str(e.value)


def test_a_row_matching_nothing_warns_or_with_strict_fails():
    rows = ROWS + [["Dense_7/kernel", ["embed", "mlp"]]]
    with pytest.warns(
        pt.annotations.AnnotationWarning, match=r"^annotations\[3\]: 'Dense_7/kernel' matches none of the 4 arrays"
    ):
        pt.tree_layouts(abstract_two_dense(), MESH, "fsdp", annotations=rows)
    with pytest.raises(pt.annotations.AnnotationError, match=r"matches none of the 4 arrays of the model \(strict\)$"):
        pt.tree_layouts(abstract_two_dense(), MESH, "fsdp", annotations=pt.Annotations(rows, strict=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pt.tree_layouts(abstract_two_dense(), MESH, "fsdp", annotations=ROWS)  # every row used: silent


def test_names_no_rule_knows_are_refused_with_a_suggestion():
    with pytest.raises(pt.annotations.AnnotationError, match=r"knows the logical name 'emebd' .*did you mean 'embed'"):
        pt.Annotations([["kernel", ["emebd", "mlp"]]]).check_names({"embed", "mlp"})


class ScanBlock(nn.Module):  # nn.scan names it ScanScanBlock_0
    @nn.compact
    def __call__(self, x, _):
        h = nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x))
        return x + nn.Dense(x.shape[-1])(nn.gelu(h)), None


class ScannedLM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(512, 32)(tokens)
        x, _ = nn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=6)()(x, None)
        return nn.Dense(512)(x)


def test_the_proposal_names_a_scanned_stack_layers_and_reads_the_widths():
    from partitioning.propose import propose_annotations

    abstract = jax.eval_shape(ScannedLM().init, jax.random.key(0), jnp.zeros((2, 8), jnp.int32))
    proposal = propose_annotations(abstract)
    assert proposal.sizes == {"embed": 32, "vocab": 512, "mlp": 128, "layers": 6}
    rows = {r.pattern: r.names for r in proposal.rows}
    assert rows[r"^params/ScanScanBlock_0/Dense_0/kernel$"] == ("layers", "embed", "mlp")
    assert rows[r"^params/ScanScanBlock_0/LayerNorm_0/scale$"] == ("layers", "embed")
    assert rows[r"^params/Embed_0/embedding$"] == ("vocab", "embed")
    first = next(r for r in proposal.rows if r.names[0] == "layers")
    assert first.reasons[0] == "layers: leading 6 shared by every array under params/ScanScanBlock_0"
    specs = pt.tree_specs(
        abstract,
        {"data": 1, "fsdp": 4, "tensor": 2},
        "fsdp_tp",
        annotations=[[r.pattern, list(r.names)] for r in proposal.rows],
    )
    assert specs["params"]["ScanScanBlock_0"]["Dense_1"]["kernel"] == P(None, "tensor", "fsdp")
