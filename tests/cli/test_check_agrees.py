"""`check` agrees with `train` by construction (partitioning/cli/preflight.py): for every bad input of the
adversarial corpus (tests/cli/test_adversarial.py, test_bad_input.py) and the Hugging Face and run-state
faults below, `check` fails exactly when `train` does, with the same first line; a complete run is a fact. Fine-tuning
too: an adapter made for another base, truncation that leaves no answer (or cuts some), and a LoRA run's memory."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli import test_adversarial as adversarial
from tests.cli import test_bad_input as bad_input

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama"


def _lines(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("simulating ")]


def agree(run, *argv) -> str:
    """Runs `check` and `train` on the same arguments; asserts both exit 2 with the same first line; returns it."""
    checked, trained = run("check", *argv), run("train", *argv, "--no-progress")
    assert (checked.returncode, trained.returncode) == (2, 2), (checked.stderr, trained.stderr)
    assert "Traceback" not in checked.stderr + trained.stderr
    assert len(_lines(trained)) == 1, trained.stderr
    assert _lines(checked)[0] == _lines(trained)[0]
    return _lines(trained)[0]


def _value_edits():
    mark = next(m for m in bad_input.test_bad_values_name_their_key.pytestmark if m.name == "parametrize")
    return [edit for edit, _ in mark.args[1]][::3]  # a sample: each one builds a model (the rest: test_bad_input)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("text, error", adversarial.YAML_CASES)
def test_bad_yaml(here, run_cli_in_process, text, error):
    Path("run.yaml").write_text(text)
    assert agree(run_cli_in_process, "run.yaml") == f"error: {error}"


@pytest.mark.parametrize("extra, error", adversarial.VALUE_CASES)
def test_bad_fault_settings(here, run_cli_in_process, extra, error):
    Path("run.yaml").write_text(adversarial.GOOD.replace("train: {steps: 2, batch_size: 8, seq_len: 8}\n", "") + extra)
    assert agree(run_cli_in_process, "run.yaml").startswith(f"error: {error}")


@pytest.mark.parametrize("edit", _value_edits(), ids=lambda e: e[1].replace("\n", " ")[:40])
def test_bad_values(here, run_cli_in_process, base_config, edit):
    Path("run.yaml").write_text(base_config.replace(*edit))
    assert agree(run_cli_in_process, "run.yaml").startswith("error: run.yaml:")


def _hf_run(case: str, hurt) -> str:
    shutil.copytree(HF, case)
    hurt(Path(case))
    Path(f"{case}.yaml").write_text(
        f"model: {{hf: {case}, remat: none}}\nmesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}\nrules: fsdp\n"
        f"data: {{path: null}}\ntrain: {{steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0}}\n"
        f"run_dir: runs/{case}\n"
    )
    return f"{case}.yaml"


def _edit_config(d: Path, edit) -> None:
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def _cut(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


HF_CASES = {
    "truncated": (lambda d: _cut(d / "model.safetensors"), "model.hf: truncated/model.safetensors: truncated: tensor "),
    "typo": (
        lambda d: _edit_config(d, lambda c: c.update(num_key_valu_heads=c.pop("num_key_value_heads"))),
        "typo/config.json: unknown key 'num_key_valu_heads' (did you mean 'num_key_value_heads'?)",
    ),
    "types": (
        lambda d: _edit_config(d, lambda c: c.update(vocab_size=str(c["vocab_size"]))),
        "types/config.json: vocab_size must be an integer, got '",
    ),
    "arch": (
        lambda d: _edit_config(d, lambda c: c.update(architectures=["LLamaForCausalLM"])),
        "(did you mean 'LlamaForCausalLM'?)",
    ),
    "pickled": (
        lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
        "pickled has no *.safetensors weights (only pytorch_model.bin: convert it to safetensors",
    ),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hugging_face_faults(here, run_cli_in_process, case):
    hurt, expected = HF_CASES[case]
    path = _hf_run(case, hurt)
    line = agree(run_cli_in_process, path)
    assert line.startswith(f"error: {path}:1: model.hf: ") and expected in line, line
    assert not Path("runs").exists()  # nothing written


def test_a_held_lock(here, run_cli_in_process, base_config):
    from partitioning.cli.faults import RunLocks
    from partitioning.config.load import load_config

    Path("run.yaml").write_text(base_config.replace("layers: 2", "layers: 2\n  remat: none") + "run_dir: runs/held\n")
    locks = RunLocks()
    locks.check(load_config("run.yaml"))
    locks.acquire()
    try:
        assert "run directory in use by pid " in agree(run_cli_in_process, "run.yaml")
    finally:
        locks.release()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_cli_subprocess):
    """A tiny run trained to its last step (2) with a checkpoint: what the README's first command leaves."""
    d = tmp_path_factory.mktemp("done")
    (d / "run.yaml").write_text(
        adversarial.GOOD.replace("vocab_size: 64", "vocab_size: 256")
        + "checkpoint: {every: 1, keep: 3}\nrun_dir: runs/done\n"
    )
    r = run_cli_subprocess("train", "run.yaml", "--no-progress", cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def test_a_complete_run_is_a_fact_for_check_and_nothing_to_train_for_train(
    trained, tmp_path, monkeypatch, run_cli_in_process
):
    shutil.copytree(trained, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    r = run_cli_in_process("check", "run.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "config OK; runs/done is complete at step 2 (train would do nothing)"
    line = _lines(run_cli_in_process("train", "run.yaml"))[0]
    assert "already at step 2 (train.steps is 2): nothing to train" in line


def test_a_damaged_resume_fails_both_alike_and_leaves_the_run_record(
    trained, tmp_path, monkeypatch, run_cli_in_process
):
    shutil.copytree(trained, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    (Path("runs/done/checkpoints/2/meta/checksums.0.json")).unlink()
    record = Path("runs/done/config.yaml").read_bytes()
    line = agree(run_cli_in_process, "run.yaml", "--resume", "--set", "train.steps=4", "--set", "optimizer.lr=0.01")
    assert line.startswith("error: checkpoint step 2 (runs/done/checkpoints/2) is damaged: missing file ")
    assert "the latest good step is 1: choose it explicitly (train --resume-from 1" in line
    assert Path("runs/done/config.yaml").read_bytes() == record  # a failed resume changes nothing
    r = run_cli_in_process("train", "run.yaml", "--resume-from", "1", "--set", "train.steps=3", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "checkpoint: resuming from step 1: moved the later step 2 to " in r.stdout
    assert b"steps: 3" in Path("runs/done/config.yaml").read_bytes()


def test_an_unreadable_step_metadata_is_damage_for_both_naming_the_good_step(
    trained, tmp_path, monkeypatch, run_cli_in_process
):
    shutil.copytree(trained, tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    Path("runs/done/checkpoints/2/state/_METADATA").write_text("xx")  # not a model mismatch: a damaged file
    line = agree(run_cli_in_process, "run.yaml", "--resume", "--set", "train.steps=4")
    assert line == (
        "error: checkpoint step 2 (runs/done/checkpoints/2) is damaged: damaged file "
        "runs/done/checkpoints/2/state/_METADATA (not valid JSON; truncated?); not restored; the latest good step "
        "is 1: choose it explicitly (train --resume-from 1; step=1 from Python), or start over with --no-resume"
    )


def test_an_indivisible_warning_is_said_once_per_array_not_per_optimizer_moment(capsys):
    import warnings

    from partitioning.cli.main import plain_warnings
    from partitioning.resolve import IndivisibleWarning

    plain_warnings()
    plain_warnings()  # a second command in this process starts afresh
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for prefix in ("params/", "opt_state/0/mu/", "opt_state/0/nu/"):
            warnings.warn(
                f"{prefix}blocks/attn/q: dim 2 ('kv', size 6) is not divisible", IndivisibleWarning, stacklevel=1
            )
        warnings.warn("params/embedding: dim 0 ('vocab', size 7) is not divisible", IndivisibleWarning, stacklevel=1)
    assert capsys.readouterr().err.splitlines() == [
        "warning: params/blocks/attn/q: dim 2 ('kv', size 6) is not divisible",
        "warning: params/embedding: dim 0 ('vocab', size 7) is not divisible",
    ]


def test_gpt2_position_limit_names_seq_len_and_n_positions(here, run_cli_in_process):
    shutil.copytree(HF.parent / "gpt2", "gpt2")
    Path("g.yaml").write_text(
        "model: {hf: gpt2, remat: none}\nmesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\n"
        "data: {path: null}\ntrain: {steps: 2, batch_size: 8, seq_len: 64, eval_batches: 0}\nrun_dir: runs/g\n"
    )
    assert agree(run_cli_in_process, "g.yaml") == (
        "error: g.yaml:5: train.seq_len: sequence length 64 is longer than the model's 32 learned positions "
        "(n_positions in gpt2/config.json); lower train.seq_len to at most 32"
    )


def test_a_tokenizer_larger_than_the_model_is_refused_before_tokenizing(here, run_cli_in_process):
    Path("corpus.txt").write_text("def f():\n    return 1\n" * 200)
    Path("t.yaml").write_text(
        "model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 1, remat: none}\n"
        "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\n"
        f"data: {{path: corpus.txt, tokenizer: {HF}, cache_dir: cache}}\n"
        "train: {steps: 2, batch_size: 8, seq_len: 8}\nrun_dir: runs/t\n"
    )
    line = agree(run_cli_in_process, "t.yaml")
    assert line.startswith("error: t.yaml:1: model.vocab_size: the model's vocab_size is 64, but the tokenizer ")
    assert line.endswith(" tokens; name the model's own tokenizer with data.tokenizer")
    assert not Path("cache").exists() and not Path("runs").exists()  # nothing tokenized, nothing cached


def test_check_reports_every_problem_at_once_train_its_first(here, run_cli_in_process):
    """Three independent mistakes: `check` names the model's and the batch's (the mesh axis no rule uses needs
    the model's layouts, so it waits for the model); `train` stops at the first, the same line."""
    Path("two.yaml").write_text(
        "model: {name: gpt, vocab_size: 256, embed: 30, heads: 4, mlp: 64, layers: 2}\n"
        "mesh: {shape: {data: 1, fsdp: -1, tensr: 2}, devices: 8}\n"
        "rules: fsdp\n"
        "train: {steps: 2, batch_size: 6, seq_len: 16}\n"
    )
    first = agree(run_cli_in_process, "two.yaml")
    assert first == "error: two.yaml:1: model.heads: embed (30) must be a multiple of heads (4)"
    assert _lines(run_cli_in_process("check", "two.yaml")) == [
        first,
        "error: two.yaml:4: train.batch_size: batch_size 6 is not divisible by the batch mesh axes ('data', 'fsdp') "
        "of size 4; use a multiple of 4",
    ]
    assert sorted(p.name for p in here.iterdir()) == ["two.yaml"]  # neither wrote anything


# -- fine-tuning: adapters, truncation, LoRA memory (issue 38) -----------------------------------------------

PEFT = HF.parents[1] / "peft" / "llama"


def _adapter(case: str, edit) -> None:
    """The llama PEFT fixture's adapter, its tensors edited as an adapter made for another base would have them."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(PEFT, case)
    tensors = load_file(f"{case}/adapter_model.safetensors")
    save_file(edit(tensors), f"{case}/adapter_model.safetensors")


def _wider(tensors: dict) -> dict:  # a base of hidden size 48: every lora_A reading the hidden state is wider
    return {
        k: (v if v.shape[1] != 32 or "lora_A" not in k else np.zeros((v.shape[0], 48), v.dtype))
        for k, v in tensors.items()
    }


def _deeper(tensors: dict) -> dict:  # 3 layers (the base has 2)
    return {**tensors, **{k.replace("layers.0.", "layers.2."): v for k, v in tensors.items() if "layers.0." in k}}


def _shallower(tensors: dict) -> dict:  # 1 layer
    return {k: v for k, v in tensors.items() if "layers.1." not in k}


ADAPTER_CASES = {
    "wider": (
        _wider,
        "adapter/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' "
        "has shape [4, 48]; base/config.json and r=4 imply [4, 32] (an adapter made for another base model?)",
    ),
    "deeper": (
        _deeper,
        "adapter/adapter_model.safetensors: unexpected tensor 'base_model.model.model.layers.2.mlp.down_proj.lora_A."
        "weight': not a LoRA weight of the modules adapter_config.json targets",
    ),
    "shallower": (
        _shallower,
        "adapter/adapter_model.safetensors: tensor 'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight' "
        "is missing (adapter_config.json targets model.layers.1.self_attn.q_proj)",
    ),
}


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_an_adapter_made_for_another_base_fails_check_as_train(here, run_cli_in_process, case):
    edit, message = ADAPTER_CASES[case]
    shutil.copytree(HF, "base", ignore=shutil.ignore_patterns("v4"))
    _adapter("adapter", edit)
    Path("corpus.txt").write_text("def f(x):\n    return x * 2\n" * 100)
    Path("a.yaml").write_text(
        "model: {hf: base, adapter: adapter, remat: none}\nmesh: {shape: {data: 1, fsdp: -1}, devices: 8}\n"
        "rules: fsdp\ndata: {path: corpus.txt}\ntrain: {steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0}\n"
        "run_dir: runs/a\n"
    )
    assert agree(run_cli_in_process, "a.yaml") == f"error: a.yaml:1: model.adapter: {message}"
    assert not Path("runs").exists()  # nothing written, no lock left behind


CHAT = HF.parents[1] / "chat" / "mistral"


def _chat_run(prompt_words: list[int]) -> None:
    words = ["red", "blue", "green", "cat"]
    rows = [
        {
            "messages": [
                {"role": "user", "content": " ".join(words[(i + j) % 4] for j in range(n))},
                {"role": "assistant", "content": "blue cat"},
            ]
        }
        for i, n in enumerate(prompt_words)
    ]
    Path("chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path("c.yaml").write_text(
        f"model: {{hf: {HF}, remat: none}}\nmesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}\nrules: fsdp\n"
        f"data: {{format: chat, path: chat.jsonl, chat_template: {CHAT}}}\n"
        "train: {steps: 2, batch_size: 8, seq_len: 64, eval_batches: 0}\nrun_dir: runs/c\n"
    )


def test_truncation_that_leaves_no_answer_fails_check_as_train(here, run_cli_in_process, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _chat_run([80] * 64)
    line = agree(run_cli_in_process, "c.yaml")
    assert line.startswith(
        "error: c.yaml:5: train.seq_len: chat.jsonl (train): the loss would count no token: 61 of 61"
    )
    assert line.endswith("raise train.seq_len above 295, or set data.truncation: left")


def test_check_says_the_truncation_train_makes(here, run_cli_in_process, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _chat_run([80, 2] * 32)  # half lose their answer at seq_len 64
    checked = run_cli_in_process("check", "c.yaml")
    trained = run_cli_in_process("train", "c.yaml", "--no-progress")
    assert (checked.returncode, trained.returncode) == (0, 0), (checked.stderr, trained.stderr)
    cut = "31 examples longer than 65 tokens cut to that length (their end cut)"
    assert cut in checked.stdout and cut in trained.stdout
    warned = [x for x in _lines(checked) if x.startswith("warning: data: ")]
    assert warned and warned == [x for x in _lines(trained) if x.startswith("warning: data: ")]


LORA = (
    f'model: {{hf: {HF}, remat: none, lora: {{rank: 2, targets: ["attn/(q|v)$"]}}}}\n'
    "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\ndata: {path: corpus.txt}\n"
    "train: {steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0}\nrun_dir: runs/lora\n"
)


def test_check_prices_a_lora_run_as_plan_does(here, run_cli_in_process):
    Path("corpus.txt").write_text("def f(x):\n    return x * 2\n" * 100)
    Path("lora.yaml").write_text(LORA)
    checked = run_cli_in_process("check", "lora.yaml")
    assert checked.returncode == 0, checked.stderr
    memory = next(x for x in checked.stdout.splitlines() if x.startswith("memory: "))
    planned = run_cli_in_process("plan", "lora.yaml", "--no-compile")
    total = next(x for x in planned.stdout.splitlines() if x.startswith("│ total"))
    per_device = total.split("│")[2].strip()
    assert memory.startswith(f"memory: peak {per_device} per device (analytic")  # 22.59 KiB, not full fine-tuning's
    assert "params/embedding (frozen) 5.00 KiB" in memory and "(+grad, optimizer) 5.00 KiB" not in memory
    line = agree(run_cli_in_process, "lora.yaml", "--set", "mesh.device_memory=20KiB")
    assert "params/embedding (frozen) 5.00 KiB" in line  # the refusal prices the frozen base as plan does
