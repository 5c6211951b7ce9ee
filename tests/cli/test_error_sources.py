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
