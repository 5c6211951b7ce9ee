"""Trainable subsets: frozen params get no gradient, no optimizer state, and are written once per run.

One small training (module-scoped) with checkpoints every 2 steps is shared by most tests.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.checkpoint.disk import dir_bytes, flat_saved, resolve_checkpoint, saved_tree
from partitioning.checkpoint.frozen import FROZEN_DIR, frozen_ref
from partitioning.errors import ConfigError
from partitioning.finetune.trainable import param_paths, split_tree
from partitioning.models import GPT, MLP

MODEL = GPT(vocab_size=64, embed=32, heads=2, mlp=64, layers=2)
TRAINABLE = ["blocks/mlp/wo", "final_norm"]
FROZEN = {
    "blocks/attn/k",
    "blocks/attn/o",
    "blocks/attn/q",
    "blocks/attn/v",
    "blocks/attn_norm/scale",
    "blocks/mlp/wi_0",
    "blocks/mlp/wi_1",
    "blocks/mlp_norm/scale",
    "embedding",
    "unembed",
}
STEPS = 6


def optimizer():
    return pt.make_optimizer("adamw", lr=1e-2, total_steps=STEPS, weight_decay=0.1, clip_norm=1.0)


def batches(trainer):
    return pt.data.TokenBatches((np.arange(8192) * 7) % 64, trainer.batch_size, 16, trainer.batch_sharding)


def host(tree):
    return jax.tree.map(np.asarray, tree)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """6 steps of a frozen-subset run, saved every 2 steps (keep 2): the states, losses and the run dir."""
    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    trainer = pt.Trainer(MODEL, optimizer(), mesh, "fsdp", batch_size=8, seq_len=16, trainable=TRAINABLE)
    data = batches(trainer)
    directory = tmp_path_factory.mktemp("run") / "checkpoints"
    state = trainer.init(jax.random.key(0))
    first = host(state.params)
    losses, sizes = [], {}
    manager = pt.CheckpointManager(
        directory, every=2, keep=2, rules="fsdp", abstract=trainer.abstract_state, frozen=trainer.frozen
    )
    with manager as mngr:
        for i in range(STEPS):
            state, metrics = trainer.train_step(state, data.batch_at(i))
            losses.append(float(metrics["loss"]))
            if mngr.save(int(state.step), state):
                mngr.wait()
                sizes[int(state.step)] = dir_bytes(directory / str(int(state.step)))
    return {
        "trainer": trainer,
        "first": first,
        "state": state,
        "losses": losses,
        "dir": directory,
        "sizes": sizes,
        "data": data,
    }


def test_frozen_paths_and_the_error_for_a_regex_matching_nothing():
    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    trainer = pt.Trainer(MODEL, optimizer(), mesh, "fsdp", batch_size=8, seq_len=16, trainable=TRAINABLE)
    assert trainer.frozen == FROZEN
    with pytest.raises(ConfigError, match=r"^trainable: 'lora' matches no parameter \(12 params: blocks/attn/k, "):
        pt.Trainer(MODEL, optimizer(), mesh, "fsdp", batch_size=8, seq_len=16, trainable=["wo", "lora"])
    with pytest.raises(ConfigError, match=r"^trainable: '\(' is not a valid regex: missing \), unterminated"):
        pt.finetune.trainable_paths(["("], ["embedding"])
    with pytest.raises(ConfigError, match="an empty list trains nothing"):
        pt.finetune.trainable_paths([], ["embedding"])
    # a model with LoRA adapters: only they train unless told otherwise
    lora = GPT(vocab_size=64, embed=32, heads=2, mlp=64, layers=2, lora={"rank": 2, "targets": ["mlp/wo"]})
    trainer = pt.Trainer(lora, optimizer(), mesh, "fsdp", batch_size=8, seq_len=16)
    assert trainer.frozen == FROZEN | {"blocks/mlp/wo", "final_norm/scale"}
    trainer = pt.Trainer(lora, optimizer(), mesh, "fsdp", batch_size=8, seq_len=16, trainable=["lora_b", "norm"])
    assert "blocks/mlp/wo_lora_a" in trainer.frozen and "blocks/mlp/wo_lora_b" not in trainer.frozen


def test_frozen_params_bit_identical_while_trainable_ones_move(run):
    before, after = run["first"], host(run["state"].params)
    for path, a, b in zip(param_paths(before), jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        if path in FROZEN:
            assert np.array_equal(a, b), path
        else:
            assert not np.array_equal(a, b), path
    assert run["losses"][-1] < run["losses"][0]


def test_optimizer_state_holds_nothing_for_frozen_params(run):
    state = run["state"]
    paths = [pt.layout.path_str(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]]
    assert not [p for p in paths if any(p.endswith("/" + f) for f in FROZEN)]
    trainable, frozen = split_tree(host(state.params), lambda p: p not in FROZEN)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(trainable))
    # adam's two moments per trainable param; the rest are scalars (count, learning rate, ...)
    moments = sum(x.nbytes for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert moments == 2 * param_bytes
    assert param_bytes < sum(x.nbytes for x in jax.tree.leaves(frozen)) / 3
    # the abstract state (what plan prices) says the same
    _, opt_abstract = pt.abstract_train_state(MODEL, optimizer(), batch_size=8, seq_len=16, trainable=TRAINABLE)
    assert sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pt.unbox(opt_abstract)) if x.ndim) == moments


def test_everything_trainable_equals_full_training_with_zero1_and_grad_accum():
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})

    def losses(trainable):
        trainer = pt.Trainer(
            MLP(),
            optimizer(),
            mesh,
            pt.Rules([("batch", ("data", "fsdp"))]),  # ZeRO-1: params replicated, optimizer state sharded
            batch_size=16,
            seq_len=16,
            grad_accum=2,
            optimizer_rules="fsdp",
            trainable=trainable,
        )
        state, data, out = trainer.init(jax.random.key(0)), batches(trainer), []
        for i in range(2):
            state, metrics = trainer.train_step(state, data.batch_at(i))
            out.append((float(metrics["loss"]), float(metrics["grad_norm"])))
        return out, trainer.frozen

    full, none_frozen = losses(None)
    assert none_frozen == frozenset()
    assert losses([".*"]) == (full, frozenset())


def test_frozen_params_written_once_per_run(run):
    directory, trainer = run["dir"], run["trainer"]
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith("_")) == ["4", "6", FROZEN_DIR]
    assert sorted(p.name for p in (directory / FROZEN_DIR).iterdir()) == ["2"]  # written at the first save
    ref = resolve_checkpoint(directory)
    from partitioning.checkpoint.base import base_digest

    digest = base_digest(directory / FROZEN_DIR / "2")  # the base's identity: its checksums' digest
    assert frozen_ref(ref) == {"dir": FROZEN_DIR, "step": 2, "paths": sorted(FROZEN), "digest": digest}
    saved = flat_saved(saved_tree(ref))
    assert not [p for p in saved if p.startswith("params/") and p[len("params/") :] in FROZEN]
    # each step holds the trainable params, their moments and scalars; the frozen bytes once, in frozen/2
    values = sum(int(np.prod(md.shape)) * jnp.dtype(md.dtype).itemsize for md in saved.values())
    trainable, frozen = split_tree(host(run["state"].params), trainer.subset.trains)
    assert values == 3 * sum(x.nbytes for x in jax.tree.leaves(trainable)) + 4 * 3 + 4 * 2  # step, counts, lr
    frozen_bytes = sum(x.nbytes for x in jax.tree.leaves(frozen))
    assert dir_bytes(directory / FROZEN_DIR / "2") > frozen_bytes
    assert all(n < frozen_bytes for n in run["sizes"].values()), run["sizes"]


def test_resumed_run_continues_with_identical_losses(run):
    trainer = run["trainer"]
    target = pt.abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    state = pt.restore_checkpoint(run["dir"], target, step=4)
    assert int(state.step) == 4
    for a, b in zip(jax.tree.leaves(host(state.params)), jax.tree.leaves(run["first"]), strict=True):
        assert a.shape == b.shape
    losses = []
    for i in range(4, STEPS):
        state, metrics = trainer.train_step(state, run["data"].batch_at(i))
        losses.append(float(metrics["loss"]))
    assert losses == run["losses"][4:]
    for a, b in zip(jax.tree.leaves(host(state.params)), jax.tree.leaves(host(run["state"].params)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_missing_frozen_params_are_one_line(run, tmp_path):
    import shutil

    copy = tmp_path / "checkpoints"
    shutil.copytree(run["dir"], copy)
    shutil.rmtree(copy / FROZEN_DIR)
    trainer = run["trainer"]
    target = pt.abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    with pytest.raises(pt.CheckpointError) as e:
        pt.restore_checkpoint(copy, target)
    assert str(e.value) == (  # a step without its base is damaged, as every reader says it
        f"checkpoint step 6 ({copy / '6'}) is damaged: its frozen params {copy / FROZEN_DIR / '2'} are missing "
        "(written once per run, every step refers to them); not restored; no earlier good step: start over with "
        "--no-resume"
    )


def test_restore_onto_another_mesh_yields_the_full_params(run):
    tp = pt.make_mesh({"data": 4, "tensor": 2})
    want = pt.abstract_target(run["trainer"].abstract_state.params, tp, "tp")
    specs = jax.tree.map(lambda x: x.sharding.spec, want)
    state = pt.restore_checkpoint(run["dir"], mesh=tp, rules="tp")  # no model: by the recorded names
    assert jax.tree.map(lambda x: x.sharding.spec, state["params"]) == specs
    np.testing.assert_array_equal(np.asarray(state["params"]["embedding"]), run["first"]["embedding"])
    params = pt.restore_checkpoint(run["dir"], want, params_only=True)  # as export-hf and generate read
    assert jax.tree.map(lambda x: x.sharding.spec, params) == specs
    assert params["blocks"]["mlp"]["wo"].sharding.spec == jax.P(None, "tensor", None)
    for a, b in zip(jax.tree.leaves(host(params)), jax.tree.leaves(host(run["state"].params)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_plan_prices_frozen_params_without_gradients_or_moments():
    params, opt_state = pt.abstract_train_state(MODEL, optax.adam(1e-3), batch_size=8, seq_len=16, trainable=TRAINABLE)
    plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 8}, "fsdp", frozen=FROZEN)
    full = pt.build_plan(
        *pt.abstract_train_state(MODEL, optax.adam(1e-3), batch_size=8, seq_len=16), {"data": 1, "fsdp": 8}, "fsdp"
    )
    t = plan.totals
    # mlp/wo: 2 layers x 64 x 32 float32 = 16384 B; final_norm 32 x 4 = 128 B
    assert t["trainable"]["total"] == 16384 + 128
    assert t["gradients"]["total"] == t["trainable"]["total"]
    assert t["frozen"]["total"] == full.totals["params"]["total"] - t["trainable"]["total"]
    assert t["optimizer"]["total"] == 2 * t["trainable"]["total"] + 4  # mu, nu and the count
    assert t["total"]["total"] == t["params"]["total"] + 3 * t["trainable"]["total"] + 4
    assert plan.to_json()["trainable_parameters"] == (16384 + 128) // 4


YAML = """\
model:
  name: gpt
  vocab_size: 64
  embed: 32
  heads: 2
  mlp: 64
  layers: 2
mesh:
  shape: {data: 1, fsdp: -1}
rules: fsdp
train:
  steps: 2
  batch_size: 8
  seq_len: 16
  trainable:
    - blocks/mlp/wo
    - BAD
"""


def test_config_errors_point_at_the_regex_and_plan_prices_the_subset(tmp_path, run_cli_in_process):
    from partitioning.config.planning import plan_from_config

    bad = tmp_path / "bad.yaml"
    bad.write_text(YAML.replace("BAD", "'lora_[ab]$'"))
    with pytest.raises(ConfigError) as e:
        plan_from_config(pt.load_config(bad), devices=8)
    assert str(e.value).startswith(f"{bad}:17: train.trainable[1]: trainable: 'lora_[ab]$' matches no parameter (12 ")
    result = run_cli_in_process("plan", bad, "--no-compile")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {e.value}"]
    good = tmp_path / "good.yaml"
    good.write_text(YAML.replace("BAD", "final_norm"))
    plan, _ = plan_from_config(pt.load_config(good), devices=8)
    assert plan.frozen == FROZEN
    assert plan.totals["gradients"]["total"] == plan.totals["trainable"]["total"] == 16384 + 128
