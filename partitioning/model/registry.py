"""The model registry: lets a YAML config name a model class.

A registered model is built from keyword options (``model: {name: gpt,
embed: 128}``). Options are checked against the class's constructor — its
dataclass fields (Flax Linen modules) or its signature (anything else, Flax
NNX modules included) — so a typo is an error naming the option, never a
``TypeError`` deep inside the model. The reference models
(:mod:`partitioning.models`) register ``mlp`` and ``gpt`` when imported;
``partitioning`` itself never imports them.

Example::

    >>> from partitioning import register_model
    >>> from partitioning.model.registry import build_model
    >>> @register_model("tiny")
    ... class Tiny(nn.Module):
    ...     vocab_size: int = 256
    ...     def __call__(self, tokens, deterministic=True):
    ...         return nn.Embed(self.vocab_size, 8)(tokens) @ jnp.ones((8, self.vocab_size))
    >>> build_model("tiny", vocab_size=512).vocab_size
    512
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from partitioning.errors import ConfigError, did_you_mean

_REGISTRY: dict[str, type] = {}
# Linen's own dataclass fields, set by Flax rather than by a config.
_RESERVED = {"parent", "name"}
REQUIRED = dataclasses.MISSING


def register_model(name: str, cls: type | None = None) -> Callable[[type], type] | type:
    """Registers a model class under ``name`` (usable as a decorator).

    Example::

        >>> from partitioning import register_model
        >>> class MyModel(nn.Module):
        ...     width: int = 64
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         return nn.Dense(self.width)(x)
        >>> register_model("mine", MyModel)
        <class '...MyModel'>
    """

    def deco(c: type) -> type:
        _REGISTRY[name] = c
        return c

    return deco(cls) if cls is not None else deco


def model_names() -> list[str]:
    """The registered names (``import partitioning.models`` registers ``gpt`` and ``mlp``).

    Example::

        >>> import partitioning.models  # registers gpt and mlp
        >>> from partitioning.model.registry import model_names
        >>> "gpt" in model_names()
        True
    """
    return sorted(_REGISTRY)


def model_class(name: str) -> type:
    """The class registered as ``name``; a :class:`ConfigError` with a did-you-mean otherwise."""
    if name not in _REGISTRY:
        raise ConfigError(
            f"unknown model {name!r} (registered: {', '.join(sorted(_REGISTRY))}){did_you_mean(name, _REGISTRY)}",
            arg="name",
        )
    return _REGISTRY[name]


def constructor_options(cls: Any) -> dict[str, Any]:
    """The keyword options ``cls`` takes, with their defaults (``REQUIRED`` when none).

    Dataclasses (Flax Linen modules) by their fields, anything else by its
    signature.
    """
    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in _RESERVED or not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = REQUIRED
        return out
    # A class's own __init__ (not its metaclass's __call__, e.g. NNX's) names its options.
    target = cls.__init__ if isinstance(cls, type) else cls  # type: ignore[misc]  # a class is inspected through its __init__
    out = {}
    for p in list(inspect.signature(target).parameters.values()):
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[p.name] = REQUIRED if p.default is inspect.Parameter.empty else p.default
    return out


def check_options(what: str, cls: Any, options: dict[str, Any]) -> None:
    """Raises a :class:`ConfigError` (``arg`` = the option) for an option ``cls`` does not take."""
    allowed = constructor_options(cls)
    for k in options:
        if k not in allowed:
            raise ConfigError(
                f"{what} has no option {k!r} (options: {', '.join(allowed)}){did_you_mean(str(k), allowed)}", arg=str(k)
            )


def build_model(name: str, **options: Any) -> Any:
    """Instantiates the model registered as ``name`` with ``options`` (checked first).

    Example::

        >>> import partitioning.models  # registers gpt and mlp
        >>> from partitioning.model.registry import build_model
        >>> build_model("gpt", embed=64, layers=2).layers
        2
        >>> build_model("gpt", embedd=64)
        Traceback (most recent call last):
        ...
        partitioning.errors.ConfigError: model 'gpt' has no option 'embedd' (options: ...); did you mean 'embed'?
    """
    cls = model_class(name)
    check_options(f"model {name!r}", cls, options)
    return cls(**options)


__all__ = [
    "register_model",
    "model_names",
    "model_class",
    "constructor_options",
    "check_options",
    "build_model",
    "REQUIRED",
]
