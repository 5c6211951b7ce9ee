"""Loading a run config: YAML -> typed :class:`Config`; every error of a file at once, each at ``file:line: key``.

A run config has sections ``model``, ``mesh``, ``rules`` (required) and
``data``, ``optimizer``, ``train``, ``checkpoint``, ``run_dir``,
``on_indivisible``, ``optimizer_rules``, ``base`` (optional); see the README's
config reference and :mod:`partitioning.config.schema`.

- ``base: other.yaml`` extends another config (MaxText-style): its keys apply
  unless this file sets them (how values combine, here and for ``--set``:
  :mod:`partitioning.config.merge`). Errors in inherited keys name the other
  file's line.
- ``--set a.b.c=value`` overrides any key (the value is YAML); errors in an
  overridden key name the flag.
- The model section is checked against the model itself when it is built
  (:mod:`partitioning.config.build`), which is where the models are known.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
    ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
    >>> cfg = pt.load_config(path, overrides=["train.steps=50"])
    >>> cfg.train.steps, cfg.rules[0]
    (50, ('batch', ('data', 'fsdp')))
    >>> pt.load_config(path, overrides=["train.stpes=50"])
    Traceback (most recent call last):
    ...
    partitioning.errors.ConfigError: .../run.yaml (--set train.stpes=50): train.stpes: unknown key ...
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from partitioning.config.annotations import parse_annotations
from partitioning.config.foreign import not_a_run_config
from partitioning.config.hf import hf_source
from partitioning.config.merge import GLUED, glued_keys, merge, paths, unglue
from partitioning.config.schema import REQUIRED, SECTIONS, TOP_KEYS, Config, DataConfig, HfModelConfig
from partitioning.errors import ConfigError, PartitioningError, RuleError, did_you_mean
from partitioning.mesh import nodes_problem
from partitioning.rules import Rules
from partitioning.yamlfile import Lines, load_value, read_yaml
from partitioning.yamlfile import where as _where

TARGET = "_target_"
MAX_BASES = 16


def load_rules_file(path: str | Path) -> Rules:
    """Reads a rules YAML: a list of pairs, or a mapping with a ``rules`` key (see :meth:`Rules.from_yaml`)."""
    return Rules.from_yaml(path)


# -- files and bases --------------------------------------------------------------------------


def _read(path: Path, shown: str, chain: tuple[str, ...]) -> tuple[dict, Lines]:
    data, lines = read_yaml(path, "config file")
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: a run config is a mapping with sections {', '.join(REQUIRED)}")
    foreign = not_a_run_config(data, shown)
    if foreign:
        raise ConfigError(foreign)
    base = data.pop("base", None)
    if base is None:
        return data, lines
    here = _where(shown, lines, ("base",))
    if not isinstance(base, str):
        raise ConfigError(f"{here}: expected the path of a config file to extend, got {type(base).__name__}")
    base_path = Path(base) if Path(base).is_absolute() else path.parent / base
    resolved = str(base_path.resolve())
    if resolved in chain or len(chain) >= MAX_BASES:
        raise ConfigError(f"{here}: 'base' files extend each other in a loop ({' -> '.join(chain + (resolved,))})")
    if not base_path.exists():
        raise ConfigError(f"{here}: no such config file {base!r} (looked in {path.parent or '.'})")
    base_shown = os.path.relpath(base_path) if not Path(base).is_absolute() else base
    inherited, inherited_lines = _read(base_path, base_shown, chain + (resolved,))
    # Keys from the base file are located in that file.
    inherited_lines = {k: (v if isinstance(v, (tuple, str)) else (base_shown, v)) for k, v in inherited_lines.items()}
    merge(inherited, inherited_lines, data, {k: v for k, v in lines.items() if k != ("base",)})
    return inherited, inherited_lines


# -- --set overrides ----------------------------------------------------------------------------


def _apply_override(data: dict, lines: Lines, text: str) -> None:
    flag = f"--set {text}"
    if "=" not in text:
        raise ConfigError(f"{flag}: expected KEY=VALUE, e.g. train.steps=100")
    dotted_key, raw = text.split("=", 1)
    keys = dotted_key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"{flag}: {dotted_key!r} is not a key; write dotted names, e.g. train.steps=100")
    if keys[0] not in TOP_KEYS:
        raise ConfigError(f"{flag}: unknown key {keys[0]!r}{did_you_mean(keys[0], TOP_KEYS)}")
    try:
        value = load_value(raw) if raw.strip() else None
    except ConfigError:
        value = raw  # not YAML: take it as a string, the schema says whether that is right
    glued = glued_keys(value)
    if glued:
        raise ConfigError(
            f"{flag}: {glued[0]!r} reads as one key with no value: YAML needs a space after each colon, "
            f"e.g. {unglue(raw.strip())}"
        )
    node = data
    for i, k in enumerate(keys[:-1]):
        if k not in node or node[k] is None:
            node[k] = {}
        elif not isinstance(node[k], dict):
            raise ConfigError(
                f"{flag}: {'.'.join(keys[: i + 1])} is {node[k]!r} ({type(node[k]).__name__}), not a mapping with keys"
            )
        node = node[k]
    # The same merge as base: (a mapping merges key by key unless it replaces whole); what it sets points at the flag.
    key = tuple(keys)
    merge(node, lines, {keys[-1]: value}, {key + sub: flag for sub in paths(value)}, key[:-1])


def _sibling_hint(model: type[BaseModel], field: tuple[Any, ...], value: Any) -> str:
    """``; did you mean 'steps'?`` when a value of the wrong type fits a key whose name is close (``train.step=20``)."""
    if len(field) != 1 or value is None:
        return ""
    close = [k for k in _model_keys(model) if k != field[0] and did_you_mean(str(field[0]), [k])]
    for k in close:
        try:
            model.model_validate({k: value})
        except ValidationError:
            continue
        return did_you_mean(str(field[0]), [k])
    return ""


# -- validation messages ------------------------------------------------------------------------

_TYPE_NAMES = {
    "int_type": "int",
    "int_parsing": "int",
    "float_type": "float",
    "float_parsing": "float",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "list_type": "a list",
    "none_required": "null",
    "int_from_float": "int",
}
_RANGES = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def _field_path(data: Any, loc: Sequence[Any]) -> tuple[Any, ...]:
    """The part of a pydantic error location that names keys of the data (not union member tags)."""
    out, node = [], data
    for part in loc:
        if (
            isinstance(node, Mapping)
            and part in node
            or isinstance(node, list)
            and isinstance(part, int)
            and part < len(node)
        ):
            node = node[part]
        else:
            break
        out.append(part)
    return tuple(out)


def _model_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items() if name != "target"]


def _show(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _messages(
    e: ValidationError, section: str, data: Any, model: type[BaseModel], path: str, lines: Lines
) -> list[str]:
    """One ``file:line: key: expected ...`` line per field a pydantic error names."""
    by_field: dict[tuple[Any, ...], list[ErrorDetails]] = {}
    for err in e.errors():
        by_field.setdefault(_field_path(data, err["loc"]), []).append(err)
    out = []
    for field, errs in by_field.items():
        here = _where(path, lines, (section,) + field)
        kinds = {err["type"] for err in errs}
        value = errs[0].get("input")
        if "extra_forbidden" in kinds:
            valid = _model_keys(model)
            hint = did_you_mean(str(field[-1]), valid)
            if (section, *field) == ("model", "base_dtype"):  # QLoRA's key lives under the adapters it serves
                hint = "; a quantized base is a LoRA option: set model.lora.base_dtype (the base is frozen under LoRA)"
            out.append(f"{here}: unknown key (valid: {', '.join(valid)}){hint}")
        elif "missing" in kinds:
            out.append(f"{here}: missing required key")
        elif kinds & set(_RANGES):
            err = next(x for x in errs if x["type"] in _RANGES)
            op, name = _RANGES[err["type"]]
            bound = err["ctx"][name]
            bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
            out.append(f"{here}: must be {op} {bound}, got {value!r}")
        elif "literal_error" in kinds:
            err = next(x for x in errs if x["type"] == "literal_error")
            choices = re.findall(r"'([^']*)'", str(err["ctx"].get("expected", "")))
            out.append(f"{here}: must be one of {', '.join(choices)}, got {value!r}{did_you_mean(str(value), choices)}")
        elif "value_error" in kinds:
            err = next(x for x in errs if x["type"] == "value_error")
            out.append(f"{here}: {str(err['msg']).removeprefix('Value error, ')}")
        else:
            names = list(dict.fromkeys(t for k in kinds if (t := _TYPE_NAMES.get(k))))
            expected = " or ".join(names) if names else errs[0]["msg"].lower()
            hint = _sibling_hint(model, field, value)
            if value is None and isinstance(field[-1], str) and GLUED.match(field[-1]):
                hint = f"; YAML needs a space after the colon: {unglue(field[-1])!r}"
            out.append(f"{here}: expected {expected}, got {_show(value)}{hint}")
    return out


# -- the config --------------------------------------------------------------------------------


def _line_order(message: str) -> tuple[str, int]:
    """Errors of a file in the order a person reads it: by file, then line."""
    m = re.match(r"^(.*?):(\d+): ", message)
    return (m.group(1), int(m.group(2))) if m else (message.split(":", 1)[0], 0)


def _section(name: str, value: Any, path: str, lines: Lines, errors: list[str]) -> Any:
    cls = SECTIONS[name]
    if value is None:
        return cls()
    if not isinstance(value, Mapping):
        errors.append(f"{_where(path, lines, (name,))}: expected a mapping, got {_show(value)}")
        return cls()
    if name == "data" and TARGET in value:
        # `_target_` names a dataset built from the section's other keys (only `seed` stays ours).
        seed = value.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            errors.append(f"{_where(path, lines, (name, 'seed'))}: expected an int >= 0, got {_show(seed)}")
            seed = 0
        return DataConfig(target={k: v for k, v in value.items() if k != "seed"}, seed=seed)
    try:
        return cls.model_validate(value)
    except ValidationError as e:
        errors.extend(_messages(e, name, value, cls, path, lines))
        return cls()


def _parse_rules(key: str, value: Any, path: str, lines: Lines, errors: list[str]) -> Rules | None:
    try:
        return Rules.parse(value, path, lines, (key,))
    except PartitioningError as e:
        errors.append(str(e))
        return None


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Loads, extends (``base:``), overrides (``key=value``) and validates a run config.

    Every error of the file is reported at once: the :class:`ConfigError`'s
    message has one line per error.

    Example::

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
        >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
        ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
        >>> pt.load_config(path, ["rules=tp", "mesh.shape={data: 1, tensor: -1}"]).rules[0]
        ('batch', 'data')
    """
    path_s = str(path)
    data, lines = _read(Path(path), path_s, (str(Path(path).resolve()),))
    data = copy.deepcopy(data)
    for o in overrides:
        _apply_override(data, lines, o)
    errors: list[str] = []
    for k in data:
        if k not in TOP_KEYS:
            errors.append(
                f"{_where(path_s, lines, (k,))}: unknown key (valid: {', '.join(TOP_KEYS)})"
                f"{did_you_mean(str(k), TOP_KEYS)}"
            )
    missing = [k for k in REQUIRED if k not in data]
    if missing:  # one line, also for an empty file
        many = "s" if len(missing) > 1 else ""
        errors.append(f"{path_s}: missing required section{many} {', '.join(repr(k) for k in missing)}")

    model = data.get("model", {})
    head, hf = "name", None
    if "model" in data:
        if not isinstance(model, Mapping) or sum(k in model for k in ("name", TARGET, "hf")) != 1:
            errors.append(
                f"{_where(path_s, lines, ('model',))}: expected a mapping with a 'name' key (a registered "
                f"model, e.g. {{name: gpt}}), a '_target_' key (module.Class, e.g. "
                f"{{_target_: my_models.Transformer}}) or an 'hf' key (a Hugging Face checkpoint folder)"
            )
            model = {"name": "?"}
        head = "name" if "name" in model else TARGET if TARGET in model else "hf"
        if head == "hf":
            try:
                HfModelConfig.model_validate(dict(model))
            except ValidationError as e:
                errors.extend(_messages(e, "model", model, HfModelConfig, path_s, lines))
            hf = hf_source(model.get("hf"), path_s, lines, errors)
        elif not isinstance(model[head], str):
            errors.append(f"{_where(path_s, lines, ('model', head))}: expected a string, got {_show(model[head])}")

    sections = {name: _section(name, data.get(name), path_s, lines, errors) for name in SECTIONS}
    mesh_errors = any(e.split(": ", 2)[1].startswith("mesh") for e in errors if e.count(": ") >= 2)
    rules = _parse_rules("rules", data["rules"], path_s, lines, errors) if "rules" in data else None
    opt_rules = None
    if data.get("optimizer_rules") is not None:
        opt_rules = _parse_rules("optimizer_rules", data["optimizer_rules"], path_s, lines, errors)
    problem = None if mesh_errors else nodes_problem(sections["mesh"].shape, sections["mesh"].nodes or {})
    if problem:
        errors.append(f"{_where(path_s, lines, ('mesh', 'nodes'))}: {problem}")
    if not mesh_errors:  # a broken mesh would only add noise to the rules' errors
        for key, table in (("rules", rules), ("optimizer_rules", opt_rules)):
            if table is None:
                continue
            try:
                table.validate(sections["mesh"].shape)
            except RuleError as e:
                # A rule from a preset or a rules file: located there, and at the key that named it here.
                here = _where(path_s, lines, (key,))
                errors.append(str(e) if str(e).startswith(path_s) else f"{here}: {e}")
    annotations = None
    if data.get("annotations") is not None:
        annotations = parse_annotations(data["annotations"], path_s, lines, rules, sections["mesh"].shape, errors)
    on_ind = data.get("on_indivisible", "error")
    if on_ind not in ("error", "replicate"):
        errors.append(
            f"{_where(path_s, lines, ('on_indivisible',))}: must be one of error, replicate, got "
            f"{on_ind!r}{did_you_mean(str(on_ind), ('error', 'replicate'))}"
        )
    run_dir = data.get("run_dir") or f"runs/{Path(path_s).stem}"
    if not isinstance(run_dir, str):
        errors.append(f"{_where(path_s, lines, ('run_dir',))}: expected a path string, got {_show(run_dir)}")
    if errors:
        raise ConfigError("\n".join(sorted(dict.fromkeys(errors), key=_line_order)))
    assert rules is not None  # a required section: its absence or its errors were raised above
    return Config(
        path=path_s,
        raw=data,
        lines=lines,
        model_name=model[head],
        model_options={k: v for k, v in model.items() if k != head},
        model_target=head == TARGET,
        mesh=sections["mesh"],
        rules=rules,
        optimizer_rules=opt_rules,
        on_indivisible=on_ind,
        data=sections["data"],
        optimizer=sections["optimizer"],
        train=sections["train"],
        checkpoint=sections["checkpoint"],
        run_dir=run_dir,
        model_hf=hf,
        annotations=annotations,
    )


__all__ = ["load_config", "load_rules_file"]
