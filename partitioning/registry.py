"""The model registry: lets a YAML config name a Flax module.

The reference models in ``models/`` register themselves; a user registers
their own module the same way and then writes ``model: {name: mine, ...}``.
A registered model maps int token ids ``(batch, length)`` to logits
``(batch, length, vocab)`` so the CLI's language-model loss applies.

Example::

    >>> import flax.linen as nn
    >>> from partitioning import register_model
    >>> @register_model("tiny")
    ... class Tiny(nn.Module):
    ...     vocab_size: int = 256
    ...     def __call__(self, tokens, deterministic=True):
    ...         return nn.Embed(self.vocab_size, 8)(tokens) @ jnp.ones((8, self.vocab_size))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from partitioning.errors import ConfigError, did_you_mean

_REGISTRY: dict[str, type] = {}
_RESERVED = {"parent", "name"}


def register_model(name: str, cls: type | None = None) -> Callable[[type], type] | type:
    """Registers a Flax module class under ``name`` (usable as a decorator)."""

    def deco(c: type) -> type:
        _REGISTRY[name] = c
        return c

    return deco(cls) if cls is not None else deco


def _load_builtin() -> None:
    import models  # noqa: F401  (registers mlp and gpt)


def model_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def model_class(name: str) -> type:
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(
            f"unknown model {name!r} (registered: {', '.join(sorted(_REGISTRY))}){did_you_mean(name, _REGISTRY)}"
        )
    return _REGISTRY[name]


def model_options(name: str) -> dict[str, Any]:
    """The options a model accepts, with their defaults."""
    cls = model_class(name)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in _RESERVED or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
        else:
            out[f.name] = dataclasses.MISSING
    return out


def build_model(name: str, **options: Any) -> Any:
    """Instantiates the registered module ``name`` with ``options``."""
    allowed = model_options(name)
    for k in options:
        if k not in allowed:
            raise ConfigError(
                f"model {name!r} has no option {k!r} (options: {', '.join(allowed)}){did_you_mean(k, allowed)}"
            )
    return model_class(name)(**options)
