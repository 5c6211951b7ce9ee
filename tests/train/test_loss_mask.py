"""The loss mask is transformers' assistant mask (what TRL's `assistant_only_loss` trains on), token for token:
with a template's `{% generation %}` blocks, and with the unmarked template (the prefix method) alike. The
fixtures are transformers' own masks (tools/make_mask_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import partitioning as pt
from partitioning.data.chat import ChatTemplate
from partitioning.data.instruct import load_examples

REPO = Path(__file__).resolve().parents[2]
QWEN2 = REPO / "tests" / "fixtures" / "hf" / "qwen2"
CHAT = REPO / "tests" / "fixtures" / "chat"
CASES = json.loads((CHAT / "qwen2_generation" / "expected_masks.json").read_text())["cases"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    f = tmp_path_factory.mktemp("masks") / "c.jsonl"
    f.write_text("".join(json.dumps({"messages": c["messages"]}) + "\n" for c in CASES))
    tok = pt.data.load_tokenizer(QWEN2)
    return {
        name: load_examples([f], "chat", tok, ChatTemplate.from_dir(CHAT / name))
        for name in ("qwen2_generation", "qwen2")
    }


@pytest.mark.parametrize("template", ["qwen2_generation", "qwen2"], ids=["generation-tags", "unmarked"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_mask_is_transformers_assistant_mask(examples, template, i):
    tokens, mask = examples[template].example(i)
    assert tokens.tolist() == CASES[i]["input_ids"]
    np.testing.assert_array_equal(mask, CASES[i]["assistant_masks"])


def test_a_template_with_generation_tags_is_read_by_its_tags():
    t = ChatTemplate(
        "{% for m in messages %}[{{ m.role }}]{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    full = t.render(msgs)
    assert t.has_generation and full == "[user]hi[assistant]yo"
    assert [full[s:e] for s, e in t.generation_spans(msgs, full)] == ["yo"]
    assert not ChatTemplate("{{ messages[0].content }}").has_generation
