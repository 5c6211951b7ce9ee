"""`ckpt export-hf --merge` writes the tokenizer as transformers 5 saves it: `chat_template.jinja` (the template the
run trained with), `tokenizer_config.json` (the special tokens), `generation_config.json` (stopping at the
end-of-turn token too). The fixture (tools/make_export_fixtures.py) is what transformers saves for the same
tokenizer and template and how it renders conversations from that folder; the same script, given this export,
loads it with transformers and renders the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import partitioning as pt
from partitioning.data.chat import ChatTemplate
from partitioning.data.instruct import load_instructions

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

REPO = Path(__file__).resolve().parents[2]
QWEN2 = REPO / "tests" / "fixtures" / "hf" / "qwen2"
FIXTURE = REPO / "tests" / "fixtures" / "export" / "qwen2"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
CONFIG = f"""\
model: {{hf: {QWEN2}, remat: none, lora: {{rank: 2, targets: ["attn/(q|v)$"]}}}}
mesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}
rules: fsdp
data: {{format: chat, path: chat.jsonl, chat_template: {REPO}/tests/fixtures/chat/qwen2}}
train: {{steps: 2, batch_size: 8, seq_len: 128, eval_batches: 0, tracker: [jsonl]}}
checkpoint: {{every: 2}}
run_dir: runs/chat
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory, run_cli_subprocess):
    """A LoRA run on chat rows with Qwen2.5's template (the Qwen2 fixture has none of its own), exported merged."""
    d = tmp_path_factory.mktemp("export")
    rows = [
        {"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": f"{i} {i}"}]}
        for i in range(64)
    ]
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run.yaml").write_text(CONFIG)
    trained = run_cli_subprocess("train", "run.yaml", "--no-progress", cwd=d)
    assert trained.returncode == 0, trained.stderr
    r = run_cli_subprocess("ckpt", "export-hf", "runs/chat", "merged", "--merge", cwd=d)
    assert r.returncode == 0, r.stderr
    load_instructions.cache_clear()
    return d, trained


def test_the_last_save_step_is_said(exported):
    _, trained = exported
    assert "checkpoint: saved step 2 to runs/chat/checkpoints (done)" in trained.stdout


def test_the_export_holds_the_files_transformers_saves(exported):
    d, _ = exported
    files = sorted(p.name for p in (d / "merged").iterdir())
    assert files == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors"] + [
        f for f in EXPECTED["files"] if f != "chat_template.jinja"
    ]
    template = (d / "merged" / "chat_template.jinja").read_text()
    assert template == (FIXTURE / "saved" / "chat_template.jinja").read_text()  # the template trained with
    ours = json.loads((d / "merged" / "tokenizer_config.json").read_text())
    theirs = json.loads((FIXTURE / "saved" / "tokenizer_config.json").read_text())
    assert "chat_template" not in ours
    named = ("bos_token", "eos_token", "pad_token", "unk_token")
    assert {k: ours.get(k) for k in named} == {k: theirs.get(k) for k in named}


@pytest.mark.parametrize("case", EXPECTED["cases"], ids=["two-turns", "system-and-prompt"])
def test_the_export_renders_and_tokenizes_as_transformers_does(exported, case):
    d, _ = exported
    template = ChatTemplate.from_dir(d / "merged")
    rendered = template.render(case["messages"], add_generation_prompt=case["add_generation_prompt"])
    assert rendered == case["rendered"]
    tok = pt.data.load_tokenizer(d / "merged")
    assert tok.tokenizer.encode(rendered, add_special_tokens=False).ids == case["input_ids"]


def test_generation_stops_at_the_end_of_turn_and_generate_chat_works(exported, run_cli_subprocess):
    d, _ = exported
    generation = json.loads((d / "merged" / "generation_config.json").read_text())
    tok = pt.data.load_tokenizer(d / "merged")
    end = tok.tokenizer.token_to_id("<|im_end|>")
    assert generation["eos_token_id"] == [EXPECTED["generation_eos_token_id"], end]
    (d / "merged.yaml").write_text(
        "model: {hf: merged, remat: none}\nmesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\n"
        "run_dir: runs/merged\n"
    )
    r = run_cli_subprocess("generate", "merged.yaml", "--chat", "--prompt", "say 3", "--max-tokens", "3", cwd=d)
    assert r.returncode == 0, r.stderr
