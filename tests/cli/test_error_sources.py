"""Errors name their source (the config's file:line and key, the checkpoint file's key, the flag) and paths are
echoed as the user typed them."""

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
GPT2 = "model: {hf: gpt2, remat: none}\nmesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\n"


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def gpt2(here):
    """A copy of the GPT-2 fixture (32 learned positions) and g.yaml training it at seq_len 64 (too long)."""
    shutil.copytree(FIXTURES / "gpt2", "gpt2")
    Path("g.yaml").write_text(GPT2 + "data: {path: null}\ntrain: {steps: 2, batch_size: 8, seq_len: 64}\n")
    return here


@pytest.mark.parametrize("command", ["plan", "tune", "rules explain"])
def test_position_limit_names_seq_len_and_config_json_key(gpt2, run_cli_in_process, one_line_error, command):
    assert one_line_error(run_cli_in_process(*command.split(), "g.yaml")) == (
        "error: g.yaml:5: train.seq_len: sequence length 64 is longer than the model's 32 learned positions "
        "(n_positions in gpt2/config.json); lower train.seq_len to at most 32"
    )


def test_position_limit_names_the_key_config_json_uses(gpt2, run_cli_in_process, one_line_error):
    data = json.loads(Path("gpt2/config.json").read_text())
    data["max_position_embeddings"] = data.pop("n_positions")
    Path("gpt2/config.json").write_text(json.dumps(data))
    line = one_line_error(run_cli_in_process("plan", "g.yaml"))
    assert line.endswith(
        "32 learned positions (max_position_embeddings in gpt2/config.json); lower train.seq_len to at most 32"
    )


def test_generate_checks_its_own_length_not_train_seq_len(gpt2, run_cli_in_process, one_line_error):
    too_long = run_cli_in_process("generate", "g.yaml", "--prompt", "def ", "--max-tokens", "40")
    assert one_line_error(too_long) == (
        "error: --max-tokens 40 + 3 tokens of --prompt: sequence length 43 is longer than the model's 32 learned "
        "positions (n_positions in gpt2/config.json); lower --max-tokens to at most 29"
    )
    Path("p.txt").write_text("x" * 40 + "\n")
    long_prompt = run_cli_in_process("generate", "g.yaml", "--prompts", "p.txt", "--max-tokens", "1")
    assert one_line_error(long_prompt).endswith("; shorten --prompts to fewer than 32 tokens")
    # train.seq_len (64) does not fit, but generate's 3 + 2 tokens do
    r = run_cli_in_process("generate", "g.yaml", "--prompt", "def ", "--max-tokens", "2")
    assert r.returncode == 0, r.stderr
    assert "generate: 2 tokens from the Hugging Face weights in gpt2" in r.stderr


HEADS = (
    "model: {name: gpt, vocab_size: 256, embed: 48, heads: 6, kv_heads: 6, mlp: 64, layers: 1, remat: none}\n"
    "mesh: {shape: {data: 1, fsdp: -1, tensor: 4}, devices: 8}\n"
    "rules: fsdp_tp\n"
    "train: {steps: 2, batch_size: 8, seq_len: 8}\n"
)


def test_indivisible_heads_name_every_array_the_rule_and_the_config_line(here, run_cli_in_process, one_line_error):
    Path("h.yaml").write_text(HEADS)
    line = one_line_error(run_cli_in_process("check", "h.yaml"))
    assert line == (
        "error: h.yaml:3: rules: params/blocks/attn/k, params/blocks/attn/v: dim 2 ('kv_heads', size 6) is not "
        "divisible by mesh axes ('tensor',) of size 4 (presets/fsdp_tp.yaml:12: rules[3]); params/blocks/attn/o: "
        "dim 1 ('heads', size 6) is not divisible by mesh axes ('tensor',) of size 4 (presets/fsdp_tp.yaml:11: "
        "rules[2]); params/blocks/attn/q: dim 2 ('heads', size 6) is not divisible by mesh axes ('tensor',) of size "
        "4 (presets/fsdp_tp.yaml:11: rules[2]); change the rule or the size, or set on_indivisible: replicate"
    )
    # A rule written in the config is named at its own line.
    Path("h.yaml").write_text(HEADS.replace("rules: fsdp_tp", "rules: [[embed, fsdp], [kv_heads, tensor]]"))
    assert one_line_error(run_cli_in_process("check", "h.yaml")) == (
        "error: h.yaml:3: rules: params/blocks/attn/k, params/blocks/attn/v: dim 2 ('kv_heads', size 6) is not "
        "divisible by mesh axes ('tensor',) of size 4 (h.yaml:3: rules[1]); change the rule or the size, "
        "or set on_indivisible: replicate"
    )


@pytest.mark.parametrize("command", ["check", "plan"])
def test_one_warning_per_parameter_not_per_optimizer_moment(here, run_cli_in_process, command):
    Path("h.yaml").write_text(HEADS + "on_indivisible: replicate\n")
    r = run_cli_in_process(command, "h.yaml", *(["--no-compile"] if command == "plan" else []))
    assert r.returncode == 0, r.stderr
    said = [line for line in (r.stdout + r.stderr).splitlines() if "not divisible" in line]
    assert all("opt_state" not in line and "/mu/" not in line for line in said)
    assert len(said) == (4 if command == "check" else 3)  # k, v, o, q; plan: one line per failure (k and v share)
    assert sum("params/blocks/attn/k" in line for line in said) == 1


def test_the_loss_plot_title_names_the_checkpoint_not_its_path(here):
    from partitioning.cli.train import plot_title
    from partitioning.config import load_config

    shutil.copytree(FIXTURES / "llama", "llama")
    absolute = Path("llama").resolve()
    Path("l.yaml").write_text(
        f"model: {{hf: {absolute}, lora: {{rank: 4}}}}\nmesh: {{shape: {{data: 1, fsdp: -1}}}}\nrules: fsdp\n"
        "train: {steps: 2, batch_size: 8, seq_len: 8}\n"
    )
    assert plot_title(load_config("l.yaml")) == "l: llama + LoRA"
    Path("m.yaml").write_text(HEADS)
    assert plot_title(load_config("m.yaml")) == "m: gpt"
