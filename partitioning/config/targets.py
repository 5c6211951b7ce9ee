"""Objects named in YAML by ``_target_`` (Hydra's convention), built recursively and checked.

    model:
      _target_: my_models.TransformerLM
      config: {_target_: my_models.TransformerConfig, vocab_size: 256, num_layers: 2}

- ``module.attr`` is imported from the folder of the config file first, then
  from ``sys.path`` (so ``models.py`` beside a config is the user's, whatever
  else is installed).
- Mappings with ``_target_`` are built depth first; the other keys are keyword
  arguments, checked against the callable's dataclass fields or signature
  (unknown names and plain-type mismatches are ``file:line`` errors with a
  did-you-mean), then passed.
- A callable that takes ``rngs`` (a Flax NNX module, or a function building
  one) is not called here: it becomes a factory ``rngs -> object`` so the
  trainer can build the model inside its sharded init.

Example::

    >>> from partitioning.config.targets import build_target
    >>> value = {"_target_": "flax.linen.Dense", "features": 16}
    >>> build_target(value, path="run.yaml", lines={}, key=("model",))
    Dense(
        # attributes
        features = 16
        ...
    )
    >>> build_target({"_target_": "flax.linen.Dense", "feature": 16}, path="run.yaml", lines={}, key=("model",))
    Traceback (most recent call last):
    ...
    partitioning.errors.ConfigError: run.yaml: model.feature: 'flax.linen.Dense' has no option 'feature' ...
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from partitioning.errors import ConfigError, PartitioningError, did_you_mean
from partitioning.model.registry import REQUIRED, constructor_options
from partitioning.yamlfile import Key, Lines, where

TARGET = "_target_"


def import_target(target: Any, config_dir: Path | None, here: str) -> Any:
    """The object ``module.attr`` names; the module is looked for beside the config file first."""
    if not isinstance(target, str) or "." not in target.strip("."):
        raise ConfigError(f"{here}: _target_ must be 'module.attribute', got {target!r}")
    module_name, _, attr = target.rpartition(".")
    if config_dir is not None:
        folder = str(Path(config_dir).absolute())
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _forget_shadowed(module_name, Path(folder))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            beside = f" (looked beside the config in {config_dir} and on sys.path)" if config_dir else ""
            raise ConfigError(f"{here}: no module named {module_name!r}{beside}") from None
        raise ConfigError(f"{here}: importing {module_name!r} failed: {e}") from None
    except PartitioningError:
        raise
    except Exception as e:  # the user's module raised while importing: say which and why, on one line
        raise ConfigError(f"{here}: importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    if not hasattr(module, attr):
        names = [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(f"{here}: module {module_name!r} has no attribute {attr!r}{did_you_mean(attr, names)}")
    return getattr(module, attr)


def _forget_shadowed(module_name: str, folder: Path) -> None:
    """If ``module_name`` was imported from elsewhere but a file of that name is beside the config, re-import."""
    top = module_name.split(".")[0]
    mod = sys.modules.get(top)
    local = folder / f"{top}.py"
    if mod is not None and (local.exists() or (folder / top / "__init__.py").exists()):
        origin = Path(getattr(mod, "__file__", "") or "").resolve()
        if origin.parent != folder.resolve() and origin.parent.parent != folder.resolve():
            for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                del sys.modules[name]


def _hints(fn: Any) -> dict[str, Any]:
    """Annotations of a dataclass's fields, a class's ``__init__`` or a function ({} if unresolvable)."""
    # A class's own __init__ (not its metaclass's __call__) names its options.
    target = fn.__init__ if isinstance(fn, type) and not dataclasses.is_dataclass(fn) else fn  # type: ignore[misc]  # a class is inspected through its __init__
    try:
        return typing.get_type_hints(target)
    except Exception:  # forward references we cannot resolve: no type checks, names still checked
        return {}


_PLAIN = {int: "int", float: "float", bool: "bool", str: "str"}


def _type_ok(value: Any, hint: Any) -> str | None:
    """None if ``value`` fits ``hint`` (plain types only; anything else is not checked), else what was expected."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if any(o is typing.Any or o not in _PLAIN and o is not type(None) for o in options):
        return None
    if value is None:
        return None if type(None) in options else " or ".join(_PLAIN[o] for o in options if o in _PLAIN)
    for o in options:
        if o is bool and isinstance(value, bool):
            return None
        if o is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if o is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if o is str and isinstance(value, str):
            return None
    return " or ".join(_PLAIN.get(o, "null") for o in options)


def check_kwargs(
    fn: Any, kwargs: Mapping[str, Any], what: str, here: Callable[[str | None], str], *, complete: bool = True
) -> None:
    """Raises a ConfigError at the offending key for an option ``fn`` does not take or a plain-type mismatch.

    ``complete``: the call will get no other arguments, so required ones must be here.
    """
    allowed = constructor_options(fn)
    hints = _hints(fn)
    accepts_any = _takes_var_keywords(fn)
    for k, v in kwargs.items():
        if k not in allowed and not accepts_any:
            raise ConfigError(
                f"{here(k)}: {what} has no option {k!r} (options: {', '.join(allowed)}){did_you_mean(str(k), allowed)}",
                arg=str(k),
            )
        if k in hints and not isinstance(v, _Built):
            expected = _type_ok(v, hints[k])
            if expected is not None:
                raise ConfigError(f"{here(k)}: expected {expected}, got {type(v).__name__} {v!r}", arg=str(k))
    missing = [k for k, d in allowed.items() if d is REQUIRED and k not in kwargs and k != "rngs"]
    if missing and complete:
        raise ConfigError(f"{here(None)}: {what} needs option(s) {', '.join(missing)}", arg=missing[0])


def _takes_var_keywords(fn: Any) -> bool:
    try:
        target = fn.__init__ if isinstance(fn, type) else fn  # type: ignore[misc]  # its __init__, as above
        return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return False


class _Built:
    """Marks a value built from a nested ``_target_`` (its type is the callable's business)."""

    def __init__(self, value: Any):
        self.value = value


def takes_rngs(fn: Any) -> bool:
    """True for Flax NNX constructors and builders: a callable with an ``rngs`` parameter."""
    return "rngs" in constructor_options(fn)


def build_target(value: Any, *, path: str | Path, lines: Lines, key: Key, call: bool = True) -> Any:
    """Builds a YAML value: mappings with ``_target_`` become objects (recursively), the rest is kept.

    With ``call=False`` the top-level target is returned with its options bound
    (``functools.partial``) instead of called: for functions a config names,
    like a loss.
    """
    config_dir = Path(path).parent if path else None
    return _unwrap(_build(value, str(path), lines, tuple(key), config_dir, call))


def _unwrap(x: Any) -> Any:
    return x.value if isinstance(x, _Built) else x


def _build(value: Any, path: str, lines: Lines, key: Key, config_dir: Path | None, call: bool) -> Any:
    if isinstance(value, list):
        return [_unwrap(_build(v, path, lines, key + (i,), config_dir, True)) for i, v in enumerate(value)]
    if not isinstance(value, Mapping):
        return value
    kwargs = {k: _build(v, path, lines, key + (k,), config_dir, True) for k, v in value.items() if k != TARGET}
    if TARGET not in value:
        return {k: _unwrap(v) for k, v in kwargs.items()}
    here_target = where(path, lines, key + (TARGET,))
    fn = import_target(value[TARGET], config_dir, here_target)
    if not callable(fn):
        raise ConfigError(f"{here_target}: {value[TARGET]!r} is not callable")

    def here(k: str | None) -> str:
        return where(path, lines, key + ((k,) if k is not None else ()))

    check_kwargs(fn, kwargs, repr(value[TARGET]), here, complete=call)
    kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
    if not call:
        return _Built(functools.partial(fn, **kwargs) if kwargs else fn)
    if takes_rngs(fn) and "rngs" not in kwargs:
        return _Built(Factory(fn, kwargs))
    try:
        return _Built(fn(**kwargs))
    except PartitioningError as e:
        arg = getattr(e, "arg", None)
        raise type(e)(f"{here(arg if arg in kwargs else None)}: {e}", arg=arg) from None
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as e:
        raise ConfigError(f"{here(None)}: building {value[TARGET]!r} failed: {type(e).__name__}: {e}") from None


class Factory:
    """``rngs -> fn(**kwargs, rngs=rngs)``: an NNX model the trainer builds inside its sharded init."""

    def __init__(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]):
        self.fn, self.kwargs = fn, dict(kwargs)

    def __call__(self, rngs: Any) -> Any:
        return self.fn(**self.kwargs, rngs=rngs)

    def __repr__(self) -> str:
        return f"Factory({getattr(self.fn, '__qualname__', self.fn)}, {self.kwargs})"


__all__ = ["build_target", "import_target", "check_kwargs", "takes_rngs", "Factory", "TARGET"]
