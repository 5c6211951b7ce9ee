"""Model adapters (partitioning.model.interface): Linen, NNX and plain functions behind one interface."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, struct
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.model.interface import FunctionModel, LinenModel, NNXModel, as_model


class CallArg(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        return nn.Dropout(0.5)(x, deterministic=deterministic)


class Field(nn.Module):
    train: bool = True

    @nn.compact
    def __call__(self, x):
        return nn.Dropout(0.5)(x, deterministic=not self.train)


@struct.dataclass
class Cfg:
    deterministic: bool = False


class ConfigField(nn.Module):
    config: Cfg

    @nn.compact
    def __call__(self, x):
        return nn.Dropout(0.5)(x, deterministic=self.config.deterministic)


@pytest.mark.parametrize("module", [CallArg(), Field(), ConfigField(Cfg())], ids=["call-arg", "field", "config-field"])
def test_train_mode_drops_out_and_eval_mode_does_not(module):
    model = LinenModel(module)
    x = jnp.ones((4, 16))
    rngs = {"dropout": jax.random.key(1)}
    train, _ = model.apply({"params": {}}, (x,), {}, rngs=rngs, train=True)
    evald, _ = model.apply({"params": {}}, (x,), {}, rngs=rngs, train=False)
    assert np.array_equal(np.asarray(evald), np.ones((4, 16)))
    assert set(np.unique(np.asarray(train)).tolist()) == {0.0, 2.0}


def test_nnx_train_and_eval_use_nnx_modes_and_carry_rng_state():
    class Drop(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Param(jnp.ones((16,)))
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(x * self.w[...])

    model = NNXModel(lambda rngs: Drop(rngs))
    variables = model.init(jax.random.key(0), (), {})
    assert set(variables) == {"params", "rngs"}
    assert variables["rngs"]["drop"]["rngs"]["key"].dtype == jnp.uint32  # typed keys stored as raw data
    x = jnp.ones((4, 16))
    out, updates = model.apply(variables, (x,), {}, rngs={}, train=True)
    assert set(np.unique(np.asarray(out)).tolist()) == {0.0, 2.0}
    assert int(updates["rngs"]["drop"]["rngs"]["count"]) == int(variables["rngs"]["drop"]["rngs"]["count"]) + 1
    evald, none = model.apply(variables, (x,), {}, rngs={}, train=False)
    assert np.array_equal(np.asarray(evald), np.ones((4, 16))) and none == {}


def test_plain_functions_train_with_boxed_names():
    def init(rng):
        return {"w": pt.LogicallyPartitioned(jax.random.normal(rng, (16, 8)) * 0.1, ("embed", "mlp"))}

    def apply(params, x):
        return x @ params["w"]

    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    batch = {"inputs": x, "targets": x[:, :8]}
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    trainer = pt.Trainer(
        FunctionModel(init, apply),
        optax.sgd(0.1),
        mesh,
        "fsdp_tp",
        batch=batch,
        task=lambda y, b: jnp.mean((y - b["targets"]) ** 2),
    )
    assert trainer.state_shardings.params["w"].spec == P("fsdp", "tensor")
    state = trainer.init(jax.random.key(0))
    placed = trainer.place(batch)
    state, first = trainer.train_step(state, placed)
    state, second = trainer.train_step(state, placed)
    assert float(second["loss"]) < float(first["loss"])
    assert as_model((init, apply)).kind == "function"


def test_as_model_says_what_it_takes():
    assert as_model(CallArg()).kind == "linen"
    with pytest.raises(TypeError, match=r"cannot train a int: expected a Flax Linen module, an NNX module"):
        as_model(3)
