"""A model's own failure while it is traced (init or forward pass) -> one :class:`ModelError` line.

``plan``, ``check``, ``tune``, ``train`` and ``rules explain`` all trace the
user's model. When the model's code raises there (a shape mismatch, a
sharding JAX refuses on these mesh axes), the command prints one line: the
model, what was traced, the mesh and its axis types, the model's line that
raised, and the message — never a traceback. Errors the toolkit raises on
purpose (:class:`~partitioning.PartitioningError`) pass through unchanged;
the original exception is the :class:`ModelError`'s ``__cause__``.

Example::

    >>> from partitioning.model.tracing import guard
    >>> class Broken(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         return nn.Dense(4)(x) @ jnp.ones((5, 2))       # (8, 4) @ (5, 2)
    >>> pt.as_model(Broken()).abstract((jnp.zeros((8, 16)),), {})   # the adapters are guarded
    Traceback (most recent call last):
    partitioning.errors.ModelError: ...Broken: the init fails to trace at ...: TypeError: dot_general requires \
contracting dimensions to have the same shape, got (4,) and (5,)...
    >>> @guard                    # wraps a class's abstract / boxed / init / apply
    ... class MyAdapter:
    ...     def __init__(self, fn):
    ...         self.apply_fn = fn
    ...     def apply(self, variables, x):
    ...         return self.apply_fn(variables, x)
    >>> with jax.set_mesh(pt.make_mesh({"data": 2, "tensor": 4})):
    ...     MyAdapter(lambda v, x: x @ v["w"]).apply({"w": jnp.ones((3, 2))}, jnp.ones((4, 5)))
    Traceback (most recent call last):
    partitioning.errors.ModelError: ...<lambda>: the forward pass fails to trace on mesh {data: 2, tensor: 4} \
(auto axes) at ...: TypeError: ...
"""

from __future__ import annotations

import contextlib
import functools
import os
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax
import jax
import optax

from partitioning.errors import ModelError, PartitioningError
from partitioning.fmt import fmt_mesh

# Code that is not the model's: a failing frame here is where the model's call ended up, not the model's line.
_LIBRARIES = tuple(
    str(Path(p).resolve()) + os.sep
    for p in (
        os.path.dirname(jax.__file__),
        os.path.dirname(flax.__file__),
        os.path.dirname(optax.__file__),
        str(Path(__file__).resolve().parents[1]),  # the partitioning package
        sysconfig.get_paths()["stdlib"],
    )
)
_METHODS = {"abstract": "init", "boxed": "init", "init": "init", "apply": "forward pass"}


def _is_library(filename: str) -> bool:
    try:
        path = str(Path(filename).resolve())
    except OSError:
        return True
    return path.startswith(_LIBRARIES) or "site-packages" in path or filename.startswith("<")


def _where(e: BaseException) -> str:
    """``at file:line in Class.method`` of the model's deepest frame (else the deepest frame outside JAX)."""
    frames = [(f, line) for f, line in traceback.walk_tb(e.__traceback__)]
    own = [(f, line) for f, line in frames if not _is_library(f.f_code.co_filename)]
    outside_jax = [(f, line) for f, line in frames if os.sep + "jax" + os.sep not in f.f_code.co_filename]
    candidates = own or outside_jax or frames
    if not candidates:
        return ""
    picked = candidates[-1]
    frame, line = picked
    name = frame.f_code.co_filename
    with contextlib.suppress(ValueError):  # another drive (Windows)
        name = os.path.relpath(name)
    if name.startswith(".."):
        name = os.path.basename(name)
    return f" at {name}:{line} in {getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"


def _on_mesh() -> str:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ""
    types = {str(t).rsplit(".", 1)[-1].lower() for t in mesh.axis_types}
    return f" on mesh {fmt_mesh(tuple(mesh.shape.items()))} ({'/'.join(sorted(types))} axes)"


def model_label(adapter: Any) -> str:
    """``module.Class`` of the model an adapter wraps (a function's qualified name for a FunctionModel)."""
    cls = getattr(adapter, "model_class", None)
    if cls is None and getattr(adapter, "module", None) is not None:
        cls = type(adapter.module)
    obj = cls if cls is not None else getattr(adapter, "apply_fn", adapter)
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def model_error(label: str, what: str, e: BaseException) -> ModelError:
    """The one-line :class:`ModelError` for exception ``e`` raised by the model's code during ``what``."""
    first = (str(e).strip().splitlines() or [""])[0]
    return ModelError(f"{label}: the {what} fails to trace{_on_mesh()}{_where(e)}: {type(e).__name__}: {first}")


def _guarded(method: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except PartitioningError:
            raise
        except Exception as e:
            raise model_error(model_label(self), what, e) from e

    wrapper.__wrapped_model_call__ = True  # type: ignore[attr-defined]  # a marker on the function object
    return wrapper


def guard(cls: type) -> type:
    """Wraps an adapter class's ``abstract``, ``boxed``, ``init`` and ``apply`` (see the module docstring)."""
    for name, what in _METHODS.items():
        method = getattr(cls, name, None)
        if method is not None and not getattr(method, "__wrapped_model_call__", False):
            setattr(cls, name, _guarded(method, what))
    return cls


__all__ = ["guard", "model_error", "model_label"]
