"""Flax's NNX Gemma style (mesh-axis names, ``einsum(..., out_sharding=)``) on Explicit axes, end to end.

The model traces only on Explicit axes: every command traces it under the config's ``mesh.axis_types``,
and on Auto axes every command says so in one line (the model, its line, JAX's message), never a traceback.
"""

import json
import re
import shutil
from pathlib import Path

import jax
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt

MODELS = Path(__file__).parent / "models"
CONFIG = """\
model: {{_target_: gemma_nnx.Gemma, embed: 32, heads: 4, head_dim: 8, hidden: 64, layers: 2}}
mesh: {{shape: {{data: 1, fsdp: 4, tensor: 2}}, axis_types: {types}, devices: 8}}
rules: fsdp_tp
train: {{steps: 2, batch_size: 8, seq_len: 16, log_every: 1, eval_batches: 0}}
checkpoint: {{async: false}}
run_dir: runs/gemma
"""
# (tune traces on size-1 axes: {data: 1, fsdp: 1, tensor: 1})
ONE_LINE = re.compile(
    r"error: gemma_nnx\.Gemma: the forward pass fails to trace on mesh \{data: 1, fsdp: [14], tensor: [12]\} "
    r"\(auto axes\) at gemma_nnx\.py:68 in Attention\.__call__: ValueError: PartitionSpec passed to einsum "
    r"cannot contain axis names that are of type Auto or Manual\."
)


@pytest.fixture
def workdir(tmp_path):
    shutil.copy(MODELS / "gemma_nnx.py", tmp_path / "gemma_nnx.py")
    (tmp_path / "explicit.yaml").write_text(CONFIG.format(types="explicit"))
    (tmp_path / "auto.yaml").write_text(CONFIG.format(types="auto"))
    return tmp_path


@pytest.mark.slow  # ~40 s: four CLI processes, two of which compile the step
def test_check_plan_tune_train_on_explicit_axes(workdir, run_cli_subprocess):
    r = run_cli_subprocess("check", "explicit.yaml", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK: explicit.yaml: model gemma_nnx.Gemma (28,832 parameters, 20 arrays)")
    r = run_cli_subprocess("plan", "explicit.yaml", "--no-compile", "--json", "plan.json", cwd=workdir)
    assert r.returncode == 0, r.stderr
    rows = {row["path"]: row for row in json.loads((workdir / "plan.json").read_text())["leaves"]}
    assert rows["params/blocks/0/attn/q/kernel"]["spec"] == "P('tensor', 'fsdp', None)"
    assert rows["params/embedder/embedding"]["spec"] == "P('tensor', 'fsdp')"
    # Mesh-axis names are not "names no rule mentions".
    assert "no rule mentions" not in r.stdout
    r = run_cli_subprocess("tune", "explicit.yaml", "--compile", "0", "--json", "tune.json", cwd=workdir)
    assert r.returncode == 0, r.stderr
    ranked = json.loads((workdir / "tune.json").read_text())["search"]["ranked"]
    # Every candidate mesh keeps the axes the model names itself, so the best layout runs.
    assert ranked and all({"fsdp", "tensor"} <= set(c["mesh"]) for c in ranked)
    r = run_cli_subprocess("train", "explicit.yaml", "--no-progress", cwd=workdir)
    assert r.returncode == 0, r.stderr
    losses = [json.loads(line)["loss"] for line in (workdir / "runs/gemma/metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2
    saved = pt.checkpoint.checkpoint_metadata(workdir / "runs/gemma")["arrays"]
    assert saved["params/blocks/0/ffw/gate/kernel"]["spec"] == ["fsdp", "tensor"]


@pytest.mark.parametrize(
    "command", [("check",), ("plan", "--no-compile"), ("rules", "explain"), ("tune", "--compile", "0"), ("train",)]
)
def test_a_model_that_fails_to_trace_is_one_line_in_every_command(command, workdir, run_cli_in_process, monkeypatch):
    monkeypatch.chdir(workdir)
    r = run_cli_in_process(*command, "auto.yaml")
    assert r.returncode == 2
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert ONE_LINE.match(line), line
    assert "Traceback" not in r.stderr
    assert not (workdir / "runs").exists()  # a failed command changes nothing on disk


def test_from_python_the_trace_uses_the_mesh_axis_types(workdir, monkeypatch):
    monkeypatch.syspath_prepend(str(workdir))
    from gemma_nnx import Gemma

    model = pt.NNXModel(lambda rngs: Gemma(rngs=rngs))
    params, _ = pt.abstract_train_state(model, optax.sgd(0.1), batch_size=8, seq_len=16)
    sizes = {"data": 1, "fsdp": 4, "tensor": 2}
    names = pt.plan.activation_names(model, params, sizes, "fsdp_tp", batch_size=8, seq_len=16, axis_types="explicit")
    assert ("batch", None) in names
    # A Mesh carries its own axis types.
    explicit = pt.make_mesh(sizes, axis_types="explicit")
    assert pt.plan.activation_names(model, params, explicit, "fsdp_tp", batch_size=8, seq_len=16) == names
    with pytest.raises(pt.ModelError, match=r"^gemma_nnx\.Gemma: the forward pass fails to trace on mesh .* \(auto"):
        pt.plan.activation_names(model, params, sizes, "fsdp_tp", batch_size=8, seq_len=16)
    layouts = {leaf.path: leaf.spec for leaf in pt.tree_layouts(params, explicit, "fsdp_tp")}
    assert layouts["blocks/0/attn/o/kernel"] == P("tensor", None, "fsdp")
    assert jax.sharding.get_abstract_mesh().empty
