"""Loading a run config: YAML -> typed :class:`Config`; every error names file, line and key.

A run config has sections ``model``, ``mesh``, ``rules`` (required) and
``data``, ``optimizer``, ``train``, ``checkpoint``, ``run_dir``,
``on_indivisible``, ``optimizer_rules`` (optional). See the README's config
reference. ``--set a.b.c=value`` overrides any key (value parsed as YAML).
The model section is checked against the model itself when it is built
(:mod:`partitioning.config.build`), which is where the models are known.

Example::

    >>> cfg = load_config("configs/quickstart.yaml", overrides=["train.steps=50"])
    >>> cfg.train.steps, cfg.rules[0]
    (50, ('batch', ('data', 'fsdp')))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from partitioning.config.schema import CHOICES, REQUIRED, SECTIONS, TOP_KEYS, Config, field_key
from partitioning.errors import ConfigError, MeshError, RuleError, did_you_mean
from partitioning.mesh import MeshSpec
from partitioning.resolve import ON_INDIVISIBLE
from partitioning.rules import Rules
from partitioning.yamlfile import Key, read_yaml, where as _where

TARGET = "_target_"


def _type_ok(value: Any, default: Any, annotation: str) -> bool:
    if value is None:
        return "None" in annotation
    if "bool" in annotation:
        return isinstance(value, bool)
    if "float" in annotation:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if "int" in annotation and "dict" not in annotation:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation.startswith("list[str]"):
        return isinstance(value, list) and all(isinstance(x, str) for x in value)
    if "str" in annotation and "dict" not in annotation:
        return isinstance(value, str)
    if "dict" in annotation:
        return isinstance(value, Mapping)
    return True


def _expected(annotation: str) -> str:
    a = annotation.replace(" | None", " or null")
    return {"dict[str, int]": "a mapping of axis name to size"}.get(a, a)


def _build_section(cls: type, data: Any, path: str, lines, key: Key):
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path, lines, key)}: expected a mapping, got {type(data).__name__}")
    if TARGET in data and "target" in {f.name for f in dataclasses.fields(cls)}:
        # `_target_` names an object built from the section's other keys (only `seed` stays ours).
        rest = {k: v for k, v in data.items() if k != "seed"}
        return cls(target=rest, **({"seed": data["seed"]} if "seed" in data else {}))
    fields = {field_key(f.name): f for f in dataclasses.fields(cls) if f.name != "target"}
    kwargs = {}
    for k, v in data.items():
        if k not in fields:
            raise ConfigError(
                f"{_where(path, lines, key + (k,))}: unknown key (valid: {', '.join(fields)}){did_you_mean(str(k), fields)}"
            )
        f = fields[k]
        if not _type_ok(v, f.default, str(f.type)):
            raise ConfigError(
                f"{_where(path, lines, key + (k,))}: expected {_expected(str(f.type))}, got {type(v).__name__} {v!r}"
            )
        choices = CHOICES.get((key[-1], k))
        if choices and v not in choices:
            raise ConfigError(
                f"{_where(path, lines, key + (k,))}: must be one of {', '.join(choices)}, got {v!r}"
                f"{did_you_mean(str(v), choices)}"
            )
        kwargs[f.name] = float(v) if "float" in str(f.type) and isinstance(v, int) else v
    return cls(**kwargs)


def load_rules_file(path: str | Path) -> Rules:
    """Reads a rules YAML: a list of pairs, or a mapping with a ``rules`` key (see :meth:`Rules.from_yaml`)."""
    return Rules.from_yaml(path)


def _apply_override(data: dict, lines: dict, text: str) -> None:
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected KEY=VALUE, e.g. train.steps=100")
    dotted, raw = text.split("=", 1)
    keys = dotted.strip().split(".")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = data
    for i, k in enumerate(keys[:-1]):
        if i == 0 and k not in TOP_KEYS:
            raise ConfigError(f"--set {text}: unknown key {k!r}{did_you_mean(k, TOP_KEYS)}")
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    if len(keys) == 1 and keys[0] not in TOP_KEYS:
        raise ConfigError(f"--set {text}: unknown key {keys[0]!r}{did_you_mean(keys[0], TOP_KEYS)}")
    node[keys[-1]] = value
    # The overridden subtree has no file lines any more: errors point at the flag.
    for k in [k for k in lines if k[: len(keys)] == tuple(keys)]:
        del lines[k]
    lines[tuple(keys)] = f"--set {text}"  # type: ignore[assignment]


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Loads, overrides (``--set`` style ``key=value``) and validates a run config.

    Example::

        >>> load_config("configs/quickstart.yaml", ["rules=tp", "mesh.shape={data: 1, tensor: -1}"]).rules[0]
        ('batch', 'data')
    """
    path_s = str(path)
    data, lines = read_yaml(Path(path), "config file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path_s}: a run config is a mapping with sections {', '.join(REQUIRED)}")
    for o in overrides:
        _apply_override(data, lines, o)
    for k in data:
        if k not in TOP_KEYS:
            raise ConfigError(
                f"{_where(path_s, lines, (k,))}: unknown key (valid: {', '.join(TOP_KEYS)}){did_you_mean(str(k), TOP_KEYS)}"
            )
    for k in REQUIRED:
        if k not in data:
            raise ConfigError(f"{path_s}: missing required section {k!r}")

    model = data["model"]
    if not isinstance(model, Mapping) or ("name" in model) == (TARGET in model):
        raise ConfigError(f"{_where(path_s, lines, ('model',))}: expected a mapping with a 'name' key (a registered "
                          f"model, e.g. {{name: gpt}}) or a '_target_' key (module.Class, e.g. "
                          f"{{_target_: my_models.Transformer}})")
    head = "name" if "name" in model else TARGET
    options = {k: v for k, v in model.items() if k != head}

    sections = {}
    for name, cls in SECTIONS.items():
        sections[name] = _build_section(cls, data.get(name), path_s, lines, (name,))
    try:
        MeshSpec.from_mapping(sections["mesh"].shape, sections["mesh"].axis_types)
    except MeshError as e:
        raise ConfigError(f"{_where(path_s, lines, ('mesh', 'shape'))}: {e}") from None

    rules = Rules.parse(data["rules"], path_s, lines, ("rules",))
    try:
        rules.validate(sections["mesh"].shape)
    except RuleError as e:
        raise ConfigError(str(e)) from None
    opt_rules = None
    if data.get("optimizer_rules") is not None:
        opt_rules = Rules.parse(data["optimizer_rules"], path_s, lines, ("optimizer_rules",))
        try:
            opt_rules.validate(sections["mesh"].shape)
        except RuleError as e:
            raise ConfigError(str(e)) from None
    on_ind = data.get("on_indivisible", "error")
    if on_ind not in ON_INDIVISIBLE:
        raise ConfigError(
            f"{_where(path_s, lines, ('on_indivisible',))}: must be one of {', '.join(ON_INDIVISIBLE)}, got {on_ind!r}"
            f"{did_you_mean(str(on_ind), ON_INDIVISIBLE)}"
        )
    run_dir = data.get("run_dir", f"runs/{Path(path_s).stem}")
    if not isinstance(run_dir, str):
        raise ConfigError(f"{_where(path_s, lines, ('run_dir',))}: expected a path string, got {run_dir!r}")
    return Config(
        path=path_s, raw=data, lines=lines, model_name=model[head], model_options=options,
        model_target=head == TARGET,
        mesh=sections["mesh"], rules=rules, optimizer_rules=opt_rules, on_indivisible=on_ind,
        data=sections["data"], optimizer=sections["optimizer"], train=sections["train"],
        checkpoint=sections["checkpoint"], run_dir=run_dir,
    )


__all__ = ["load_config", "load_rules_file"]
