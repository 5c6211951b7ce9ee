"""An NNX model annotated with mesh-axis names: the toolkit's specs equal NNX's own."""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import partitioning as pt
from tests.byom.models.nnx_mesh_axes import DotReluDot, ToyMLP


def mse(y, b):
    return jnp.mean((y - b["targets"]) ** 2)


def test_mesh_axis_names_give_nnx_own_specs():
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    with jax.set_mesh(mesh):  # Flax alone: eager sharding by mesh-axis names
        model = DotReluDot(16, rngs=nnx.Rngs(0))
    nnx_own = {
        "dot1/kernel": model.dot1.kernel.get_value().sharding.spec,
        "w2": model.w2.get_value().sharding.spec,
        "bias": model.bias.get_value().sharding.spec,
    }
    for rules in ("fsdp_tp", "dp", []):  # no rule mentions fsdp / tensor: they are mesh axes
        layouts = {x.path: x for x in pt.tree_layouts(nnx.state(model), mesh, rules)}
        for path, spec in nnx_own.items():
            assert layouts[path].spec == spec, (rules, path)
    assert nnx_own["dot1/kernel"] == P("fsdp", "tensor")
    d = layouts["dot1/kernel"].dims[0]
    assert d.by_mesh_axis and d.notes == ("mesh-axis name: no rule mentions 'fsdp' and it is a mesh axis",)


def test_trains_under_the_toolkit_with_its_mesh_axis_layout():
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    batch = {"inputs": jnp.ones((8, 16)), "targets": jnp.zeros((8, 16))}

    trainer = pt.Trainer(
        pt.NNXModel(lambda rngs: DotReluDot(16, rngs=rngs)),
        optax.sgd(0.1),
        mesh,
        [("batch", "fsdp")],
        batch=batch,
        task=mse,
    )
    assert trainer.state_shardings.params["dot1"]["kernel"].spec == P("fsdp", "tensor")
    state = trainer.init(jax.random.key(0))
    state, m1 = trainer.train_step(state, trainer.place(batch))
    state, m2 = trainer.train_step(state, trainer.place(batch))
    assert float(m2["loss"]) < float(m1["loss"])


def test_flax_toy_fsdp_example_follows_on_indivisible_for_mesh_axis_names():
    # MLP(1, 32, 1) on {data: 2, model: 4}: w2 (32, 1) names 'model' for its size-1 dimension.
    mesh = pt.make_mesh({"data": 2, "model": 4})
    batch = {"inputs": jnp.linspace(-1, 1, 16)[:, None], "targets": jnp.linspace(-1, 1, 16)[:, None] ** 2}

    def make(**kw):
        model = pt.NNXModel(lambda rngs: ToyMLP(1, 32, 1, rngs=rngs))
        return pt.Trainer(model, optax.sgd(0.1), mesh, [("batch", "data")], batch=batch, task=mse, **kw)

    with pytest.raises(
        pt.ShardingError,
        match=r"^params/w2: dim 1 \(mesh axis 'model', size 1\) is not divisible by the mesh axis size 4; "
        r"change the size, or set on_indivisible: replicate$",
    ):
        make()
    with pytest.warns(pt.IndivisibleWarning, match=r"params/w2: dim 1 \(mesh axis 'model', size 1\)"):
        trainer = make(on_indivisible="replicate")
    assert trainer.state_shardings.params["w2"].spec == P(None, None)
    assert trainer.state_shardings.params["w1"].spec == P(None, "model")
    state = trainer.init(jax.random.key(0))
    state, m1 = trainer.train_step(state, trainer.place(batch))
    state, m2 = trainer.train_step(state, trainer.place(batch))
    assert float(m2["loss"]) < float(m1["loss"])
