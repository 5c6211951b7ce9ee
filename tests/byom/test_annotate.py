"""Models nobody annotated, used as written from `_target_`: `partitioning annotate` proposes a table, and with
it (`base:`) plan shards < 5% replicated under fsdp and fsdp_tp, train gives the same losses under dp, fsdp and
fsdp_tp, the checkpoint restores onto another layout, and bad tables are one line at file:line.

The CNN is Flax's ImageNet ResNet-50 (flax/examples/imagenet/models.py, copied unchanged as
models/flax_resnet.py): its bottleneck blocks with projection shortcuts, at 8 filters, one block per stage
and 16x16 images so it stays cheap (the full depth only repeats the same rows: 4x the tracing time).
"""

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from ruamel.yaml import YAML

import partitioning as pt
from partitioning.cli import main
from partitioning.config.build import mesh_from_config, trainer_from_config

MODELS = Path(__file__).parent / "models"
FILES = ("flax_resnet.py", "plain_linen_lm.py", "plain_nnx_mlp.py", "pytree_lm.py", "image_linen.py")
LM_TRAIN = "train: {steps: 20, batch_size: 8, seq_len: 16, log_every: 1, eval_batches: 0}\n"
CONFIGS = {
    "resnet": "model: {_target_: flax_resnet.ResNet50, num_classes: 8, num_filters: 8, stage_sizes: [1, 1, 1, 1]}\n"
    "data: {_target_: image_linen.bars, n: 64}\n"
    "train: {steps: 2, batch_size: 16, loss: classification, eval_batches: 0}\n",
    "linen": "model: {_target_: plain_linen_lm.TransformerLM}\n" + LM_TRAIN,
    "nnx": "model: {_target_: plain_nnx_mlp.MLPLM}\n" + LM_TRAIN,
    "pytree": "model: {_target_: pytree_lm.lm}\n" + LM_TRAIN,
}
MESH = "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\noptimizer: {warmup_steps: 0}\n"
FSDP_TP = ["--set", "rules=fsdp_tp", "--set", "mesh.shape={data: 1, fsdp: 4, tensor: 2}"]
# (model, a path, the names the proposal must give it)
EXPECTED = {
    "resnet": [
        ("params/conv_init/kernel", [None, None, None, "mlp"]),  # 1 input channel: the image's own, not a width
        ("params/BottleneckResNetBlock_3/Conv_1/kernel", [None, None, "embed", "mlp"]),
        ("params/BottleneckResNetBlock_2/conv_proj/kernel", [None, None, "embed", "mlp"]),
        ("params/BottleneckResNetBlock_1/BatchNorm_2/scale", ["mlp"]),
        ("batch_stats/bn_init/mean", ["mlp"]),
        ("params/Dense_0/kernel", ["embed", None]),
    ],
    "linen": [
        ("params/Embed_0/embedding", ["vocab", "embed"]),
        ("params/Block_1/MultiHeadDotProductAttention_0/query/kernel", ["embed", "heads", "kv"]),
        ("params/Block_0/MultiHeadDotProductAttention_0/out/kernel", ["heads", "kv", "embed"]),
        ("params/Block_1/Dense_0/kernel", ["embed", "mlp"]),
        ("params/Block_1/Dense_1/kernel", ["mlp", "embed"]),
        ("params/Dense_0/kernel", ["embed", "vocab"]),
        ("params/position", [None, "embed"]),
    ],
    "nnx": [
        ("params/embed/embedding", ["vocab", "embed"]),
        ("params/layers/1/up/kernel", ["embed", "mlp"]),
        ("params/layers/0/down/kernel", ["mlp", "embed"]),
        ("params/head/kernel", ["embed", "vocab"]),
    ],
    "pytree": [
        ("params/wte", ["vocab", "embed"]),
        ("params/layers/1/w_in", ["embed", "mlp"]),
        ("params/layers/0/b_in", ["mlp"]),
        ("params/lm_head", ["embed", "vocab"]),
    ],
}


def cli(*args):
    """(exit status, stdout, stderr) of the CLI run in this process, as a module fixture can call it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def inside(folder):
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's folder: the model files beside configs, a proposal for each model written by `annotate`."""
    root = tmp_path_factory.mktemp("byom_annotate")
    for f in FILES:
        shutil.copy(MODELS / f, root / f)
    out = {}
    with inside(root):
        for name, text in CONFIGS.items():
            Path(f"{name}.yaml").write_text(text + MESH + f"run_dir: runs/{name}\n")
            out[name] = cli("annotate", f"{name}.yaml", "--out", f"{name}_names.yaml")
            # As the guide says: the run config extends the proposal.
            Path(f"{name}.yaml").write_text(f"base: {name}_names.yaml\n" + Path(f"{name}.yaml").read_text())
    return root, out


def proposal_names(path):
    rows = YAML(typ="safe").load(Path(path).read_text())["annotations"]
    return pt.Annotations(rows)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_annotate_proposes_names_and_plan_shards_all_but_a_few_percent(name, project):
    root, results = project
    code, stdout, stderr = results[name]
    assert code == 0, stderr
    assert stdout.startswith(f"wrote {name}_names.yaml: ") and f"`base: {name}_names.yaml`" in stdout
    table = proposal_names(root / f"{name}_names.yaml")
    for path, names in EXPECTED[name]:
        assert list(table.names_for(path)) == names, path
    with inside(root):
        for extra in ([], FSDP_TP):
            code, _, err = cli("plan", f"{name}.yaml", "--no-compile", "--json", "plan.json", *extra)
            assert code == 0, err
            plan = json.loads(Path("plan.json").read_text())
            total = sum(r["total_bytes"] for r in plan["leaves"])
            replicated = sum(r["total_bytes"] for r in plan["leaves"] if r["replicated"])
            assert replicated / total < 0.05, (extra, [r["path"] for r in plan["leaves"] if r["replicated"]])
            assert all(r["named_by"].startswith(f"{name}_names.yaml:") for r in plan["leaves"] if r["logical"])
            assert "warning:" not in err  # no ReplicationWarning, no unmatched row


def test_a_partly_annotated_model_keeps_its_names_and_gets_the_rest(project):
    root, _ = project
    with inside(root):
        Path("partial.yaml").write_text(
            "annotations: [['Dense_0/kernel$', [null, mlp]]]\n" + CONFIGS["linen"] + MESH + "run_dir: runs/partial\n"
        )
        code, stdout, err = cli("annotate", "partial.yaml")
    assert code == 0, err
    assert "3 already named" in err  # both blocks' Dense_0 kernels and the head's (the row's regex is unanchored)
    table = stdout.split("annotations:\n")[1].splitlines()
    assert table[:2] == ["  # kept: partial.yaml:1: annotations[0]", "  - ['Dense_0/kernel$', [null, mlp]]"]
    assert "Dense_0/kernel" not in "\n".join(table[2:])
    assert "  - ['^params/Block_\\d+/Dense_1/kernel$', [mlp, embed]]\n" in stdout


def test_rules_explain_names_the_row_that_named_each_dimension(project):
    root, _ = project
    with inside(root):
        code, out, err = cli("rules", "explain", "nnx.yaml")
    assert code == 0, err
    line = next(x for x in out.splitlines() if "params/layers/0/up/kernel" in x)
    row = next(i for i, r in enumerate(proposal_names(root / "nnx_names.yaml")) if "up/kernel" in r.pattern)
    text = (root / "nnx_names.yaml").read_text().splitlines()
    number = next(i for i, x in enumerate(text, 1) if "up/kernel" in x and x.lstrip().startswith("- "))
    assert f"name from nnx_names.yaml:{number}: annotations[{row}]" in " ".join(out.split()).replace("│", "")
    assert "rule 1 [embed, fsdp]" in line


@pytest.fixture(scope="module")
def runs(project, corpus):
    """The plain-function model's config trained 20 steps under dp, fsdp and fsdp_tp (one compile each); the fsdp
    state saved as the trainer would (its names recorded)."""
    root, _ = project
    layouts = {"dp": ["rules=dp", "mesh.shape={data: -1}"], "fsdp": [], "fsdp_tp": FSDP_TP[1::2]}
    losses = {}
    with inside(root):
        for layout, overrides in layouts.items():
            cfg = pt.load_config("pytree.yaml", overrides)
            trainer = trainer_from_config(cfg, mesh_from_config(cfg))
            state = trainer.init(jax.random.key(0))
            batches = corpus.batches("train", trainer.batch_size, trainer.seq_len, trainer.batch_sharding)
            losses[layout] = []
            for i in range(20):
                state, metrics = trainer.train_step(state, batches.batch_at(i))
                losses[layout].append(float(metrics["loss"]))
            if layout == "fsdp":
                pt.save_checkpoint("runs/fsdp", 20, state, rules=trainer.rules, abstract=trainer.abstract_state)
    return root, losses


def test_train_gives_the_same_losses_under_dp_fsdp_and_fsdp_tp(runs):
    _, losses = runs
    assert len(losses["dp"]) == 20 and losses["dp"][-1] < losses["dp"][0]
    np.testing.assert_allclose(losses["fsdp"], losses["dp"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(losses["fsdp_tp"], losses["dp"], atol=1e-5, rtol=0)


def test_the_checkpoint_records_the_names_and_restores_onto_another_layout(runs):
    root, _ = runs
    meta = pt.checkpoint.checkpoint_metadata(root / "runs/fsdp", 20)
    w_in = "params/layers/0/w_in"
    assert meta["arrays"][w_in]["names"] == ["embed", "mlp"] and meta["arrays"][w_in]["spec"] == ["fsdp", None]
    [moment] = [p for p in meta["arrays"] if p.endswith("/mu/layers/0/w_in")]
    assert meta["arrays"][moment]["names"] == ["embed", "mlp"]
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    restored = pt.restore_checkpoint(root / "runs/fsdp", mesh=mesh, rules="fsdp_tp", params_only=True)
    assert restored["layers"][0]["w_in"].sharding.spec == P("fsdp", "tensor")
    assert restored["lm_head"].sharding.spec == P("fsdp", "tensor")
    saved = pt.restore_checkpoint(root / "runs/fsdp", mesh=pt.make_mesh({"data": 8}), rules="dp", params_only=True)
    np.testing.assert_array_equal(np.asarray(restored["lm_head"]), np.asarray(saved["lm_head"]))
    assert saved["lm_head"].sharding.spec == P(None, None)


@pytest.mark.parametrize(
    "table, error",
    [
        (
            "annotations:\n  - ['Dense_0/kernel$', [embed]]\n",
            "bad.yaml:2: annotations[0]: 1 names ['embed'] for params/Block_0/Dense_0/kernel of rank 2 (shape "
            "(64, 128)); give one name (or null) per dimension",
        ),
        (
            "annotations:\n  - ['kernel$', [embed, mlp]]\n  - ['Dense_(/bias', [mlp]]\n",
            "bad.yaml:3: annotations[1]: 'Dense_(/bias' is not a regular expression: missing ), unterminated "
            "subpattern at position 6",
        ),
        (
            "annotations:\n  - ['Dense_0/kernel$', [embed, mpl]]\n",
            "bad.yaml:2: annotations[0]: no rule table knows the logical name 'mpl' (names: batch, data, embed, "
            "expert, fsdp, heads, joined_kv, kv, kv_heads, kv_lora, layers, length, linear_heads, linear_qkv, lora, "
            "mlp, per_layer, per_layer_layers, per_layer_scalar, q_lora, vocab); did you mean 'mlp'?",
        ),
        (
            "annotations:\n  rows:\n    - ['Dense_0/kernel$', [embed, mlp]]\n    - ['Dense_9/kernel$', [embed, mlp]]\n"
            "  strict: true\n",
            "bad.yaml:4: annotations.rows[1]: 'Dense_9/kernel$' matches none of the 38 arrays of the model (strict)",
        ),
        (
            "annotations: {rows: [], stritc: true}\n",
            "bad.yaml:1: annotations.stritc: unknown key (valid: rows, strict); did you mean 'strict'?",
        ),
    ],
)
def test_bad_tables_are_one_line_at_file_line_and_exit_2(table, error, project):
    root, _ = project
    with inside(root):
        Path("bad.yaml").write_text(table + CONFIGS["linen"] + MESH + "run_dir: runs/bad\n")
        for command in (("plan", "--no-compile"), ("rules", "explain"), ("annotate",)):
            code, out, err = cli(*command, "bad.yaml")
            assert code == 2 and err.strip().splitlines() == [f"error: {error}"], (command, err)
        assert not Path("runs/bad").exists()


def test_a_row_matching_nothing_is_a_warning_line_by_default(project):
    root, _ = project
    with inside(root):
        Path("loose.yaml").write_text(
            "annotations:\n  - ['Dense_0/kernel$', [embed, mlp]]\n  - ['Dense_9/kernel$', [embed, mlp]]\n"
            + CONFIGS["linen"]
            + MESH
        )
        code, out, err = cli("plan", "loose.yaml", "--no-compile")
    assert code == 0
    line = (
        "warning: loose.yaml:3: annotations[1]: 'Dense_9/kernel$' matches none of the 38 arrays of the model; "
        "check the path against `partitioning plan`"
    )
    assert err.splitlines().count(line) == 1  # once, though plan builds the abstract state twice
