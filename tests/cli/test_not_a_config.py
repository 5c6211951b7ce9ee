"""A file that is not a run config (a tokenizer.json, a model's config.json) is refused in one line saying
what it looks like and what was expected -- from Python and from the CLI alike, with the same line."""

import json
import shutil
from pathlib import Path

import pytest

import partitioning as pt
from partitioning.errors import ConfigError

TOKENIZER = {"version": "1.0", "truncation": None, "added_tokens": [], "model": {"type": "BPE", "vocab": {"a": 0}}}
EXPECTED = "expected a YAML mapping with sections model, mesh, rules"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    Path("tok").mkdir()
    Path("tok/tokenizer.json").write_text(json.dumps(TOKENIZER, indent=1))
    Path("gpt2").mkdir()
    shutil.copy(Path(__file__).parents[1] / "fixtures" / "hf" / "gpt2" / "config.json", "gpt2")
    Path("notes.yaml").write_text("title: my notes\nauthors: [me]\n")
    Path("typo.yaml").write_text("modle: {name: gpt}\n")


LINES = {
    "tok/tokenizer.json": f"tok/tokenizer.json: not a run config: it looks like a tokenizer file (tokenizer.json); "
    f"{EXPECTED}",
    "gpt2/config.json": f"gpt2/config.json: not a run config: it looks like a Hugging Face model config; {EXPECTED}; "
    "to train that checkpoint, a run config names its folder: model: {hf: gpt2}",
    "notes.yaml": f"notes.yaml: not a run config: none of its keys (title, authors) is a section; {EXPECTED}",
}


@pytest.mark.parametrize("path", list(LINES))
def test_load_config_and_check_refuse_another_kind_of_file_in_the_same_one_line(
    files, path, run_cli_in_process, one_line_error
):
    with pytest.raises(ConfigError) as e:
        pt.load_config(path)
    assert str(e.value) == LINES[path]
    assert one_line_error(run_cli_in_process("check", path)) == f"error: {LINES[path]}"


def test_a_misspelled_section_is_still_reported_with_its_nearest_name(files):
    with pytest.raises(ConfigError, match=r"typo.yaml:1: modle: unknown key .*; did you mean 'model'\?"):
        pt.load_config("typo.yaml")
