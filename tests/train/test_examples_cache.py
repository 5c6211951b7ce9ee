"""A large chat file streams: tokenizing holds a group of rows (not the file), says where it is from the first
second (quiet with --no-progress), and is cached by what decides the tokens, so a resume starts at once."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import partitioning as pt
import partitioning.data.progress as progress_module
from partitioning.data.chat import ChatTemplate
from partitioning.data.instruct import load_examples, load_instructions
from partitioning.data.progress import Progress

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
MISTRAL = REPO / "tests" / "fixtures" / "chat" / "mistral"
LLAMA3 = REPO / "tests" / "fixtures" / "chat" / "llama3"
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "river", "stone"]


def chat_file(path: Path, n: int, words: int = 40) -> Path:
    rng = np.random.default_rng(0)
    with path.open("w") as f:
        for _ in range(n):
            user, answer = (" ".join(rng.choice(WORDS, words)) for _ in range(2))
            msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    return path


@pytest.fixture(scope="module")
def tok():
    return pt.data.load_tokenizer(LLAMA)


def test_tokenizing_holds_a_group_of_rows_not_the_file(tmp_path, tok):
    f = chat_file(tmp_path / "big.jsonl", 2500)  # ~1 MB
    size = f.stat().st_size
    template = ChatTemplate.from_dir(MISTRAL)
    tracemalloc.start()
    try:
        ex = load_examples([f], "chat", tok, template, cache_dir=tmp_path / "cache")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ex) == 2500 and isinstance(ex.tokens, np.memmap)
    assert peak < size, (peak, size)  # the rows are never all in memory (they were: 13x the file)


def test_the_cache_is_read_back_and_names_what_decides_the_tokens(tmp_path, tok, monkeypatch):
    f = chat_file(tmp_path / "c.jsonl", 50)
    cache = tmp_path / "cache"
    first = load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), cache_dir=cache)
    folders = sorted(p.name for p in cache.iterdir())
    assert len(folders) == 1 and folders[0].startswith("examples-")
    calls = []
    monkeypatch.setattr(type(tok.tokenizer), "encode_batch", lambda *a, **k: calls.append(a) or [], raising=False)
    again = load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), cache_dir=cache)
    assert calls == []  # read back, not tokenized again
    np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(first.tokens))
    np.testing.assert_array_equal(np.asarray(again.mask), np.asarray(first.mask))
    monkeypatch.undo()
    # Another template, another train_on_prompt, other bytes: other examples, each cached apart.
    load_examples([f], "chat", tok, ChatTemplate.from_dir(LLAMA3), cache_dir=cache)
    load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), cache_dir=cache, train_on_prompt=True)
    f.write_text(f.read_text() + json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    assert len(load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), cache_dir=cache)) == 51
    assert len(list(cache.iterdir())) == 4


def test_a_failed_row_leaves_no_cache_behind(tmp_path, tok):
    f = chat_file(tmp_path / "c.jsonl", 300)
    f.write_text(f.read_text() + "{oops\n")
    with pytest.raises(pt.DataError, match=r"c\.jsonl:301: not valid JSON"):
        load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_progress_lines_start_within_the_first_second_and_quiet_says_nothing(tmp_path, tok, monkeypatch, capsys):
    f = chat_file(tmp_path / "c.jsonl", 600)
    monkeypatch.setattr(progress_module, "DELAY_S", 0.0)  # as if each group took a second
    load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), progress="lines")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"data: tokenizing {f} (0.") and " MB): " in err[0]
    assert err[-1].startswith("data: 600 examples, ") and " tokens in " in err[-1]
    load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL), progress=False)
    assert capsys.readouterr().err == ""


def test_progress_is_silent_for_work_done_within_a_second():
    out = io.StringIO()
    p = Progress(1000, "small.jsonl", "lines", stream=out)
    p.update(1000, rows=3)
    p.close("data: 3 examples")
    assert out.getvalue() == ""


def test_load_instructions_caches_in_its_cache_dir_and_splits_without_copying(tmp_path):
    f = chat_file(tmp_path / "c.jsonl", 40)
    load_instructions.cache_clear()
    data = load_instructions(str(f), "chat", str(LLAMA), chat_template=str(MISTRAL), cache_dir=str(tmp_path / "c"))
    assert (len(data.train), len(data.eval)) == (38, 2)
    assert np.shares_memory(data.train.tokens, data.eval.tokens) or data.train.tokens.base is data.eval.tokens.base
    assert [p.name.startswith("examples-") for p in (tmp_path / "c").iterdir()] == [True]
    load_instructions.cache_clear()
