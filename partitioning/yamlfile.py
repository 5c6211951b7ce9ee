"""YAML files read with the line of every key, so errors can say ``file:line: key``.

Both rule files (:mod:`partitioning.rules`) and run configs
(:mod:`partitioning.config`) are read here. A *key* is the tuple of mapping
keys and list indices leading to a value (``("rules", 3)``); ``lines`` maps
each key to its 1-based line, or to the ``--set`` flag that replaced it.

Example::

    >>> data, lines = read_yaml("configs/quickstart.yaml")
    >>> where("configs/quickstart.yaml", lines, ("train", "steps"))
    'configs/quickstart.yaml:42: train.steps'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from partitioning.errors import ConfigError

Key = tuple[Any, ...]
Lines = dict[Key, Any]   # key -> line number (int) or the --set flag (str) that set it


class _Loader(yaml.SafeLoader):
    pass


def read_yaml(path: str | Path, what: str = "YAML file") -> tuple[Any, Lines]:
    """Parses a YAML file keeping the 1-based line of every mapping key and list item.

    ``what`` names the file in errors (``no such config file``).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    lines: Lines = {}
    loader = _Loader("")

    def build(n: yaml.Node, key: Key) -> Any:
        lines.setdefault(key, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for kn, vn in n.value:
                k = loader.construct_object(kn, deep=True)
                if k in out:
                    raise ConfigError(f"{path}:{kn.start_mark.line + 1}: {dotted(key + (k,))}: key appears twice")
                lines[key + (k,)] = kn.start_mark.line + 1
                out[k] = build(vn, key + (k,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(v, key + (i,)) for i, v in enumerate(n.value)]
        return loader.construct_object(n, deep=True)

    data = build(node, ()) if node is not None else {}
    return data, lines


def dotted(key: Key) -> str:
    """``train.steps``, ``rules[3]``: a key as a person writes it."""
    out = ""
    for k in key:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def where(path: str | Path, lines: Mapping[Key, Any], key: Key) -> str:
    """``file:line: dotted.key`` (or ``file (--set k=v): dotted.key`` for an override)."""
    k = tuple(key)
    while k and k not in lines:
        k = k[:-1]
    line = lines.get(k)
    if isinstance(line, str):
        loc = f"{path} ({line})"
    else:
        loc = f"{path}:{line}" if line is not None else f"{path}"
    return f"{loc}: {dotted(tuple(key))}" if key else loc


def dump_yaml(data: Any) -> str:
    """YAML text for plain data, keys in insertion order."""
    return yaml.safe_dump(data, sort_keys=False)


__all__ = ["Key", "Lines", "read_yaml", "dotted", "where", "dump_yaml"]
