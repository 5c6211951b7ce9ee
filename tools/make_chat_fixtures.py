"""Golden fixtures for `partitioning.data.chat.ChatTemplate`: real chat templates, rendered by `transformers`.

Run it with a Python that has transformers, tokenizers and jinja2 (NOT the project's dependencies)::

    /work/refvenv/bin/python tools/make_chat_fixtures.py TEMPLATES.json   # writes tests/fixtures/chat/<family>/

TEMPLATES.json maps a Hub model id to {"chat_template": str} as published in that model's
tokenizer_config.json (no model hub is reachable here: the strings were taken from public test suites
that vendor them verbatim -- huggingface.js packages/jinja/test/e2e.test.js, and llama.cpp's / mistral.rs's
template tests for google/gemma-7b-it, whose template Gemma 2 ships unchanged). Each family directory holds a
tiny checkpoint-style tokenizer config in one of the three layouts transformers reads (a plain
`chat_template` string, a list of named templates with "default", or a `chat_template.jinja` file; special
tokens as strings or AddedToken dicts) and `expected.json`: conversations with
`apply_chat_template(tokenize=False)`'s output for add_generation_prompt false and true, or the error
transformers raised.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat"
TOKENIZER_JSON = ROOT / "tests" / "fixtures" / "hf" / "llama" / "tokenizer.json"

GEMMA_IT = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


def _token(content: str) -> dict:
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


# family -> (Hub id, layout, special tokens for tokenizer_config.json)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama3": (
        "meta-llama/Llama-3.1-8B-Instruct",
        "string",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    "qwen2": ("Qwen/Qwen2.5-7B-Instruct", "string", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3": ("Qwen/Qwen3-0.6B", "jinja_file", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "gemma": (
        "google/gemma-7b-it",
        "string",
        {"bos_token": _token("<bos>"), "eos_token": _token("<eos>"), "pad_token": "<pad>"},
    ),
    "mistral": (
        "TheBloke/Mistral-7B-Instruct-v0.1-GPTQ",
        "named_list",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    ),
}

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
CONVERSATIONS: list[list[dict]] = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [
        SYSTEM,
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "  Blue, like the sky.  "},
        {"role": "user", "content": "And another?\nOne word."},
        {"role": "assistant", "content": "Green."},
    ],
    [SYSTEM, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": 'Unicode: héllo 🙂 "quotes" {{ not jinja }}'}],
]


def _write_config(directory: Path, template: str, layout: str, tokens: dict) -> None:
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, **tokens}
    if layout == "string":
        config["chat_template"] = template
    elif layout == "named_list":
        config["chat_template"] = [{"name": "default", "template": template}, {"name": "plain", "template": "x"}]
    else:
        (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")


def main(templates_json: str) -> None:
    published = json.loads(Path(templates_json).read_text())
    published["google/gemma-7b-it"] = {"chat_template": GEMMA_IT}
    for family, (hub_id, layout, tokens) in FAMILIES.items():
        directory = OUT / family
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        _write_config(directory, published[hub_id]["chat_template"], layout, tokens)
        with tempfile.TemporaryDirectory() as tmp:
            for f in directory.iterdir():
                shutil.copy(f, tmp)
            shutil.copy(TOKENIZER_JSON, tmp)
            tokenizer = transformers.AutoTokenizer.from_pretrained(tmp)
            cases = []
            for messages in CONVERSATIONS:
                for add in (False, True):
                    case: dict = {"messages": messages, "add_generation_prompt": add}
                    try:
                        case["rendered"] = tokenizer.apply_chat_template(
                            messages, tokenize=False, add_generation_prompt=add
                        )
                    except Exception as e:  # the template raised: record transformers' message
                        case["error"] = str(e)
                    cases.append(case)
        (directory / "expected.json").write_text(
            json.dumps(
                {"source": hub_id, "transformers": transformers.__version__, "cases": cases},
                indent=1,
                ensure_ascii=False,
            )
            + "\n"
        )
        print(
            family, hub_id, sum("rendered" in c for c in cases), "rendered,", sum("error" in c for c in cases), "raised"
        )


if __name__ == "__main__":
    main(sys.argv[1])
