"""Pipeline parallelism (partitioning.parallel.pipeline) through the Trainer: the same losses as the unpipelined
model for S = 2 and 4 stages, alone and with fsdp and tp, GPipe and circular (R = 2); checkpoints move between
pipelined and unpipelined layouts bit-exact; layouts that cannot run are refused up front with errors naming
what to change."""

import flax.linen as nn
import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.checkpoint import abstract_target, restore_checkpoint, save_checkpoint
from partitioning.config import load_config
from partitioning.config.build import trainer_from_config
from partitioning.parallel import LayerStack, PipelineError, microbatching, scan_layers
from partitioning.plan.axes import collectives_by_axis
from partitioning.plan.hlo import collectives
from partitioning.plan.hlo_cost import op_costs, summarize_ops
from tests.byom.models.gpt_nnx import GPT as NNXGPT
from tests.parallel.conftest import TP, small_gpt

FSDP = ({"data": 1, "fsdp": 8}, "fsdp")
LAYOUTS = {
    "pp-S2": ({"stage": 2, "data": 4}, "pp", 4),
    "pp-S4": ({"stage": 4, "data": 2}, "pp", 4),
    "pp_fsdp-S2": ({"stage": 2, "data": 1, "fsdp": 4}, "pp_fsdp", 2),
    "pp_fsdp-S4": ({"stage": 4, "data": 1, "fsdp": 2}, "pp_fsdp", 8),
    "pp_tp-S2": ({"stage": 2, "data": 2, "tensor": 2}, pt.Rules.preset("pp") + TP, 4),
    "pp_tp-S4": ({"stage": 4, "data": 1, "tensor": 2}, pt.Rules.preset("pp") + TP, 8),
    # Circular: 2 stages x 2 chunks of 1 layer; M > S (outputs wait a repeat in stage 0's buffer), M = S.
    "pp-S2-R2": ({"stage": 2, "data": 4}, "pp", 4, 2),
    "pp_fsdp-S2-R2": ({"stage": 2, "data": 1, "fsdp": 4}, "pp_fsdp", 2, 2),
}


@pytest.fixture(scope="module")
def reference(runs):
    return runs.run("fsdp", small_gpt(), *FSDP)


# Every table, both stage counts and both circular cases (M > S, M = S); test_schedule covers more (S, M, R).
@pytest.mark.parametrize("name", ["pp-S2", "pp-S4", "pp_fsdp-S4", "pp_tp-S2", "pp-S2-R2", "pp_fsdp-S2-R2"])
def test_losses_equal_the_unpipelined_model(name, runs, reference):
    mesh, rules, m, *r = LAYOUTS[name]
    tr, state, losses, _ = runs.run(name, small_gpt(), mesh, rules, microbatches=m, pipeline_repeats=r[0] if r else 1)
    _, _, ref_losses, _ = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    assert losses[-1] < losses[0] - 0.5
    # The layers axis is split over `stage`: each device holds L/S consecutive layers.
    wi = state.params["blocks"]["mlp"]["wi_0"]  # (layers, embed, mlp)
    assert wi.sharding.spec[0] == "stage"
    assert wi.addressable_shards[0].data.shape[0] == 4 // mesh["stage"]
    assert (tr.stages, tr.microbatches, tr.pipeline_repeats) == (mesh["stage"], m, r[0] if r else 1)


def test_the_compiled_step_shifts_activations_with_collective_permutes(runs):
    mesh, rules, m = LAYOUTS["pp-S4"]
    tr = runs.run("pp-S4", small_gpt(), mesh, rules, microbatches=m, pipeline_repeats=1)[0]
    text = tr.lower_train_step().compile().as_text()
    ops = collectives(text)
    # XLA drops the op names of the stage loop's matmuls; the loop that runs them still tells their pass,
    # so the priced ops land in forward / backward, not in the optimizer update (tune's overlap needs that).
    phases = summarize_ops(op_costs(text))
    assert phases["update"]["flops"] < 0.02 * phases["total"]["flops"]
    assert 1.5 < phases["bwd"]["flops"] / phases["fwd"]["flops"] < 2.5
    # One shift per iteration forward and one backward, M + S - 1 iterations each, of one micro-batch's
    # activations on this device: (16 / 4 micro-batches / 2 data) rows x 32 positions x 32 floats.
    shifted = sum(c.bytes * c.executions for c in ops if c.kind == "collective-permute")
    assert shifted == 2 * (m + 4 - 1) * (2 * 32 * 32 * 4)
    by_axis = collectives_by_axis(ops, mesh)
    assert [a for a, kinds in by_axis.items() if kinds["collective-permute"]["count"]] == ["stage"]
    # Over `stage` otherwise only the last stage's outputs (forward) and the inputs' gradient (backward):
    # one all-reduce each of the batch's activations on this device (+ a few scalars).
    assert 2 * 8 * 32 * 32 * 4 <= by_axis["stage"]["all-reduce"]["bytes"] <= 2 * 8 * 32 * 32 * 4 + 256
    # Weights never travel over `stage`: no all-gather there.
    assert by_axis["stage"]["all-gather"]["count"] == 0


@pytest.mark.parametrize("src,dst", [("pp-S4", "fsdp"), ("fsdp", "pp-S2")])
def test_checkpoints_move_between_pipelined_and_unpipelined_layouts(
    src, dst, runs, reference, tmp_path, assert_bit_exact
):
    def case(name):
        return (name, small_gpt(), *FSDP) if name == "fsdp" else (name, small_gpt(), *LAYOUTS[name][:2])

    def kw(name):
        return {} if name == "fsdp" else {"microbatches": LAYOUTS[name][2], "pipeline_repeats": 1}

    a_tr, a_state, _, _ = runs.run(*case(src), **kw(src))
    b_tr = runs.run(*case(dst), **kw(dst))[0]
    save_checkpoint(tmp_path, 3, a_state)
    back = restore_checkpoint(tmp_path, abstract_target(b_tr.abstract_state, shardings=b_tr.state_shardings))
    assert_bit_exact(back, a_state)  # the same arrays ...
    assert back.params["blocks"]["attn"]["q"].sharding == b_tr.state_shardings.params["blocks"]["attn"]["q"]
    # ... and the restored run continues with the loss the saved layout would have had.
    batch = runs.batches(a_tr).batch_at(3)
    _, ma = a_tr.train_step(a_state, batch)
    _, mb = b_tr.train_step(back, runs.batches(b_tr).batch_at(3))
    np.testing.assert_allclose(float(mb["loss"]), float(ma["loss"]), rtol=1e-4)


# -- refused up front ---------------------------------------------------------------------------


def test_layers_must_split_into_stages(runs, mesh_of):
    with pytest.raises(PipelineError, match=r"4 layers cannot be split into 3 pipeline stages") as e:
        pt.Trainer(
            small_gpt(),
            pt.make_optimizer("sgd", lr=0.1, total_steps=1),
            mesh_of({"stage": 3, "data": 2}, 6),
            "pp",
            batch_size=12,
            seq_len=8,
        )
    assert e.value.arg == "stage"


@pytest.mark.parametrize(
    "kw,match,arg",
    [
        (
            dict(microbatches=3),
            r"batch_size 16 cannot be split into 3 pipeline micro-batches; use a multiple of 3",
            "microbatches",
        ),
        (dict(microbatches=0), r"microbatches must be a positive integer, got 0", "microbatches"),
        (
            dict(grad_accum=2, microbatches=16),
            r"micro-batch 8 \(batch_size 16 / grad_accum 2\) cannot be split into 16 pipeline micro-batches",
            "microbatches",
        ),
        (dict(rules="fsdp"), r"the rules do not put 'layers' on it; add the rule \[layers, stage\]", "stage"),
        (
            dict(rules=pt.Rules([("layers", "stage"), ("batch", ("stage", "data"))])),
            r"'stage' axis cannot also split the batch",
            "stage",
        ),
        (dict(model=small_gpt(scan_layers=False)), r"no stacked 'layers' axis to split into stages", "stage"),
        (dict(axis_types="explicit"), r"use axis_types 'auto'", "axis_types"),
        (
            dict(microbatches=1, pipeline_repeats=2),
            r"the circular schedule \(pipeline_repeats 2\) needs at least as many micro-batches as stages: "
            r"microbatches 1 < 2 stages; use microbatches >= 2",
            "microbatches",
        ),
        (
            dict(pipeline_repeats=4),
            r"4 layers cannot be split into 2 stages x 4 repeats: the number of layers must be a multiple of 8",
            "repeats",
        ),
        (dict(pipeline_repeats=0), r"pipeline_repeats must be a positive integer, got 0", "repeats"),
    ],
)
def test_pipeline_layouts_that_cannot_run_are_refused(kw, match, arg, runs):
    model = kw.pop("model", small_gpt())
    rules = kw.pop("rules", "pp")
    shape = {"stage": 2, "data": 2, "fsdp": 2} if rules == "fsdp" else {"stage": 2, "data": 4}
    mesh = pt.make_mesh(shape, kw.pop("axis_types", "auto"))
    with pytest.raises(PipelineError, match=match) as e:
        pt.Trainer(model, pt.make_optimizer("sgd", lr=0.1, total_steps=1), mesh, rules, batch_size=16, seq_len=8, **kw)
    assert e.value.arg == arg


def test_a_pipeline_micro_batch_must_split_over_the_batch_axes():
    with pytest.raises(
        pt.ShardingError,
        match=r"pipeline micro-batch 2 \(batch_size 16 / microbatches 8\) is not "
        r"divisible by the batch mesh axes \('data',\) of size 4",
    ):
        pt.Trainer(
            small_gpt(layers=2),
            pt.make_optimizer("sgd", lr=0.1, total_steps=1),
            pt.make_mesh({"stage": 2, "data": 4}),
            "pp",
            batch_size=16,
            seq_len=8,
            microbatches=8,
        )


@pytest.mark.parametrize(
    "edit,key,message",
    [
        (
            "shape: {stage: 3, data: 2}\n  devices: 6",
            "mesh.shape.stage",
            "4 layers cannot be split into 3 pipeline stages",
        ),
        (
            "shape: {stage: 2, data: 4}\n  devices: 8\ntrain: {batch_size: 16, seq_len: 8, microbatches: 5}",
            "train.microbatches",
            "batch_size 16 cannot be split into 5 pipeline micro-batches",
        ),
        (
            "shape: {stage: 2, data: 4}\n  devices: 8\ntrain: {batch_size: 16, seq_len: 8, pipeline_repeats: 4}",
            "train.pipeline_repeats",
            "4 layers cannot be split into 2 stages x 4 repeats",
        ),
    ],
)
def test_config_errors_name_the_key(edit, key, message, write):
    text = f"model: {{name: gpt, embed: 32, heads: 4, mlp: 64, layers: 4}}\nmesh:\n  {edit}\nrules: pp\n"
    if "train:" not in text:
        text += "train: {batch_size: 12, seq_len: 8}\n"
    path = write("pp.yaml", text)
    cfg = load_config(path)
    line = [i + 1 for i, src in enumerate(text.splitlines()) if key.split(".")[-1] + ":" in src][0]
    with pytest.raises(PipelineError) as e:
        trainer_from_config(cfg, pt.make_mesh(cfg.mesh.shape, devices=jax.devices()[: cfg.mesh.devices]))
    assert str(e.value).startswith(f"{path}:{line}: {key}: {message}")


# -- models the user brings -------------------------------------------------------------------


class NNXPipelinedGPT(NNXGPT):
    """The NNX twin of the reference GPT with its scan over blocks replaced by scan_layers."""

    def __call__(self, tokens):
        x = jax.numpy.take(self.embedding[...], tokens, axis=0)
        x = pt.with_logical_constraint(x, ("batch", "length", "embed"))
        x = scan_layers(self.blocks, x)
        logits = jax.numpy.einsum("btd,dv->btv", self.final_norm(x), self.unembed[...]).astype(jax.numpy.float32)
        return pt.with_logical_constraint(logits, ("batch", "length", "vocab"))


def test_an_nnx_model_pipelines_with_scan_layers(runs, reference):
    model = pt.NNXModel(lambda rngs: NNXPipelinedGPT(embed=32, heads=4, mlp=64, layers=4, rngs=rngs))
    mesh, rules, m = LAYOUTS["pp-S2"]
    tr = runs.trainer(model, mesh, rules, microbatches=m)
    ref_state0 = reference[0].init(jax.random.key(0))
    assert [leaf.spec for leaf in tr.state_layouts() if "blocks" in leaf.path][0][0] == "stage"
    state = tr.init(jax.random.key(0))

    def copy(tree, shardings):
        return jax.tree.map(lambda a, sh: jax.device_put(np.asarray(a), sh), tree, shardings)

    state = state.replace(
        params=copy(ref_state0.params, tr.state_shardings.params),
        opt_state=copy(ref_state0.opt_state, tr.state_shardings.opt_state),
    )
    data = runs.batches(tr)
    losses = []
    for k in range(3):
        state, metrics = tr.train_step(state, data.batch_at(k))
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, reference[2], rtol=1e-4)


class Block(nn.Module):
    """A user's Linen block in nn.scan's style, with a per-example argument (a mask) and a flag."""

    @nn.compact
    def __call__(self, x, mask, scale):
        w = self.param(
            "w",
            pt.with_logical_partitioning(jax.nn.initializers.lecun_normal(), ("embed", "mlp")),
            (x.shape[-1], x.shape[-1]),
        )
        return x + scale * jax.numpy.tanh(x @ w) * mask[:, :, None], None


def test_a_linen_block_with_per_example_arguments_pipelines(mesh_of):
    stack = LayerStack(Block, length=4, name="blocks")
    x = jax.random.normal(jax.random.key(1), (8, 4, 16))
    mask = (jax.random.uniform(jax.random.key(2), (8, 4)) > 0.3).astype(jax.numpy.float32)
    variables = pt.unbox(stack.init(jax.random.key(0), x, mask, 0.5))
    assert variables["params"]["w"].shape == (4, 16, 16)  # nn.scan's layout: a leading layers axis
    ref, _ = stack.apply(variables, x, mask, 0.5)
    with pt.sharding_context(pt.make_mesh({"stage": 4, "data": 2}), "pp"), microbatching(4):
        y, _ = jax.jit(lambda v, x, m: stack.apply(v, x, m, 0.5))(variables, x, mask)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
