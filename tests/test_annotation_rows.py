"""Annotation rows that were misread: a row shadowed by an earlier one is named as shadowed (with the row that
takes its arrays), a row for optimizer moments names them the same in every entry point (the Trainer, `plan`'s
abstract state, `pt.tree_layouts` of a whole state), and factored moments (adafactor's v_row / v_col) follow
their parameter's row by the optimizer's own mapping."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.annotations import AnnotationError, AnnotationWarning

MESH = {"data": 1, "fsdp": 8}
BATCH = {"inputs": jnp.zeros((8, 64)), "targets": jnp.zeros((8,), jnp.int32)}


class TwoDense(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(256)(nn.relu(nn.Dense(128)(x)))


def abstract():
    return jax.eval_shape(TwoDense().init, jax.random.key(0), jnp.zeros((8, 64)))


def test_a_shadowed_row_is_named_with_the_row_that_shadows_it():
    rows = [[r"kernel$", ["embed", "mlp"]], [r"Dense_1/kernel$", ["mlp", "embed"]], [r"bias$", ["mlp"]]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pt.tree_layouts(abstract(), MESH, "fsdp", annotations=rows)
    said = [str(w.message) for w in caught if issubclass(w.category, AnnotationWarning)]
    assert said == [
        "annotations[1]: 'Dense_1/kernel$' is shadowed by annotations[0] ('kernel$'): the 1 array it matches "
        "(params/Dense_1/kernel) are named by that earlier row (the first match wins); move it above that row, or "
        "narrow that row"
    ]
    with pytest.raises(AnnotationError, match=r"^annotations\[1\]: 'Dense_1/kernel\$' is shadowed by .* \(strict\)$"):
        pt.tree_layouts(abstract(), MESH, "fsdp", annotations=pt.Annotations(rows, strict=True))


MOMENT_ROWS = [
    [r"opt_state/.*/mu/Dense_0/kernel$", [None, "mlp"]],  # adam's first moment laid out otherwise than its param
    [r"kernel$", ["embed", "mlp"]],
    [r"bias$", ["mlp"]],
]


def _moment(layouts, moment: str):
    return next(x for x in layouts if x.path.endswith(f"/{moment}/Dense_0/kernel") and x.path.startswith("opt_state"))


def test_a_row_for_moments_names_them_alike_in_the_trainer_the_plan_and_tree_layouts():
    tx = optax.adam(1e-3)
    trainer = pt.Trainer(
        TwoDense(), tx, pt.make_mesh(MESH), "fsdp", batch=BATCH, task="classification", annotations=MOMENT_ROWS
    )
    by_trainer = trainer.state_layouts()
    assert (_moment(by_trainer, "mu").names, _moment(by_trainer, "mu").spec) == ((None, "mlp"), P(None, "fsdp"))
    assert _moment(by_trainer, "nu").names == ("embed", "mlp")  # the other moment follows its param's row
    params, opt_state = pt.abstract_train_state(TwoDense(), tx, batch=BATCH, annotations=MOMENT_ROWS)
    by_plan = pt.build_plan(params, opt_state, MESH, "fsdp")
    assert _moment(by_plan.opt_state, "mu").names == (None, "mlp")
    whole = pt.tree_layouts(trainer.abstract_state, MESH, "fsdp", annotations=MOMENT_ROWS)
    assert _moment(whole, "mu").names == (None, "mlp") and _moment(whole, "nu").names == ("embed", "mlp")


def test_a_moment_row_applied_to_params_alone_is_not_called_unmatched():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no AnnotationWarning: the row is for the optimizer state
        pt.tree_layouts(abstract(), MESH, "fsdp", annotations=MOMENT_ROWS)


def test_factored_moments_follow_their_parameter_by_the_optimizers_mapping():
    rows = [[r"kernel$", ["embed", "mlp"]], [r"bias$", ["mlp"]]]
    trainer = pt.Trainer(
        TwoDense(),
        optax.adafactor(1e-3),
        pt.make_mesh(MESH),
        "fsdp",
        batch=BATCH,
        task="classification",
        annotations=rows,
    )
    layouts = {x.path: x for x in trainer.state_layouts()}
    # Dense_0/kernel is (128, 256), named (embed, mlp): v_row drops the largest dimension (256), v_col the other.
    v_row, v_col = (layouts[f"opt_state/0/{k}/Dense_0/kernel"] for k in ("v_row", "v_col"))
    assert (v_row.shape, v_row.names, v_row.spec) == ((128,), ("embed",), P("fsdp"))
    assert (v_col.shape, v_col.names) == ((256,), ("mlp",))
    whole = {x.path: x for x in pt.tree_layouts(trainer.abstract_state, MESH, "fsdp", annotations=rows)}
    assert whole["opt_state/0/v_row/Dense_0/kernel"].names == ("embed",)
    assert whole["opt_state/0/v_col/Dense_0/kernel"].named_by == "annotations[0] (factored)"
    assert layouts["opt_state/0/v_row/Dense_1/kernel"].shape == (1,)  # (64, 128): not factored, a placeholder


def test_factored_names_breaks_ties_as_optax_does():
    from partitioning.annotations import factored_names

    state = optax.adafactor(1e-3, min_dim_size_to_factor=2).init({"w": jnp.zeros((4, 4, 3))})
    v_row, v_col = state[0].v_row["w"].shape, state[0].v_col["w"].shape  # both (4, 3): which 4 went?
    assert factored_names(("a", "b", "c"), (4, 4, 3), v_row, "0/v_row/w") == ("a", "c")  # the later of the two
    assert factored_names(("a", "b", "c"), (4, 4, 3), v_col, "0/v_col/w") == ("b", "c")
    assert factored_names(("a", "b"), (4, 3), (1,), "0/v_row/w") is None  # a placeholder: not the param's
