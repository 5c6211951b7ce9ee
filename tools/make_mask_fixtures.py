"""Golden fixtures for the loss mask: transformers' assistant mask (what TRL's `assistant_only_loss` trains on).

Run it with a Python that has transformers (NOT the project's dependencies)::

    /tmp/hfvenv/bin/python tools/make_mask_fixtures.py     # writes tests/fixtures/chat/qwen2_generation/

transformers finds the assistant's tokens only in a template that marks them with `{% generation %}` ...
`{% endgeneration %}`. The fixture takes Qwen2.5-Instruct's template (tests/fixtures/chat/qwen2) and marks each
plain assistant turn's content and its `<|im_end|>` as generated -- the header `<|im_start|>assistant\\n` before
it and the `\\n` after it are not -- and records, for a few conversations, `apply_chat_template(tokenize=True,
return_dict=True, return_assistant_tokens_mask=True)` with the tiny Qwen2 fixture's tokenizer: the token ids and
`assistant_masks`. The toolkit's mask must equal it with this template, and equal it with the unmarked template
too (partitioning.data.masks counts the same characters).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "hf" / "qwen2"
PLAIN = ROOT / "tests" / "fixtures" / "chat" / "qwen2" / "tokenizer_config.json"
OUT = ROOT / "tests" / "fixtures" / "chat" / "qwen2_generation"
TURN = """        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"""
MARKED = """        {%- if message.role == "assistant" %}
            {{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- message.content + '<|im_end|>' }}\
{% endgeneration %}{{- '\\n' }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
        {%- endif %}"""
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another one, please?"},
        {"role": "assistant", "content": "Blue, or green\nif you like."},
    ],
    [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": " "}],
]


def main() -> None:
    config = json.loads(PLAIN.read_text())
    assert TURN in config["chat_template"], "the Qwen2.5 template changed: update TURN"
    config["chat_template"] = config["chat_template"].replace(TURN, MARKED)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(SOURCE / name, Path(tmp) / name)
        tok = AutoTokenizer.from_pretrained(tmp)
        tok.chat_template = config["chat_template"]
        cases = []
        for conv in CONVERSATIONS:
            out = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            cases.append({"messages": conv, "input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]})
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (OUT / "expected_masks.json").write_text(
        json.dumps({"transformers": transformers.__version__, "cases": cases}, indent=1) + "\n"
    )
    print(f"wrote {OUT}: {len(cases)} conversations, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
