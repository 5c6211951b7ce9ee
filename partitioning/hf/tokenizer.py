"""A checkpoint's tokenizer files, written as transformers 5's ``save_pretrained`` writes them.

transformers 5 saves a tokenizer as ``tokenizer.json``, ``tokenizer_config.json`` (the special tokens; no
``chat_template`` key) and ``chat_template.jinja`` (named extra templates in ``additional_chat_templates/``);
a model's ``save_pretrained`` adds ``generation_config.json``. :func:`save_tokenizer` writes that set from a
source tokenizer folder, with the chat template a run trained with (which may be another folder's), so a
fine-tuned chat model keeps its template: ``AutoTokenizer.from_pretrained(out).apply_chat_template(...)``
renders what the run trained on, and ``generate --chat`` works on the export.

``generation_config.json`` is the source's, or (none there) what ``GenerationConfig.from_model_config`` makes
of ``config.json`` (its ``bos_token_id``, ``eos_token_id``, ``pad_token_id``); the token the chat template
ends an assistant turn with (Qwen's ``<|im_end|>``, Llama 3's ``<|eot_id|>``) joins ``eos_token_id``, so
generation stops where the fine-tuned model learned to stop.

Example::

    >>> import json, pathlib, tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "export"
    >>> template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
    >>> pt.hf.save_tokenizer("tests/fixtures/hf/llama", out, chat_template=template)
    ['chat_template.jinja', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']
    >>> "chat_template" in json.loads((out / "tokenizer_config.json").read_text())   # it has its own file
    False
    >>> pt.data.ChatTemplate.from_dir(out).render([{"role": "user", "content": "hi"}])
    '<|user|>hi</s>'
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from partitioning.errors import ConfigError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
EXTRA_TEMPLATES = "additional_chat_templates"
GENERATION_CONFIG = "generation_config.json"
# Tokenizer files copied as they are (a fast tokenizer, and the files of a slow one).
VERBATIM = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read it as JSON ({' '.join(str(e).split())})") from None
    return value if isinstance(value, dict) else {}


def _source_templates(source: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The templates a source folder holds, as transformers reads them (``default`` first)."""
    out: dict[str, str] = {}
    if (source / CHAT_TEMPLATE_FILE).is_file():
        out["default"] = (source / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (source / EXTRA_TEMPLATES).is_dir():
        for f in sorted((source / EXTRA_TEMPLATES).glob("*.jinja")):
            out[f.stem] = f.read_text(encoding="utf-8")
    value = config.get("chat_template")
    if not out and isinstance(value, str):
        out["default"] = value
    elif not out and isinstance(value, list):
        out = {str(t["name"]): str(t["template"]) for t in value if isinstance(t, Mapping) and "name" in t}
    return out


def _turn_end(template: str, special: Mapping[str, Any], tokenizer: Any) -> int | None:
    """The id of the token the template ends an assistant turn with (None: none, or not one token)."""
    from partitioning.data.chat import ChatTemplate
    from partitioning.errors import DataError

    try:
        chat = ChatTemplate(template, **{k: v for k, v in special.items() if isinstance(v, str)})
        text = chat.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": "\ue010"}])
    except DataError:
        return None
    end = text.rsplit("\ue010", 1)[-1].strip() if "\ue010" in text else ""
    return tokenizer.token_to_id(end) if end and tokenizer is not None else None


def _generation_config(
    source: Path, config: Mapping[str, Any] | None, template: str | None, special: Mapping[str, Any], tokenizer: Any
) -> dict[str, Any] | None:
    found = source / GENERATION_CONFIG
    out = _json(found) if found.is_file() else None
    if out is None and config is not None:
        out = {"_from_model_config": True, **{k: config[k] for k in TOKEN_IDS if config.get(k) is not None}}
    if out is None:
        return None
    end = _turn_end(template, special, tokenizer) if template else None
    eos = out.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if end is not None and end not in ids:  # a chat model stops where it learned to end its turn
        out["eos_token_id"] = [*ids, end] if ids else end
    return out


def tokenizer_files(
    source: str | os.PathLike, *, chat_template: str | None = None, config: Mapping[str, Any] | None = None
) -> dict[str, str | Path]:
    """``{name: text, or a file to copy}`` of the tokenizer files :func:`save_tokenizer` writes."""
    source = Path(source)
    tok_config = _json(source / "tokenizer_config.json") if (source / "tokenizer_config.json").is_file() else {}
    legacy = source / "special_tokens_map.json"
    if "added_tokens_decoder" not in tok_config and legacy.is_file():  # folded in, as transformers 5 does
        tok_config = {**_json(legacy), **tok_config}
    templates = _source_templates(source, tok_config)
    if chat_template is not None:
        templates["default"] = chat_template
    out: dict[str, str | Path] = {name: source / name for name in VERBATIM if (source / name).is_file()}
    if tok_config or templates:
        config_out = {k: v for k, v in tok_config.items() if k != "chat_template"}
        out["tokenizer_config.json"] = json.dumps(config_out, indent=2, ensure_ascii=False) + "\n"
    for name, text in templates.items():
        out[CHAT_TEMPLATE_FILE if name == "default" else f"{EXTRA_TEMPLATES}/{name}.jinja"] = text
    tokenizer = None
    if (source / "tokenizer.json").is_file():
        import tokenizers

        tokenizer = tokenizers.Tokenizer.from_file(str(source / "tokenizer.json"))
    special = {
        k: (v.get("content") if isinstance(v, Mapping) else v) for k, v in tok_config.items() if k.endswith("_token")
    }
    generation = _generation_config(source, config, templates.get("default"), special, tokenizer)
    if generation is not None:
        out[GENERATION_CONFIG] = json.dumps(generation, indent=2) + "\n"
    return out


def save_tokenizer(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    chat_template: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[str]:
    """Writes ``source``'s tokenizer files into ``out_dir`` as transformers 5 saves them; returns their names.

    ``chat_template``: the Jinja text the model was trained with (default: ``source``'s own); ``config``: the
    model's ``config.json`` (its token ids make ``generation_config.json`` when ``source`` has none). Files
    already in ``out_dir`` under these names are replaced.

    Example::

        >>> import json, pathlib, tempfile
        >>> out = pathlib.Path(tempfile.mkdtemp())
        >>> config = json.loads(pathlib.Path("tests/fixtures/hf/llama/config.json").read_text())
        >>> pt.hf.save_tokenizer("tests/fixtures/hf/llama", out, chat_template="{{ messages[0].content }}</s>",
        ...                      config=config)
        ['chat_template.jinja', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']
        >>> json.loads((out / "generation_config.json").read_text())["eos_token_id"]   # config.json's
        2
    """
    out = Path(out_dir)
    written = []
    for name, content in sorted(tokenizer_files(source, chat_template=chat_template, config=config).items()):
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            target.write_text(content, encoding="utf-8")
        written.append(name.split("/")[0])
    return sorted(set(written))


__all__ = ["save_tokenizer", "tokenizer_files", "CHAT_TEMPLATE_FILE", "GENERATION_CONFIG"]
