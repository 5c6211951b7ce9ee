"""An NNX twin of the reference GPT: the same specs and losses as the Linen GPT, sharded init, checkpoints."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.models import GPT as LinenGPT
from tests.byom.models.gpt_nnx import GPT as NNXGPT

KW = dict(embed=32, heads=4, mlp=64, layers=2)


def nnx_model():
    return pt.NNXModel(lambda rngs: NNXGPT(**KW, rngs=rngs))


def trainers(preset, meshes):
    mesh = pt.make_mesh(meshes[preset])
    linen = pt.Trainer(LinenGPT(**KW), optax.adamw(3e-3), mesh, preset, batch_size=8, seq_len=32)
    nnx_ = pt.Trainer(nnx_model(), optax.adamw(3e-3), mesh, preset, batch_size=8, seq_len=32)
    return linen, nnx_


@pytest.mark.parametrize("preset", ["dp", "fsdp", "tp", "fsdp_tp", "seq"])
def test_same_specs_as_the_linen_gpt(preset, meshes):
    linen, twin = trainers(preset, meshes)

    def specs(t):
        return {leaf.path: (leaf.shape, leaf.spec) for leaf in t.state_layouts()}

    assert specs(twin) == specs(linen)


# dp and fsdp_tp train what fsdp, tp and seq already cover (their specs are checked above, compiling nothing).
@pytest.mark.slow  # ~20 s a layout: two inits and two train steps compiled
@pytest.mark.parametrize("preset", ["fsdp", "tp", "seq"])
def test_same_losses_as_the_linen_gpt(preset, meshes, train_losses, copy_state):
    linen, twin = trainers(preset, meshes)
    a = linen.init(jax.random.key(0))
    b = twin.init(jax.random.key(0))
    # Born sharded: every NNX param is in its rule sharding straight out of the init.
    for x, s in zip(jax.tree.leaves(b.params), jax.tree.leaves(twin.state_shardings.params), strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    b = b.replace(
        params=copy_state(a.params, twin.state_shardings.params),
        opt_state=copy_state(a.opt_state, twin.state_shardings.opt_state),
    )
    _, la = train_losses(linen, a, 3)
    _, lb = train_losses(twin, b, 3)
    np.testing.assert_allclose(lb, la, rtol=1e-4)


def test_nnx_eager_sharding_in_the_toolkit_context_uses_the_rule_walk(meshes):
    for preset in ("dp", "fsdp", "tp"):
        mesh = pt.make_mesh(meshes[preset])
        with pt.sharding_context(mesh, preset):
            model = NNXGPT(**KW, rngs=nnx.Rngs(0))  # NNX's eager sharding, Flax's own code path
            flax_specs = nnx.get_partition_spec(nnx.state(model))
        ours = {leaf.path: leaf.spec for leaf in pt.tree_layouts(nnx.state(model), mesh, preset)}
        wi = model.blocks.mlp.wi_0.get_value()
        assert wi.sharding.is_equivalent_to(NamedSharding(mesh, ours["blocks/mlp/wi_0"]), wi.ndim), preset
        assert flax_specs["blocks"]["mlp"]["wi_0"].get_value() == ours["blocks/mlp/wi_0"]
    assert ours["blocks/mlp/wi_0"] == P(None, None, "tensor")  # tp: (layers, embed, mlp)


def test_checkpoints_restore_fsdp_to_one_device_and_to_tp_bit_exact(meshes, train_losses, tmp_path):
    fsdp = pt.Trainer(nnx_model(), optax.adamw(3e-3), pt.make_mesh(meshes["fsdp"]), "fsdp", batch_size=8, seq_len=32)
    state, _ = train_losses(fsdp, fsdp.init(jax.random.key(0)), 2)
    pt.save_checkpoint(tmp_path / "ck", 2, state, rules=fsdp.rules, abstract=fsdp.abstract_state)
    meta = pt.checkpoint.checkpoint_metadata(tmp_path / "ck")
    assert "params/blocks/attn/q" in meta["arrays"] and not any(p.endswith("/value") for p in meta["arrays"])
    assert meta["arrays"]["params/blocks/attn/q"]["names"] == ["layers", "embed", "heads", "kv"]
    one = pt.make_mesh({"data": 1, "fsdp": 1}, devices=jax.devices()[:1])
    single = pt.Trainer(nnx_model(), optax.adamw(3e-3), one, "fsdp", batch_size=8, seq_len=32)
    params = pt.restore_checkpoint(
        tmp_path / "ck",
        pt.abstract_target(single.abstract_state.params, shardings=single.state_shardings.params),
        params_only=True,
    )
    tp = pt.Trainer(nnx_model(), optax.adamw(3e-3), pt.make_mesh(meshes["tp"]), "tp", batch_size=8, seq_len=32)
    restored = pt.restore_checkpoint(
        tmp_path / "ck", pt.abstract_target(tp.abstract_state, shardings=tp.state_shardings)
    )
    for a, b, c in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(params), jax.tree.leaves(restored.params), strict=True
    ):
        assert np.array_equal(np.asarray(a), np.asarray(b)) and np.array_equal(np.asarray(a), np.asarray(c))
    assert len(params["embedding"].sharding.device_set) == 1
    assert restored.params["blocks"]["mlp"]["wi_0"].sharding.spec == P(None, None, "tensor")
    # The restored state trains on: NNX merges it back into the module.
    _, more = train_losses(tp, restored, 1)
    assert np.isfinite(more[0])


def test_a_saved_nnx_state_restores_onto_another_layout(meshes, tmp_path):
    import orbax.checkpoint as ocp

    fsdp = pt.make_mesh(meshes["fsdp"])
    with pt.sharding_context(fsdp, "fsdp"):
        model = NNXGPT(**KW, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    ck = ocp.StandardCheckpointer()
    ck.save(tmp_path / "nnx", state)
    ck.wait_until_finished()
    tp = pt.make_mesh(meshes["tp"])
    with pt.sharding_context(tp, "tp"):
        abstract = nnx.state(nnx.eval_shape(lambda: NNXGPT(**KW, rngs=nnx.Rngs(0))), nnx.Param)
    target = pt.abstract_target(abstract, tp, "tp")
    restored = pt.restore_checkpoint(tmp_path / "nnx", target)
    assert isinstance(restored, nnx.State)
    wi = restored["blocks"]["mlp"]["wi_0"].get_value()
    assert wi.sharding.spec == P(None, None, "tensor")
    assert np.array_equal(np.asarray(wi), np.asarray(state["blocks"]["mlp"]["wi_0"].get_value()))
    nnx.update(model, restored)  # and it goes back into a module
