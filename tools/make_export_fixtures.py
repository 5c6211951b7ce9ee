"""Golden fixtures for `ckpt export-hf`'s tokenizer files: what transformers 5's `save_pretrained` writes, and how
transformers renders a conversation from it.

Run it with a Python that has transformers and torch (NOT the project's dependencies)::

    /tmp/hfvenv/bin/python tools/make_export_fixtures.py            # writes tests/fixtures/export/qwen2/
    /tmp/hfvenv/bin/python tools/make_export_fixtures.py EXPORT_DIR # also: load a toolkit export, compare

The tokenizer is the tiny Qwen2 fixture's (tests/fixtures/hf/qwen2) with Qwen2.5-Instruct's chat template
(tests/fixtures/chat/qwen2). transformers loads it, takes the template, and saves it: the folder it writes
(`saved/`: tokenizer_config.json, chat_template.jinja; tokenizer.json is the source's, not kept) and
`expected.json`: the file names it wrote, the conversations rendered (`apply_chat_template(tokenize=False)`)
and tokenized (`input_ids`) by a tokenizer loaded back from that folder, and the `generation_config.json`
`GenerationConfig.from_model_config` makes of the fixture's config.json. With EXPORT_DIR (a toolkit export
of a run trained with that template), the same conversations are rendered by transformers from the export and
must equal the recorded ones; its generation config must load, stopping at `<|im_end|>` too.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import transformers
from transformers import AutoTokenizer, GenerationConfig, PretrainedConfig

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "hf" / "qwen2"
TEMPLATE = ROOT / "tests" / "fixtures" / "chat" / "qwen2" / "tokenizer_config.json"
OUT = ROOT / "tests" / "fixtures" / "export" / "qwen2"
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another?"},
    ],
]


def render(folder: Path) -> list[dict]:
    tok = AutoTokenizer.from_pretrained(folder)
    out = []
    for conv in CONVERSATIONS:
        prompt = conv[-1]["role"] == "user"
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=prompt)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append({"messages": conv, "add_generation_prompt": prompt, "rendered": text, "input_ids": ids})
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
            shutil.copy(SOURCE / name, src / name)
        tok = AutoTokenizer.from_pretrained(src)
        tok.chat_template = json.loads(TEMPLATE.read_text())["chat_template"]
        saved = Path(tmp) / "saved"
        tok.save_pretrained(saved)
        files = sorted(p.name for p in saved.iterdir())
        cases = render(saved)
        generation = GenerationConfig.from_model_config(PretrainedConfig.from_json_file(str(SOURCE / "config.json")))
        if OUT.exists():
            shutil.rmtree(OUT)
        (OUT / "saved").mkdir(parents=True)
        for name in files:
            if name != "tokenizer.json":  # the source's, byte for byte
                shutil.copy(saved / name, OUT / "saved" / name)
    expected = {
        "transformers": transformers.__version__,
        "files": files,
        "cases": cases,
        "generation_eos_token_id": generation.eos_token_id,
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: transformers {transformers.__version__} saves {files}")
    if len(sys.argv) > 1:
        export = Path(sys.argv[1])
        got = render(export)
        assert got == cases, (got, cases)
        eos = GenerationConfig.from_pretrained(export).eos_token_id
        end = AutoTokenizer.from_pretrained(export).convert_tokens_to_ids("<|im_end|>")
        assert end in (eos if isinstance(eos, list) else [eos]), eos
        print(f"{export}: transformers renders the recorded conversations; generation stops at {eos}")


if __name__ == "__main__":
    main()
