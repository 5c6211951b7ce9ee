"""ChatTemplate renders the real chat templates of five families byte for byte as transformers does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import partitioning as pt
from partitioning.data.chat import ChatTemplate

CHAT = Path(__file__).resolve().parent.parent / "fixtures" / "chat"
FAMILIES = sorted(p.name for p in CHAT.iterdir() if (p / "expected.json").is_file())


def test_five_families_are_fixtures():
    assert FAMILIES == ["gemma", "llama3", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_render_equals_transformers(family):
    template = ChatTemplate.from_dir(CHAT / family)
    expected = json.loads((CHAT / family / "expected.json").read_text(encoding="utf-8"))
    assert len(expected["cases"]) == 8
    for i, case in enumerate(expected["cases"]):
        if "rendered" in case:
            got = template.render(case["messages"], add_generation_prompt=case["add_generation_prompt"])
            assert got == case["rendered"], (family, i)
        else:  # the template raised in transformers: one line naming the template and the row
            with pytest.raises(pt.DataError) as e:
                template.render(
                    case["messages"], add_generation_prompt=case["add_generation_prompt"], where="chat.jsonl:7"
                )
            assert str(e.value) == (
                f"chat.jsonl:7: the chat template of {CHAT / family / 'tokenizer_config.json'} raised: {case['error']}"
            )


def test_special_tokens_from_each_layout():
    # AddedToken dicts read as their content; a chat_template.jinja file; a list with a "default" entry.
    assert ChatTemplate.from_dir(CHAT / "gemma").special_tokens == {
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
    }
    assert ChatTemplate.from_dir(CHAT / "qwen3").source == str(CHAT / "qwen3" / "chat_template.jinja")
    assert ChatTemplate.from_dir(CHAT / "mistral", name="plain").render([{"role": "user", "content": "a"}]) == "x"
    with pytest.raises(pt.DataError, match=r"no chat template named 'nope' \(has: default, plain\)"):
        ChatTemplate.from_dir(CHAT / "mistral", name="nope")


def test_extra_variables_and_sandbox():
    qwen3 = ChatTemplate.from_dir(CHAT / "qwen3")
    user = [{"role": "user", "content": "Hi"}]
    assert qwen3.render(user, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # Immutable sandbox: a template cannot change its inputs nor store private names on a namespace.
    for text, error in [
        ("{{ messages.append(1) }}", "access to attribute 'append' of 'list' object is unsafe."),
        ("{% set ns = namespace(_x=1) %}", "a namespace attribute may not start with '_': '_x'"),
    ]:
        with pytest.raises(pt.DataError) as e:
            ChatTemplate(text, source="t.jinja").render(user)
        assert str(e.value) == f"the chat template of t.jinja failed (SecurityError): {error}"
    assert ChatTemplate("{{ messages | tojson }}").render([{"role": "user", "content": "<é>", "name": None}]) == (
        '[{"role": "user", "content": "<é>"}]'
    )


def test_errors_one_line(tmp_path):
    with pytest.raises(pt.DataError, match=r"^t.jinja: line 1 of the chat template: "):
        ChatTemplate("{% for %}", source="t.jinja")
    with pytest.raises(pt.DataError, match=r"no chat template \(tokenizer_config.json has no chat_template"):
        ChatTemplate.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": 3}')
    with pytest.raises(pt.DataError, match=r"chat_template must be a string or a list of \{name, template\}, got int"):
        ChatTemplate.from_dir(tmp_path)
