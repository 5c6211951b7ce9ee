"""YAML run configs -> typed config; every error names file, line and key.

A run config has sections ``model``, ``mesh``, ``rules`` (required) and
``data``, ``optimizer``, ``train``, ``checkpoint``, ``run_dir``,
``on_indivisible``, ``optimizer_rules`` (optional). See the README's config
reference. ``--set a.b.c=value`` overrides any key (value parsed as YAML).

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

from partitioning.errors import ConfigError, RuleError, did_you_mean
from partitioning.rules import ON_INDIVISIBLE, PRESET_DIR, Rules, preset_names

Key = tuple[Any, ...]


# -- YAML with line numbers ---------------------------------------------------

class _Loader(yaml.SafeLoader):
    pass


def _read_yaml(path: Path) -> tuple[Any, dict[Key, int]]:
    """Parses YAML keeping the 1-based line of every mapping value and list item."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    lines: dict[Key, int] = {}
    loader = _Loader("")

    def build(n: yaml.Node, key: Key) -> Any:
        lines.setdefault(key, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for kn, vn in n.value:
                k = loader.construct_object(kn, deep=True)
                if k in out:
                    raise ConfigError(f"{path}:{kn.start_mark.line + 1}: {_dotted(key + (k,))}: key appears twice")
                lines[key + (k,)] = kn.start_mark.line + 1
                out[k] = build(vn, key + (k,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(v, key + (i,)) for i, v in enumerate(n.value)]
        return loader.construct_object(n, deep=True)

    data = build(node, ()) if node is not None else {}
    return data, lines


def _dotted(key: Key) -> str:
    out = ""
    for k in key:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


# -- schema ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MeshConfig:
    shape: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": 1, "fsdp": -1})
    axis_types: str = "auto"
    devices: int | None = None   # None: all visible devices


@dataclasses.dataclass(frozen=True)
class DataConfig:
    path: str | None = None       # None: the embedded standard-library corpus
    eval_fraction: float = 0.05
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"
    lr: float = 3e-3
    warmup_steps: int = 20
    schedule: str = "cosine"       # cosine | constant | linear
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9          # sgd only
    clip_norm: float | None = 1.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 32
    seq_len: int = 128
    grad_accum: int = 1
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 4
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = None         # None: RUN_DIR/checkpoints
    every: int = 0                 # 0: only at the end (and on Ctrl-C / SIGTERM)
    keep: int = 3
    keep_best: bool = False
    async_: bool = True


SECTIONS = {
    "mesh": MeshConfig, "data": DataConfig, "optimizer": OptimizerConfig,
    "train": TrainConfig, "checkpoint": CheckpointConfig,
}
TOP_KEYS = ["model", "mesh", "rules", "optimizer_rules", "on_indivisible", "data",
            "optimizer", "train", "checkpoint", "run_dir"]
REQUIRED = ["model", "mesh", "rules"]
CHOICES = {
    ("mesh", "axis_types"): ("auto", "explicit"),
    ("optimizer", "name"): ("adamw", "adafactor", "sgd"),
    ("optimizer", "schedule"): ("cosine", "constant", "linear"),
}


def _field_key(name: str) -> str:
    return "async" if name == "async_" else name


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated run config. ``raw`` is the resolved mapping (overrides applied)."""

    path: str
    raw: dict[str, Any]
    lines: dict[Key, int]
    model_name: str
    model_options: dict[str, Any]
    mesh: MeshConfig
    rules: Rules
    optimizer_rules: Rules | None
    on_indivisible: str
    data: DataConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    run_dir: str

    def where(self, *key: Any) -> str:
        return _where(self.path, self.lines, key)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.raw, sort_keys=False)


def _where(path: str, lines: Mapping[Key, int], key: Key) -> str:
    k = tuple(key)
    while k and k not in lines:
        k = k[:-1]
    line = lines.get(k)
    if isinstance(line, str):  # from a --set override
        loc = f"{path} ({line})"
    else:
        loc = f"{path}:{line}" if line is not None else f"{path}"
    return f"{loc}: {_dotted(tuple(key))}" if key else loc


def _type_ok(value: Any, default: Any, annotation: str) -> bool:
    if value is None:
        return "None" in annotation
    if "bool" in annotation:
        return isinstance(value, bool)
    if "float" in annotation:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if "int" in annotation and "dict" not in annotation:
        return isinstance(value, int) and not isinstance(value, bool)
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
    fields = {_field_key(f.name): f for f in dataclasses.fields(cls)}
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


def _rules_from(value: Any, path: str, lines, key: Key) -> Rules:
    """A preset name, an inline list of pairs, or ``{preset, extra}``."""
    where = _where(path, lines, key)
    if isinstance(value, str):
        if value.endswith((".yaml", ".yml")):
            f = Path(value)
            if not f.is_absolute() and not f.exists():
                f = Path(path).parent / f
            if not f.exists():
                raise ConfigError(f"{where}: no such rules file {value!r}")
            return load_rules_file(f)
        try:
            return _preset_rules(value)
        except RuleError as e:
            raise ConfigError(f"{where}: {e}") from None
    if isinstance(value, Mapping):
        for k in value:
            if k not in ("preset", "extra"):
                raise ConfigError(
                    f"{_where(path, lines, key + (k,))}: unknown key (valid: preset, extra){did_you_mean(str(k), ['preset', 'extra'])}"
                )
        base = _rules_from(value["preset"], path, lines, key + ("preset",)) if "preset" in value else Rules()
        extra = _rules_from(value.get("extra") or [], path, lines, key + ("extra",))
        # Extra rules go first: they take precedence over the preset's.
        return extra + base
    if isinstance(value, list):
        origins = [_where(path, lines, key + (i,)) for i in range(len(value))]
        try:
            return Rules(value, origins)
        except RuleError as e:
            raise ConfigError(str(e)) from None
    raise ConfigError(
        f"{where}: rules must be a preset name ({', '.join(preset_names())}), a list of "
        f"[logical, mesh_axes] pairs, or {{preset: NAME, extra: [...]}}; got {type(value).__name__}"
    )


def _preset_rules(name: str) -> Rules:
    return Rules.preset(name)


def load_rules_file(path: str | Path) -> Rules:
    """Reads a rules YAML: a list of pairs, or a mapping with a ``rules`` key."""
    path = Path(path)
    data, lines = _read_yaml(path)
    if isinstance(data, Mapping):
        if "rules" not in data:
            raise ConfigError(f"{path}: a rules file needs a top-level 'rules:' list")
        return _rules_from(data["rules"], str(path), lines, ("rules",))
    return _rules_from(data, str(path), lines, ())


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
    """Loads, overrides and validates a run config."""
    path_s = str(path)
    data, lines = _read_yaml(Path(path))
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
    if not isinstance(model, Mapping) or "name" not in model:
        raise ConfigError(f"{_where(path_s, lines, ('model',))}: expected a mapping with a 'name' key, e.g. {{name: gpt}}")
    from partitioning import registry

    try:
        allowed = registry.model_options(model["name"])
    except ConfigError as e:
        raise ConfigError(f"{_where(path_s, lines, ('model', 'name'))}: {e}") from None
    options = {k: v for k, v in model.items() if k != "name"}
    for k in options:
        if k not in allowed:
            raise ConfigError(
                f"{_where(path_s, lines, ('model', k))}: model {model['name']!r} has no option {k!r} "
                f"(options: {', '.join(allowed)}){did_you_mean(str(k), allowed)}"
            )

    sections = {}
    for name, cls in SECTIONS.items():
        sections[name] = _build_section(cls, data.get(name), path_s, lines, (name,))
    from partitioning.mesh import MeshSpec
    from partitioning.errors import MeshError

    try:
        MeshSpec.from_mapping(sections["mesh"].shape, sections["mesh"].axis_types)
    except MeshError as e:
        raise ConfigError(f"{_where(path_s, lines, ('mesh', 'shape'))}: {e}") from None

    rules = _rules_from(data["rules"], path_s, lines, ("rules",))
    try:
        rules.validate(sections["mesh"].shape)
    except RuleError as e:
        raise ConfigError(str(e)) from None
    opt_rules = None
    if data.get("optimizer_rules") is not None:
        opt_rules = _rules_from(data["optimizer_rules"], path_s, lines, ("optimizer_rules",))
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
        path=path_s, raw=data, lines=lines, model_name=model["name"], model_options=options,
        mesh=sections["mesh"], rules=rules, optimizer_rules=opt_rules, on_indivisible=on_ind,
        data=sections["data"], optimizer=sections["optimizer"], train=sections["train"],
        checkpoint=sections["checkpoint"], run_dir=run_dir,
    )


__all__ = ["Config", "load_config", "load_rules_file", "PRESET_DIR"]
