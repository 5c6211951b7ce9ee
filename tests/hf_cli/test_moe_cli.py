"""A Hugging Face mixture of experts from YAML on an expert-parallel layout: fine-tune, resume, export.

One run of ``configs/hf_tiny_moe.yaml`` (a tiny Qwen3-MoE that transformers made, its experts split
over `expert`) on a small text file, in a copy of the repository's layout, shared by the stages.
"""

import json
import shutil

import numpy as np
import pytest

from tests.hf.conftest import tensors_of
from tests.hf_cli.test_cli import REPO, cli

FIXTURE = "tests/fixtures/hf/qwen3_moe"
RUN = ["--no-progress", "--set", "data.path=text.py", "--set", "train.tracker=[jsonl]"]
STEPS = ["--set", "train.steps=6", "--set", "train.eval_every=3", "--set", "train.log_every=1"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_moe_cli")
    (root / "configs").mkdir()
    shutil.copy(REPO / "configs" / "hf_tiny_moe.yaml", root / "configs")
    shutil.copytree(REPO / FIXTURE, root / FIXTURE)
    # A small corpus of its own: a few copies of this package's sources, tokenized in a second.
    text = "".join((REPO / "partitioning" / "parallel" / n).read_text() for n in ("experts.py", "pipeline.py"))
    (root / "text.py").write_text(text * 3)
    return root


def records(work):
    return [json.loads(x) for x in (work / "runs/hf_tiny_moe/metrics.jsonl").read_text().splitlines()]


def test_fine_tune_on_ep_resume_and_export(work, monkeypatch):
    r = cli(work, "train", "configs/hf_tiny_moe.yaml", *RUN, *STEPS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on mesh {'data': 1, 'fsdp': 2, 'expert': 4}" in r.stdout
    assert "train: starting from the Hugging Face weights in tests/fixtures/hf/qwen3_moe" in r.stdout
    evals = [(x["step"], x["eval_loss"]) for x in records(work) if "eval_loss" in x]
    assert [s for s, _ in evals] == [1, 3, 6] and evals[-1][1] < evals[0][1] - 0.3, evals
    meta = json.loads((work / "runs/hf_tiny_moe/checkpoints/6/meta/metadata").read_text())
    assert meta["hf"]["options"]["capacity_factor"] == 1.5

    # Resume: from the run's own checkpoint.
    r = cli(work, "train", "configs/hf_tiny_moe.yaml", *RUN, *STEPS, "--set", "train.steps=8")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checkpoint: resumed from step 6" in r.stdout and records(work)[-1]["step"] == 8

    # Export: one tensor per expert, as the source was; the experts trained.
    r = cli(work, "ckpt", "export-hf", "runs/hf_tiny_moe", "exported", "--step", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    source, out = tensors_of(work / FIXTURE), tensors_of(work / "exported")
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {k: (v.shape, v.dtype) for k, v in source.items()}
    expert = "model.layers.1.mlp.experts.3.down_proj.weight"
    assert not np.array_equal(out[expert], source[expert])
    assert json.loads((work / "exported/config.json").read_text())["architectures"] == ["Qwen3MoeForCausalLM"]

    # The export, loaded as a user would onto the ep mesh: the run's eval loss at step 6, on its eval batches.
    from partitioning.config import load_config
    from partitioning.config.build import mesh_from_config, trainer_from_config
    from partitioning.config.hf import hf_params_from_config
    from partitioning.config.run import data_from_config

    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(work / "cache"))
    cfg = load_config("configs/hf_tiny_moe.yaml", ["data.path=text.py", "train.steps=6", "model.hf=exported"])
    mesh = mesh_from_config(cfg)
    trainer = trainer_from_config(cfg, mesh)
    _, _, evals_fn = data_from_config(cfg, trainer)
    params = hf_params_from_config(cfg, mesh)
    assert params["blocks"]["mlp"]["wi_0"].sharding.spec[1] == "expert"
    loss = np.mean([float(trainer.eval_step(params, b)["loss"]) for b in evals_fn()])
    assert abs(loss - evals[-1][1]) < 1e-5, (loss, evals)
