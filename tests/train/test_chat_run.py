"""Fine-tune the tiny Llama fixture on chat JSONL from YAML: the loss counts only the assistant's tokens
and falls; bad rows and a template that raises are one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from partitioning.data.instruct import load_instructions

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
MISTRAL = REPO / "tests" / "fixtures" / "chat" / "mistral"
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]
CONFIG = f"""\
model:
  hf: {LLAMA}
  remat: none
mesh:
  shape: {{data: 1, fsdp: -1}}
  devices: 8
rules: fsdp
data:
  format: chat
  path: chat.jsonl
  chat_template: {MISTRAL}
optimizer: {{name: adamw, lr: 0.01, warmup_steps: 2, weight_decay: 0.0}}
train: {{steps: 12, batch_size: 8, seq_len: 128, log_every: 1, eval_batches: 0, tracker: [jsonl]}}
run_dir: runs/chat
"""


def rows(n: int = 96) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        a, b = rng.choice(WORDS, 2)
        out.append(
            {"messages": [{"role": "user", "content": f"repeat {a} {b}"}, {"role": "assistant", "content": f"{a} {b}"}]}
        )
    return out


def write(folder: Path, data: list) -> None:
    (folder / "run.yaml").write_text(CONFIG)
    lines = [d if isinstance(d, str) else json.dumps(d) for d in data]
    (folder / "chat.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short run, shared: (folder, CliResult)."""
    import jax

    from partitioning.cli import main

    folder = tmp_path_factory.mktemp("chat_run")
    write(folder, rows())
    mp = pytest.MonkeyPatch()
    mp.chdir(folder)
    load_instructions.cache_clear()
    jax.devices()
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["train", "run.yaml", "--no-progress"])
    finally:
        mp.undo()  # the worker's other tests (and doctests) resolve paths from the repository
    return folder, code, out.getvalue(), err.getvalue()


def test_loss_falls_on_assistant_tokens(trained):
    folder, code, out, err = trained
    assert code == 0, err[-3000:]
    assert "data chat.jsonl: 92 train / 4 eval chat examples" in out
    assert "chat.jsonl (train): 92 examples packed into" in out and "of the slots hold tokens" in out
    records = [json.loads(x) for x in (folder / "runs/chat/metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 1.0, losses
    # The loss counts exactly the batch's assistant tokens (their loss_mask), not the prompts.
    corpus = load_instructions(
        str(folder / "chat.jsonl"), "chat", str(LLAMA / "tokenizer.json"), chat_template=str(MISTRAL)
    )
    first = corpus.batches("train", 8, 128, seed=0).batch_at(0)
    assert records[0]["loss_tokens"] == float(first["loss_mask"].sum())
    assert first["loss_mask"].sum() < 0.5 * (first["segment_ids"] > 0).sum()
    # The checkpoint records how the rows were cut: a resume with other settings says its batches differ.
    from partitioning.checkpoint import checkpoint_metadata

    data = checkpoint_metadata(str(folder / "runs/chat/checkpoints"))["data"]
    assert (data["format"], data["packing"], data["train_on_prompt"], data["chat_template"]) == (
        "chat",
        True,
        False,
        str(MISTRAL),
    )


@pytest.mark.parametrize(
    "bad, error",
    [
        (
            '{"text": "x"}',
            'run.yaml:10: data.path: chat.jsonl:3: a chat row needs "messages": a non-empty list of {"role", '
            '"content"} (no messages key)',
        ),
        (
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
            f"run.yaml:11: data.chat_template: chat.jsonl:3: the chat template of "
            f"{MISTRAL / 'tokenizer_config.json'} raised: Conversation roles must alternate "
            "user/assistant/user/assistant/...",
        ),
    ],
    ids=["no-messages", "template-raises"],
)
def test_bad_rows_one_line_nothing_written(tmp_path, monkeypatch, run_cli_in_process, bad, error):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, [*rows(2), bad])
    load_instructions.cache_clear()
    r = run_cli_in_process("train", "run.yaml")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("simulating")]
    assert lines == [f"error: {error}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "run.yaml"]


def test_a_checkpoint_without_a_template_is_one_line(tmp_path, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, rows(4))
    (tmp_path / "run.yaml").write_text(CONFIG.replace(f"  chat_template: {MISTRAL}\n", ""))
    load_instructions.cache_clear()
    r = run_cli_in_process("check", "run.yaml")
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("simulating")]
    assert r.returncode == 2 and lines == [
        f"error: run.yaml:2: model.hf: {LLAMA}: no chat template (tokenizer_config.json has no chat_template and "
        "there is no chat_template.jinja); name one with data.chat_template, or use data.format: prompt_completion"
    ]


@pytest.mark.parametrize(
    "edit, error",
    [
        (
            ("format: chat", "format: text"),
            "run.yaml:11: data.chat_template: data.chat_template is for data.format: chat or prompt_completion",
        ),
        (
            ("format: chat", "format: chat\n  dtype: uint16"),
            "run.yaml:10: data.dtype: data.dtype does not apply to data.format: chat (JSONL rows)",
        ),
    ],
    ids=["template-with-text", "dtype-with-chat"],
)
def test_keys_of_another_format_are_refused(tmp_path, monkeypatch, run_cli_in_process, edit, error):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, rows(4))
    (tmp_path / "run.yaml").write_text(CONFIG.replace(*edit))
    r = run_cli_in_process("check", "run.yaml")
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("simulating")]
    assert r.returncode == 2 and lines == [f"error: {error}"]
