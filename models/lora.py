"""LoRA in the reference decoder (and so in every Hugging Face family): the activation path.

Each projection weight of :mod:`~partitioning.models.attention` and
:mod:`~partitioning.models.layers` (``q``, ``k``, ``v``, ``o``, the MLP's
``wi`` / ``wi_0`` / ``wi_1`` / ``wo``) and the GPT's ``unembed`` goes through
:func:`project` or :func:`adapt`; when the weight's ``/``-joined path matches a
target of the module's ``lora`` (:class:`~partitioning.finetune.lora.LoRA`), two
parameters are created beside it and the projection becomes PEFT's

    y = x W + scale * (dropout(x) A) B

``A`` is ``<name>_lora_a`` (in..., lora) and ``B`` ``<name>_lora_b`` (lora, out...)
for weights stored inputs first; ``(lora, in...)`` and ``(out..., lora)`` for
``kernel_order: out_in`` (PEFT's ``lora_A.weight (r, in)`` and ``lora_B.weight
(out, r)`` up to a reshape). Their logical names are the weight's with ``lora``
on the rank axis, so the rule table lays them out; ``B`` starts at zero, so a
fresh LoRA model computes exactly its base model. Adapters are stored in
``lora.dtype`` (float32 by default) and used in the compute dtype.

The mixture-of-experts weights (router, experts) are not adapted: a target
that only matches them matches nothing LoRA can adapt.

The decision is made once, when the model is initialised, from the weight's
path (the scope path, which is the path ``plan`` prints); after that, the
adapters in the params tree decide (so a pipelined stack, which applies its
block outside the model's scope, adapts the same weights).

Example::

    >>> from partitioning.models import GPT
    >>> model = GPT(embed=64, heads=4, mlp=128, layers=2, lora={"rank": 4, "targets": ["attn/(q|v)$"]})
    >>> params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2, 8), jnp.int32))["params"]
    >>> sorted(params["blocks"]["attn"])
    ['k', 'o', 'q', 'q_lora_a', 'q_lora_b', 'v', 'v_lora_a', 'v_lora_b']
    >>> params["blocks"]["attn"]["q_lora_b"].names, params["blocks"]["attn"]["q_lora_b"].value.shape
    (('layers', 'lora', 'heads', 'kv'), (2, 4, 4, 16))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import logical_spec, param_for_compute, with_logical_constraint, with_logical_partitioning
from partitioning.finetune.lora import A_SUFFIX, B_SUFFIX, RANK_AXIS, LoRA, check_targets, record_site, recording_sites

# Logical names of an activation's leading dimensions (those not contracted with the weight).
LEAD_NAMES = {2: ("batch", "length"), 1: ("batch",)}


def for_call(value: Any, deterministic: bool) -> LoRA | None:
    """A model's ``lora`` field parsed, without dropout when ``deterministic`` (eval, generation)."""
    lora = LoRA.parse(value)
    return None if lora is None else lora.for_training(not deterministic)


def _adapted(mod: nn.Module, name: str, lora: LoRA) -> bool:
    if mod.is_initializing():
        assert mod.scope is not None  # a bound module (inside init / apply)
        path = "/".join((*mod.scope.path, name))
        hit = lora.matches(path)
        record_site(path, hit)
        return hit
    return mod.has_variable("params", name + A_SUFFIX)


def _param(mod: nn.Module, name: str, names: tuple, shape: tuple, dtype: Any, init: Callable) -> jax.Array:
    return param_for_compute(mod.param(name, with_logical_partitioning(init, names), shape, dtype), names)


def _uniform(bound: float) -> Callable:
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _dropout(mod: nn.Module, x: jax.Array, rate: float) -> jax.Array:
    if not rate:
        return x
    keep = jax.random.bernoulli(mod.make_rng("dropout"), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def adapt(
    mod: nn.Module,
    name: str,
    y: jax.Array,
    x: jax.Array,
    equation: str,
    lora: LoRA | None,
    ins: tuple,
    outs: tuple,
    out_in: bool = False,
) -> jax.Array:
    """``y`` (= ``einsum(equation, x, W)``) plus the LoRA branch of weight ``name`` when ``lora`` adapts it.

    ``ins`` / ``outs``: the weight's ``((logical name, size), ...)``, as given to
    :func:`~partitioning.models.layers.kernel`; ``out_in``: stored outputs first.
    """
    if lora is None or not _adapted(mod, name, lora):
        return y
    xs, rest = equation.replace(" ", "").split(",")
    ws, out = rest.split("->")
    in_letters = "".join(c for c in ws if c in xs)
    out_letters = "".join(c for c in ws if c not in xs)
    lead = "".join(c for c in xs if c not in ws)
    r = next(c for c in "rzyxwuqponmlkjihgfedcba" if c not in equation)
    in_names, in_sizes = tuple(n for n, _ in ins), tuple(s for _, s in ins)
    out_names, out_sizes = tuple(n for n, _ in outs), tuple(s for _, s in outs)
    if out_in:
        a_sub, a_names, a_shape = r + in_letters, (RANK_AXIS, *in_names), (lora.rank, *in_sizes)
        b_sub, b_names, b_shape = out_letters + r, (*out_names, RANK_AXIS), (*out_sizes, lora.rank)
    else:
        a_sub, a_names, a_shape = in_letters + r, (*in_names, RANK_AXIS), (*in_sizes, lora.rank)
        b_sub, b_names, b_shape = r + out_letters, (RANK_AXIS, *out_names), (lora.rank, *out_sizes)
    dtype = jnp.dtype(lora.dtype)
    a = _param(mod, name + A_SUFFIX, a_names, a_shape, dtype, _uniform(1.0 / math.sqrt(math.prod(in_sizes))))
    b = _param(mod, name + B_SUFFIX, b_names, b_shape, dtype, nn.initializers.zeros)
    lead_names = LEAD_NAMES.get(len(lead), (None,) * len(lead))
    letter = dict(zip(lead + out_letters, lead_names + out_names, strict=True))
    mid_names = (*lead_names, RANK_AXIS)
    # Explicit axes: the contraction over a (possibly tensor-sharded) input dimension needs its layout named.
    h = jnp.einsum(
        f"{xs},{a_sub}->{lead}{r}",
        _dropout(mod, x, lora.dropout),
        a.astype(y.dtype),
        out_sharding=logical_spec(mid_names),
    )
    h = with_logical_constraint(h, mid_names)
    names = tuple(letter[c] for c in out)
    delta = jnp.einsum(f"{lead}{r},{b_sub}->{out}", h, b.astype(y.dtype), out_sharding=logical_spec(names))
    return y + with_logical_constraint(delta * jnp.asarray(lora.scale, y.dtype), names)


def project(
    mod: nn.Module,
    name: str,
    equation: str,
    x: jax.Array,
    w: jax.Array,
    dtype: Any,
    lora: LoRA | None,
    ins: tuple,
    outs: tuple,
    out_in: bool = False,
) -> jax.Array:
    """``einsum(equation, x, w)`` in ``dtype`` plus its LoRA branch (:func:`adapt`)."""
    return adapt(mod, name, jnp.einsum(equation, x, w.astype(dtype)), x, equation, lora, ins, outs, out_in)


def checks_targets(call: Callable) -> Callable:
    """Decorates a model's ``__call__``: at init, a ``lora`` target that matched no weight is a ConfigError.

    The layers report every weight LoRA could adapt while the init is traced
    (:func:`~partitioning.finetune.lora.recording_sites`); the error lists them.
    """

    @functools.wraps(call)
    def wrapper(self, *args, **kwargs):
        lora = LoRA.parse(getattr(self, "lora", None))
        if lora is None or not self.is_initializing():
            return call(self, *args, **kwargs)
        with recording_sites() as seen:
            out = call(self, *args, **kwargs)
        check_targets(lora, list(seen))
        return out

    return wrapper


def check_lora_targets(model: nn.Module, tokens: Any = None) -> None:
    """Traces ``model``'s init (nothing allocated): a ConfigError if a ``lora`` target matches no weight.

    Example::

        >>> from partitioning.models import GPT
        >>> from partitioning.models.lora import check_lora_targets
        >>> check_lora_targets(GPT(layers=2, scan_layers=False, lora={"rank": 4, "targets": ["attn/qv"]}))
        Traceback (most recent call last):
        partitioning.errors.ConfigError: lora.targets: 'attn/qv' matches no weight LoRA can adapt; did you mean \
'block_1/attn/v'? (the 15 it can: block_0/attn/q, block_0/attn/k, ...
    """
    if LoRA.parse(getattr(model, "lora", None)) is None:
        return
    tokens = jnp.zeros((1, 1), jnp.int32) if tokens is None else tokens
    # A fresh function: a cached trace of an equal model would skip the check.
    jax.eval_shape(lambda key, x: model.init(key, x), jax.random.key(0), tokens)


__all__ = ["LoRA", "adapt", "project", "for_call", "checks_targets", "check_lora_targets", "LEAD_NAMES"]
