"""JSON Lines as JSON defines them: rows end at "\\n" only (never at U+2028, U+2029 or U+0085 inside a
string), and `generate`'s prompts file is read by what it holds, not by its suffix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import partitioning as pt
from partitioning.data.chat import ChatTemplate
from partitioning.data.instruct import load_examples
from partitioning.data.prompts import read_prompts

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
MISTRAL = REPO / "tests" / "fixtures" / "chat" / "mistral"
# What json.dumps(ensure_ascii=False) writes raw: str.splitlines() breaks lines at each of them.
SEPARATORS = "a\u2028b\u2029c\u0085d\x1ce\x1df\x1eg\x0bh\x0ci"


def conversation(user: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def test_chat_rows_with_unicode_line_separators_inside_strings_load(tmp_path):
    rows = [conversation(f"say {SEPARATORS}", "ok"), conversation("hi", "yo")]
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tok = pt.data.load_tokenizer(LLAMA)
    ex = load_examples([f], "chat", tok, ChatTemplate.from_dir(MISTRAL))
    assert len(ex) == 2
    assert SEPARATORS in tok.tokenizer.decode(ex.example(0)[0].tolist())


def test_crlf_rows_and_a_byte_order_mark_load(tmp_path):
    f = tmp_path / "c.jsonl"
    text = "\ufeff" + json.dumps(conversation("a", "b")) + "\r\n\r\n" + json.dumps(conversation("c", "d")) + "\r\n"
    f.write_bytes(text.encode("utf-8"))
    ex = load_examples([f], "chat", pt.data.load_tokenizer(LLAMA), ChatTemplate.from_dir(MISTRAL))
    assert len(ex) == 2


def test_a_bad_row_after_a_separator_is_named_by_its_real_line(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(conversation("x\u2028y", "z"), ensure_ascii=False) + "\n{nope\n", encoding="utf-8")
    with pytest.raises(pt.DataError) as e:
        load_examples([f], "chat", pt.data.load_tokenizer(LLAMA), ChatTemplate.from_dir(MISTRAL))
    assert str(e.value).startswith(f"{f}:2: not valid JSON (")


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt", ""])
def test_prompts_are_read_by_content_whatever_the_suffix(tmp_path, suffix):
    f = tmp_path / f"prompts{suffix}"
    rows = [{"prompt": f"def f({SEPARATORS}"}, {"messages": [{"role": "user", "content": "hi\u2028there"}]}]
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert read_prompts(f) == [f"def f({SEPARATORS}", [{"role": "user", "content": "hi\u2028there"}]]


def test_a_json_array_of_prompt_rows_is_read_too(tmp_path):
    f = tmp_path / "prompts.json"
    f.write_text(json.dumps([{"prompt": "a"}, {"messages": [{"role": "user", "content": "b"}]}], indent=2))
    assert read_prompts(f) == ["a", [{"role": "user", "content": "b"}]]


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_plain_text_prompts_are_one_a_line_whatever_the_suffix(tmp_path, suffix):
    f = tmp_path / f"prompts{suffix}"
    f.write_text("def f(\u2028x):\n\n{not json} explain\r\n", encoding="utf-8")
    assert read_prompts(f) == ["def f(\u2028x):", "{not json} explain"]


def test_a_jsonl_prompts_file_with_a_bad_row_names_its_line(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text('{"prompt": "a"}\n{"promt": "b"}\n')
    with pytest.raises(pt.DataError) as e:
        read_prompts(f)
    assert str(e.value) == f"{f}:2: expected an object with `prompt` (text) or `messages` (a chat)"
