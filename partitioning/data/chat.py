"""A checkpoint's own chat template, rendered exactly as `transformers`' `apply_chat_template(tokenize=False)`.

Chat templates are Jinja programs shipped in a checkpoint (`tokenizer_config.json`'s `chat_template`, a
string or a list of named templates, or a `chat_template.jinja` file). They are untrusted code from the
Hub, so they run in jinja2's `ImmutableSandboxedEnvironment` with the same settings, globals and filters
transformers installs (`trim_blocks`, `lstrip_blocks`, `loopcontrols`, the `{% generation %}` tag,
`raise_exception`, `strftime_now`, a `tojson` that does not HTML-escape, guarded `dict` and `namespace`),
and see the same variables: `messages`, `add_generation_prompt`, `tools`, `documents`, the tokenizer's
named special tokens (`bos_token`, `eos_token`, ...; AddedToken dicts read as their `content`) and any
extra keyword. A byte-for-byte equality with transformers' rendering is tested on the real templates of
five families (tests/fixtures/chat, made by tools/make_chat_fixtures.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from partitioning.errors import DataError

__all__ = ["ChatTemplate", "special_tokens"]

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens every template sees when they are set.
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Names a message's reasoning is passed under; transformers copies the first one found to all of them.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


# Where a rendering marks its `{% generation %}` blocks (private-use characters, stripped again).
MARKS = "_partitioning_generation_marks"
OPEN, CLOSE = "\ue000", "\ue001"
_HAS_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body unchanged,
    between markers when the render asks for them (:meth:`ChatTemplate.generation_spans`)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        marks = jinja2.nodes.Name(MARKS, "load")
        return jinja2.nodes.CallBlock(self.call_method("_render", [marks]), [], [], body).set_lineno(lineno)

    def _render(self, marks: Any, caller: Any) -> str:
        body = str(caller())
        return f"{OPEN}{body}{CLOSE}" if marks is True else body


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    # Jinja's own tojson HTML-escapes (<, >, &, '); templates expect plain JSON as transformers renders it.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    # `dict(...)` inside a template, without exposing the dict type itself to attribute lookups.
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    # Namespaces that refuse underscore attributes, so a template cannot reach CPython internals.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


def _plain(value: Any) -> Any:
    """Rebuild `value` from plain JSON types (what transformers lets a template see); others become '<type>'."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        return _plain(item())
    return f"<{type(value).__name__}>"


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict (its `content`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}", arg="chat_template") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({_one_line(str(e))})", arg="chat_template") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object", arg="chat_template")
    return value


def _read_config(directory: Path) -> dict:
    """tokenizer_config.json of ``directory`` ({} if none), with a legacy special_tokens_map.json merged in as
    transformers does (only when the config has no added_tokens_decoder)."""
    config_path, legacy = directory / "tokenizer_config.json", directory / "special_tokens_map.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    if "added_tokens_decoder" not in config and legacy.is_file():
        config.update(_read_json(legacy))
    return config


def special_tokens(directory: str | Path, config: dict | None = None) -> dict[str, str]:
    """The named special tokens a template sees for the tokenizer in ``directory`` (``bos_token``, ...).

    As transformers: the seven standard names, every other ``*_token`` key holding a token, and the
    named ``extra_special_tokens``; AddedToken dicts read as their ``content``.
    """
    config = _read_config(Path(directory)) if config is None else config
    tokens: dict[str, str] = {}
    for key, value in config.items():
        text = _token_text(value)
        if text is not None and (key in _NAMED_TOKENS or key.endswith("_token")):
            tokens[key] = text
    extra = config.get("extra_special_tokens")
    if isinstance(extra, Mapping):  # model-specific named tokens (image_token, ...) are named tokens too
        for key, value in extra.items():
            text = _token_text(value)
            if text is not None:
                tokens[str(key)] = text
    return tokens


class ChatTemplate:
    """A checkpoint's Jinja chat template and its special tokens; `render` equals transformers' rendering.

    `ChatTemplate.from_dir(dir)` reads a checkpoint directory the way `AutoTokenizer.from_pretrained` does
    (`chat_template.jinja` over `tokenizer_config.json`'s `chat_template`; of a list of named templates the one
    named "default"); `ChatTemplate(template, bos_token=..., eos_token=...)` takes the Jinja text itself.
    `render(messages, add_generation_prompt=False, **extra)` returns the prompt string; a template that raises
    (its `raise_exception`, or a Jinja error) raises `DataError`, one line naming the template's source and
    the `where` given (e.g. the data file's `path:line`).

    Example:
        >>> from partitioning.data.chat import ChatTemplate
        >>> t = ChatTemplate(
        ...     "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{{ eos_token }}"
        ...     "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
        ...     bos_token="<s>", eos_token="</s>")
        >>> t.render([{"role": "user", "content": " Hi "}], add_generation_prompt=True)
        '<s><|user|>Hi</s><|assistant|>'
    """

    def __init__(
        self,
        template: str,
        *,
        source: str = "chat_template",
        bos_token: str | None = None,
        eos_token: str | None = None,
        **special_tokens: str | None,
    ):
        self.template = template
        self.source = source
        tokens = {"bos_token": bos_token, "eos_token": eos_token, **special_tokens}
        self.special_tokens: dict[str, str] = {k: v for k, v in tokens.items() if v is not None}
        try:
            self._compiled = _environment().from_string(template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise DataError(
                f"{source}: line {e.lineno} of the chat template: {_one_line(e.message or str(e))}", arg="chat_template"
            ) from None

    @classmethod
    def from_dir(cls, directory: str | Path, name: str | None = None) -> ChatTemplate:
        """The chat template and special tokens of the checkpoint (or tokenizer) directory `directory`.

        `name` picks one of several named templates (default: the one named "default").
        """
        directory = Path(directory)
        if not directory.is_dir():
            what = "a file, not" if directory.exists() else "no such folder:"
            raise DataError(
                f"{directory}: {what} a tokenizer folder (with tokenizer_config.json or chat_template.jinja)",
                arg="chat_template",
            )
        config_path = directory / "tokenizer_config.json"
        config = _read_config(directory)
        templates, source = cls._templates(directory, config, config_path)
        if name is None:
            if "default" not in templates:
                raise DataError(
                    f"{source}: several chat templates ({', '.join(sorted(templates))}) and none named 'default'",
                    arg="chat_template",
                )
            name = "default"
        elif name not in templates:
            raise DataError(
                f"{source}: no chat template named {name!r} (has: {', '.join(sorted(templates))})", arg="chat_template"
            )
        tokens = special_tokens(directory, config)
        return cls(templates[name], source=source, **tokens)

    @staticmethod
    def _templates(directory: Path, config: dict, config_path: Path) -> tuple[dict[str, str], str]:
        jinja_file = directory / "chat_template.jinja"
        extra_dir = directory / "additional_chat_templates"
        templates: dict[str, str] = {}
        if jinja_file.is_file():
            templates["default"] = jinja_file.read_text(encoding="utf-8")
        if extra_dir.is_dir():
            for f in sorted(extra_dir.glob("*.jinja")):
                templates[f.stem] = f.read_text(encoding="utf-8")
        if templates:  # the files replace tokenizer_config.json's chat_template, as in from_pretrained
            return templates, str(jinja_file if jinja_file.is_file() else extra_dir)
        value = config.get("chat_template")
        if isinstance(value, str):
            return {"default": value}, str(config_path)
        if (
            isinstance(value, Sequence)
            and value
            and all(
                isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
                for t in value
            )
        ):
            return {str(t["name"]): str(t["template"]) for t in value}, str(config_path)
        if value is not None:
            raise DataError(
                f"{config_path}: chat_template must be a string or a list of {{name, template}}, "
                f"got {type(value).__name__}",
                arg="chat_template",
            )
        raise DataError(
            f"{directory}: no chat template (tokenizer_config.json has no chat_template and there is no "
            "chat_template.jinja); name one with data.chat_template, or use data.format: prompt_completion",
            arg="chat_template",
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        where: str | None = None,
        **extra: Any,
    ) -> str:
        """The prompt string for `messages` (a list of {"role", "content", ...} mappings).

        `extra` keywords reach the template as variables (e.g. `enable_thinking=False`) and override the
        special tokens of the same name. `where` (e.g. "data.jsonl:12") is named in the error of a template
        that raises.
        """
        chat = []
        for message in messages:
            # As transformers: keys whose value is None are dropped; reasoning aliases are filled in.
            m = {k: v for k, v in _plain(dict(message)).items() if v is not None}
            reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
            if reasoning is not None:
                m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
            chat.append(m)
        variables = _plain({**self.special_tokens, **extra})
        try:
            return self._compiled.render(
                messages=chat,
                tools=_plain(None if tools is None else list(tools)),
                documents=_plain(None if documents is None else list(documents)),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            at = f"{where}: " if where else ""
            kind = "raised" if type(e) is jinja2.exceptions.TemplateError else f"failed ({type(e).__name__})"
            raise DataError(
                f"{at}the chat template of {self.source} {kind}: {_one_line(str(e))}", arg="chat_template"
            ) from None

    @property
    def has_generation(self) -> bool:
        """The template marks the assistant's text with `{% generation %}` (what transformers' assistant mask reads)."""
        return bool(_HAS_GENERATION.search(self.template))

    def generation_spans(
        self, messages: Sequence[Mapping[str, Any]], full: str, **extra: Any
    ) -> list[tuple[int, int]] | None:
        """Character spans of the `{% generation %}` blocks in `full` (the rendering of `messages`), as
        transformers' `return_assistant_tokens_mask` finds them; None when the template has none (or a
        message holds the private-use marker characters)."""
        texts = [str(m.get("content")) for m in messages]
        if not self.has_generation or any(OPEN in t or CLOSE in t for t in texts):
            return None
        spans: list[tuple[int, int]] = []
        plain: list[str] = []
        at, start = 0, None
        for piece in re.split(f"([{OPEN}{CLOSE}])", self.render(messages, **{**extra, MARKS: True})):
            if piece == OPEN:
                start = at
            elif piece == CLOSE and start is not None:
                spans.append((start, at))
                start = None
            else:
                plain.append(piece)
                at += len(piece)
        if "".join(plain) != full:
            return None
        return [(s, e) for s, e in spans if e > s]
