"""Models, losses and datasets named in YAML with `_target_`, run through the CLI as a user would:
the model file beside the config, relative paths, no launcher script."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.model import registry

MODELS = Path(__file__).parent / "models"
LM1B = Path(__file__).parents[2] / "examples" / "lm1b" / "models.py"

LM = """\
model:
  _target_: lm_linen.TransformerLM
  config:
    _target_: lm_linen.TransformerConfig
    num_heads: 8
    dropout_rate: 0.0
    attention_dropout_rate: 0.0
mesh:
  shape: {shape}
  devices: 8
rules: {rules}
train:
  steps: 3
  batch_size: 8
  seq_len: 32
  loss: same_token
  log_every: 1
  eval_every: 3
  eval_batches: 1
checkpoint:
  async: false
run_dir: runs/{name}
"""


def lm_config(name, rules="fsdp", shape="{data: 1, fsdp: -1}"):
    return LM.format(name=name, rules=rules, shape=shape)


@pytest.fixture
def workdir(tmp_path):
    """A folder holding the model files beside the configs, as a user's project would."""
    for f in ("gpt_nnx.py", "image_linen.py"):
        shutil.copy(MODELS / f, tmp_path / f)
    shutil.copy(LM1B, tmp_path / "lm_linen.py")  # the shipped example's model, under another module name
    return tmp_path


def losses(run_dir):
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.slow  # ~60 s: four CLI processes that compile
def test_plan_train_and_reshard_a_target_model_from_yaml(workdir, run_cli_subprocess):
    (workdir / "lm.yaml").write_text(lm_config("fsdp"))
    (workdir / "lm_tp.yaml").write_text(lm_config("tp", rules="tp", shape="{data: 2, tensor: 4}"))
    r = run_cli_subprocess("plan", "lm.yaml", "--no-compile", "--json", "plan.json", cwd=workdir)
    assert r.returncode == 0, r.stderr
    plan = json.loads((workdir / "plan.json").read_text())
    rows = {row["path"]: row for row in plan["leaves"]}
    q = rows["params/block_0/MultiHeadDotProductAttention_0/query/kernel"]
    assert q["logical"] == ["embed", "kv"] and q["spec"] == "P('fsdp', None, None)" and q["shape"] == [64, 8, 8]
    assert plan["model"]["name"] == "lm_linen.TransformerLM"
    r = run_cli_subprocess("train", "lm.yaml", "--no-progress", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert "task same_token" in r.stdout
    r = run_cli_subprocess("train", "lm_tp.yaml", "--no-progress", cwd=workdir)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(losses(workdir / "runs/tp"), losses(workdir / "runs/fsdp"), rtol=1e-4)
    r = run_cli_subprocess("ckpt", "reshard", "runs/fsdp", "--config", "lm_tp.yaml", "--out", "resharded", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("resharded step 3: ") and "to {data: 2, tensor: 4}" in r.stdout
    assert r.stdout.rstrip().endswith(" -> resharded/3")  # the --out given, relative as typed
    saved = pt.checkpoint.checkpoint_metadata(workdir / "resharded")
    assert saved["arrays"]["params/logits/kernel"]["spec"] == [None, "tensor"]
    # The resharded values are the fsdp run's, bit for bit.
    for p in ("params/logits/kernel", "params/block_1/FeedForward_0/Dense_0/kernel"):
        assert (
            saved["arrays"][p]["shape"]
            == pt.checkpoint.checkpoint_metadata(workdir / "runs/fsdp")["arrays"][p]["shape"]
        )
    import orbax.checkpoint as ocp

    old = ocp.StandardCheckpointer().restore(workdir / "runs/fsdp/checkpoints/3/state")
    new = ocp.StandardCheckpointer().restore(workdir / "resharded/3/state")
    for x, y in zip(jax.tree.leaves(old), jax.tree.leaves(new), strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow  # ~25 s
def test_an_nnx_model_from_yaml_gets_rngs_and_trains(workdir, run_cli_subprocess):
    (workdir / "nnx.yaml").write_text(
        "model: {_target_: gpt_nnx.GPT, embed: 32, heads: 4, mlp: 64, layers: 2}\n"
        "mesh: {shape: {data: 1, fsdp: -1, tensor: 2}, devices: 8}\nrules: fsdp_tp\n"
        "train: {steps: 2, batch_size: 8, seq_len: 32, log_every: 1, eval_batches: 0}\nrun_dir: runs/nnx\n"
    )
    r = run_cli_subprocess("train", "nnx.yaml", "--no-progress", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert len(losses(workdir / "runs/nnx")) == 2
    meta = pt.checkpoint.checkpoint_metadata(workdir / "runs/nnx")
    assert meta["arrays"]["params/blocks/mlp/wi_0"]["spec"] == [None, "fsdp", "tensor"]


def test_a_dataset_and_loss_from_yaml(workdir, run_cli_in_process, monkeypatch):
    monkeypatch.chdir(workdir)
    (workdir / "img.yaml").write_text(
        "model: {_target_: image_linen.ConvNet, classes: 8}\n"
        "mesh: {shape: {data: 8}}\nrules: dp\n"
        "data: {_target_: image_linen.bars, n: 256}\n"
        "train: {steps: 2, batch_size: 16, loss: classification, log_every: 1, eval_batches: 1}\n"
        "run_dir: runs/img\n"
    )
    r = run_cli_in_process("train", "img.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "task classification; data bars: 224 train examples" in r.stdout
    assert pt.checkpoint.checkpoint_metadata("runs/img")["arrays"]["collections/batch_stats/BatchNorm_0/mean"][
        "shape"
    ] == [32]


@pytest.mark.parametrize(
    "edit, error",
    [
        (
            lambda t: t.replace("num_heads: 8", "num_haeds: 8"),
            "lm.yaml:5: model.config.num_haeds: 'lm_linen.TransformerConfig' has no option 'num_haeds' "
            "(options: vocab_size, emb_dim, num_heads, num_layers, qkv_dim, mlp_dim, max_len, dropout_rate, "
            "attention_dropout_rate, deterministic, dtype, kernel_init); did you mean 'num_heads'?",
        ),
        (
            lambda t: t.replace("num_heads: 8", "num_heads: many"),
            "lm.yaml:5: model.config.num_heads: expected int, got str 'many'",
        ),
        (
            lambda t: t.replace("_target_: lm_linen.TransformerLM", "_target_: lm_linnen.TransformerLM"),
            "lm.yaml:2: model._target_: no module named 'lm_linnen' (looked beside the config in . and on sys.path)",
        ),
        (
            lambda t: t.replace("_target_: lm_linen.TransformerLM", "_target_: lm_linen.TransformerLN"),
            "lm.yaml:2: model._target_: module 'lm_linen' has no attribute 'TransformerLN'; did you mean "
            "'TransformerLM'?",
        ),
        (
            lambda t: t.replace("loss: same_token", "loss: same_tokn"),
            "lm.yaml:16: train.loss: unknown loss 'same_tokn' (built in: next_token, same_token, classification; or a "
            "function via _target_); did you mean 'same_token'?",
        ),
        (
            lambda t: t.replace("  _target_: lm_linen.TransformerLM\n", ""),
            "lm.yaml:1: model: expected a mapping with a 'name' key (a registered model, e.g. {name: gpt}), a "
            "'_target_' key (module.Class, e.g. {_target_: my_models.Transformer}) or an 'hf' key (a Hugging Face "
            "checkpoint folder)",
        ),
    ],
)
def test_bad_targets_are_one_line_at_file_line(workdir, run_cli_in_process, monkeypatch, edit, error):
    monkeypatch.chdir(workdir)
    (workdir / "lm.yaml").write_text(edit(lm_config("x")))
    r = run_cli_in_process("check", "lm.yaml")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {error}"]


def test_a_registered_nnx_class_and_a_forward_adapter(workdir, run_cli_in_process, monkeypatch):
    from tests.byom.models.gpt_nnx import GPT

    monkeypatch.chdir(workdir)
    # A private copy of the registry, so other tests' "registered: ..." messages do not see the twin.
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    pt.register_model("gpt_nnx_twin", GPT)
    (workdir / "glue.py").write_text(
        "def inputs(batch):\n    return {'tokens': batch['inputs']}   # the model's own argument name\n"
    )
    (workdir / "reg.yaml").write_text(
        "model: {name: gpt_nnx_twin, embed: 32, heads: 4, mlp: 64, layers: 2}\n"
        "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\n"
        "train: {steps: 1, batch_size: 8, seq_len: 16, eval_batches: 0, inputs: {_target_: glue.inputs}}\n"
        "run_dir: runs/reg\n"
    )
    r = run_cli_in_process("train", "reg.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert pt.checkpoint.checkpoint_metadata("runs/reg")["arrays"]["params/embedding"]["spec"] == [None, "fsdp"]
    (workdir / "bad.yaml").write_text((workdir / "reg.yaml").read_text().replace("heads: 4", "haeds: 4"))
    r = run_cli_in_process("check", "bad.yaml")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: bad.yaml:1: model.haeds: model 'gpt_nnx_twin' has no option 'haeds' "
        "(options: vocab_size, embed, heads, mlp, layers, rngs); did you mean 'heads'?"
    )
