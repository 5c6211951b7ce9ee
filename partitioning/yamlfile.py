"""YAML 1.2 files read safely, with the line of every key, so errors can say ``file:line: key``.

Both rule files (:mod:`partitioning.rules`) and run configs
(:mod:`partitioning.config`) are read here, with ruamel.yaml (YAML 1.2: ``3e-3``
is a float, ``yes`` is a string). A *key* is the tuple of mapping keys and list
indices leading to a value (``("rules", 3)``); ``lines`` maps each key to its
1-based line, to ``(file, line)`` when it came from another file (``base:``),
or to the ``--set`` flag that replaced it.

Reading is bounded, so no input can hang or crash the reader: at most
:data:`MAX_BYTES` of UTF-8 text, :data:`MAX_DEPTH` levels of nesting and
:data:`MAX_NODES` values after alias expansion (a "billion laughs" alias bomb
is refused, not expanded); recursive aliases, non-string keys and duplicate
keys are errors naming the line.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.yamlfile import read_yaml, where
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("model: {name: gpt}\\ntrain:\\n  steps: 100\\n")
    >>> data, lines = read_yaml(path)
    >>> data["train"], where("run.yaml", lines, ("train", "steps"))
    ({'steps': 100}, 'run.yaml:3: train.steps')
"""

from __future__ import annotations

import datetime
import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, SequenceNode

from partitioning.errors import ConfigError

Key = tuple[Any, ...]
Lines = dict[Key, Any]  # key -> line (int), (file, line) from another file, or the --set flag (str)

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000


def _yaml() -> YAML:
    y = YAML(typ="rt", pure=True)
    y.allow_duplicate_keys = False
    return y


def read_text(path: Path, what: str) -> str:
    """The file's text: bounded in size, UTF-8 (a BOM is fine), else one ConfigError."""
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder, not a{'n' if what[:1] in 'aeiou' else ''} {what}")
        if size > MAX_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes; a {what} is at most {MAX_BYTES:,} bytes")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        kind = "UTF-16 text" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "binary data"
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start} looks like {kind}); save it as UTF-8") from None


def _mark_line(e: YAMLError) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f":{mark.line + 1}" if mark is not None else ""


def _deep_line(text: str, block: bool = True) -> int | None:
    """The line where nesting passes MAX_DEPTH: flow brackets, or (``block``) indentation levels.

    A character scan, no recursion: ``block=False`` is the pre-check before parsing (ruamel's
    scanner is quadratic in flow depth: 5,000 brackets took 6 s of CPU to refuse);
    ``block=True`` names a line when the composer itself recursed too far.
    """
    depth, quote = 0, ""
    indents: list[int] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        body = raw.lstrip(" ")
        if block and body and not body.startswith("#") and not quote:
            indent = len(raw) - len(body)
            while indents and indents[-1] >= indent:
                indents.pop()
            indents.append(indent)
            if len(indents) + body.startswith("- ") > MAX_DEPTH:
                return number
        for ch in raw:
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                depth += 1
                if depth > MAX_DEPTH:
                    return number
            elif ch in "]}":
                depth -= 1
    return 1 if block else None


_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_KINDS = {"int": "int", "float": "float", "bool": "bool", "null": "null", "timestamp": "a date"}


def _key_problem(key: Any, parent: Key, path: Path) -> str | None:
    """What is wrong with a mapping key node (not a plain name), at the key's own line."""
    line = key.start_mark.line + 1
    where = dotted(parent) or "the top level"
    if isinstance(key, (MappingNode, SequenceNode)):
        kind = "a list" if isinstance(key, SequenceNode) else "a mapping"
        return f"{path}:{line}: {where}: keys must be names (strings), got {kind}"
    tag = str(getattr(key, "tag", "") or "")
    if tag in (_STR_TAG, _MERGE_TAG) or not tag.startswith("tag:yaml.org,2002:"):
        return None
    short = tag[len("tag:yaml.org,2002:") :]
    kind = _KINDS.get(short, short)
    shown = f"{kind} {key.value}" if kind != "null" else "null"
    return f"{path}:{line}: {where}: keys must be names (strings), got {shown}"


def _check_graph(node: Any, path: Path) -> None:
    """Refuses recursive aliases, nesting deeper than MAX_DEPTH, alias expansion past MAX_NODES,
    keys that are not names and keys given twice, each at its own line with its dotted key."""
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool, Key]] = [(node, 1, True, ())]
    visited = 0
    while stack:
        n, depth, entering, key = stack.pop()
        if not entering:
            on_path.discard(id(n))
            continue
        visited += 1
        line = n.start_mark.line + 1
        if visited > MAX_NODES:
            raise ConfigError(
                f"{path}:{line}: more than {MAX_NODES:,} values after expanding aliases "
                f"(an alias bomb?); write the values out"
            )
        if depth > MAX_DEPTH:
            raise ConfigError(f"{path}:{line}: nested more than {MAX_DEPTH} levels deep")
        if not isinstance(n, (MappingNode, SequenceNode)):
            continue
        if id(n) in on_path:
            raise ConfigError(f"{path}:{line}: an alias refers to a value that contains it (recursive alias)")
        on_path.add(id(n))
        stack.append((n, depth, False, key))
        if isinstance(n, SequenceNode):
            stack.extend((c, depth + 1, True, key + (i,)) for i, c in reversed(list(enumerate(n.value))))
            continue
        seen: dict[str, int] = {}
        children = []
        for k, v in n.value:
            problem = _key_problem(k, key, path)
            if problem:
                raise ConfigError(problem)
            if str(getattr(k, "tag", "")) == _MERGE_TAG:
                children.append((v, key))
                continue
            name = str(k.value)
            k_line = k.start_mark.line + 1
            if name in seen:
                raise ConfigError(
                    f"{path}:{k_line}: {dotted(key + (name,))}: key appears twice (first at line {seen[name]})"
                )
            seen[name] = k_line
            children.append((v, key + (name,)))
        stack.extend((c, depth + 1, True, ck) for c, ck in reversed(children))


def _plain(value: Any) -> Any:
    """ruamel's round-trip scalars as plain Python values."""
    if value is None or isinstance(value, (dict, list)):
        return value
    if type(value).__name__ == "ScalarBoolean" or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return value


def _convert(value: Any, key: Key, line: int, path: Path, lines: Lines) -> Any:
    lines.setdefault(key, line)
    marks: Any = getattr(value, "lc", None)  # ruamel's line marks (None: plain data)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                kind = (
                    "a list"
                    if isinstance(k, (list, tuple))
                    else "a mapping"
                    if isinstance(k, Mapping)
                    else f"{type(_plain(k)).__name__} {_plain(k)!r}"
                )
                raise ConfigError(
                    f"{path}:{line}: {dotted(key) or 'the top level'}: keys must be names (strings), got {kind}"
                )
            try:
                k_line = marks.key(k)[0] + 1
            except (AttributeError, KeyError, TypeError):  # a key from a merge (<<:): the mapping's own line
                k_line = line
            lines[key + (str(k),)] = k_line
            out[str(k)] = _convert(v, key + (str(k),), k_line, path, lines)
        return out
    if isinstance(value, list):
        out_list = []
        for i, v in enumerate(value):
            try:
                i_line = marks.item(i)[0] + 1
            except (AttributeError, KeyError, TypeError, IndexError):
                i_line = line
            out_list.append(_convert(v, key + (i,), i_line, path, lines))
        return out_list
    return _plain(value)


def read_yaml(path: str | Path, what: str = "YAML file") -> tuple[Any, Lines]:
    """Parses a YAML file (safely, see the module docstring) keeping the 1-based line of every key and item.

    ``what`` names the file in errors (``no such config file``).
    """
    path = Path(path)
    text = read_text(path, what)
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str | Path = "<text>") -> tuple[Any, Lines]:
    """:func:`read_yaml` for text already read (``path`` only names it in errors)."""
    path = Path(path)
    deep = _deep_line(text, block=False)
    if deep is not None:
        raise ConfigError(f"{path}:{deep}: nested more than {MAX_DEPTH} levels deep")
    try:
        node = _yaml().compose(io.StringIO(text))
        if node is not None:
            _check_graph(node, path)
        data = _yaml().load(io.StringIO(text))
    except ConfigError:
        raise
    except MarkedYAMLError as e:
        problem = " ".join(str(e.problem or e.context or "invalid YAML").split())
        dup = re.search(r'duplicate key "([^"]*)"', problem)
        if dup:
            raise ConfigError(f"{path}{_mark_line(e)}: {dup.group(1)}: key appears twice") from None
        raise ConfigError(f"{path}{_mark_line(e)}: invalid YAML: {problem}") from None
    except YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())[:200]}") from None
    except RecursionError:
        raise ConfigError(f"{path}:{_deep_line(text)}: nested more than {MAX_DEPTH} levels deep") from None
    lines: Lines = {}
    return (_convert(data, (), 1, path, lines) if data is not None else {}), lines


def dotted(key: Key) -> str:
    """``train.steps``, ``rules[3]``: a key as a person writes it."""
    out = ""
    for k in key:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def where(path: str | Path, lines: Mapping[Key, Any], key: Key) -> str:
    """``file:line: dotted.key``, ``other.yaml:line: key`` (from ``base:``) or ``file (--set k=v): key``."""
    k = tuple(key)
    while k and k not in lines:
        k = k[:-1]
    line = lines.get(k)
    if isinstance(line, str):
        loc = f"{path} ({line})"
    elif isinstance(line, tuple):
        loc = f"{line[0]}:{line[1]}"
    else:
        loc = f"{path}:{line}" if line is not None else f"{path}"
    if not loc:  # a value given in Python, not read from a file: its key alone
        return dotted(tuple(key))
    return f"{loc}: {dotted(tuple(key))}" if key else loc


def dump_yaml(data: Any) -> str:
    """YAML text for plain data, keys in insertion order."""
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    y.sort_base_mapping_type_on_output = False  # type: ignore[assignment]  # ruamel types the option as None
    out = io.StringIO()
    y.dump(data, out)
    return out.getvalue()


def load_value(text: str) -> Any:
    """One YAML value (a ``--set`` right-hand side), as plain Python (``null`` is None)."""
    if text.strip() in ("null", "Null", "NULL", "~"):  # YAML 1.2's nulls: an empty *document* reads as {}
        return None
    data, _ = parse_yaml(text, "--set")
    return data


def find_beside(value: str, path: str, lines: Lines, key: Key) -> tuple[Path | None, list[str]]:
    """(the file or folder ``value`` names, or None; the folders looked in).

    Relative paths are looked for beside the file that set ``key`` (the config,
    or the ``base:`` file it came from), then in the current directory; a
    ``--set`` value in the current directory first.
    """
    p = Path(value).expanduser()
    if p.is_absolute():
        return (p if p.exists() else None), [str(p.parent)]
    origin = lines.get(tuple(key))
    if isinstance(origin, str):  # --set: typed relative to where the command runs
        folders = [Path("."), Path(path).parent]
    else:
        defined_in = origin[0] if isinstance(origin, tuple) else path
        folders = [Path(defined_in).parent, Path(".")]
    for folder in folders:
        candidate = Path(os.path.normpath(folder / p))
        if candidate.exists():
            return candidate, [str(f) for f in folders]
    return None, list(dict.fromkeys(str(f) for f in folders))


__all__ = [
    "find_beside",
    "Key",
    "Lines",
    "read_yaml",
    "parse_yaml",
    "read_text",
    "dotted",
    "where",
    "dump_yaml",
    "load_value",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
]
