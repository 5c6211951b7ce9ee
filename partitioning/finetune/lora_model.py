"""LoRA on any model (Linen, NNX, plain functions): adapters beside the weights, merged at apply.

:class:`LoRAModel` wraps a model adapter (:mod:`partitioning.model.interface`):
for each parameter leaf of at least two dimensions whose ``/``-joined path a
target matches it adds ``<leaf>_lora_a`` and ``<leaf>_lora_b`` beside it, and
every forward pass runs the wrapped model on ``W + scale * A @ B`` (the weight
path). A weight is read as Flax's ``Dense`` / ``Conv`` kernels store it:
inputs are all dimensions but the last, the output is the last -- except a
weight whose first dimension is named ``embed``, which reads from the model
dimension alone (attention's ``q (embed, heads, kv)``: in ``embed``, out
``heads, kv``). Leading dimensions named ``layers`` (a scanned stack) are kept
as a batch of weights. So ``A`` is ``(layers..., in..., lora)`` and ``B``
``(layers..., lora, out...)``, named with the weight's own logical names (or
mesh-axis names) and ``lora``: the same adapters the reference models make
on the activation path for weights stored inputs first.

The reference models do better with the activation path
(:mod:`partitioning.models.lora`): ``x W + scale * (x A) B`` never forms a
weight-sized sum, while the weight path holds a merged copy of each adapted
weight (and its gradient) during the step: weight-sized buffers per adapted
weight, but no optimizer state for the base. ``dropout`` needs the activation
path, so it is refused here.

Example::

    >>> from partitioning.finetune.lora_model import LoRAModel
    >>> dense = nn.Dense(16, kernel_init=pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")))
    >>> model = LoRAModel(dense, pt.finetune.LoRA(rank=4, targets=["kernel"]))
    >>> params = model.abstract((jnp.zeros((2, 32)),), {})["params"]
    >>> {k: (v.names, v.value.shape) for k, v in params.items() if k.startswith("kernel_")}
    {'kernel_lora_a': (('embed', 'lora'), (32, 4)), 'kernel_lora_b': (('lora', 'mlp'), (4, 16))}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

from partitioning.boxes import LogicallyPartitioned, is_box, unbox
from partitioning.errors import ConfigError
from partitioning.finetune.lora import A_SUFFIX, B_SUFFIX, RANK_AXIS, LoRA, check_targets, is_adapter
from partitioning.finetune.merge import lora_delta
from partitioning.model.interface import as_model
from partitioning.model.tracing import guard

# The leading dimension of a stacked (scanned) weight: nn.scan's / nnx.vmap's PARTITION_NAME, by convention.
STACKED = "layers"
# The model dimension: a weight whose first dimension it is reads from it (its only input).
EMBED = "embed"
# Adapters draw their random values from this stream of the init key, so the base init is unchanged.
_ADAPTER_STREAM = 0x10FA


def _names_of(leaf: Any, ndim: int) -> tuple[Any, ...] | None:
    if not is_box(leaf):
        return None
    names = tuple(getattr(leaf, "names", ()) or ())
    return names + (None,) * (ndim - len(names))


def _stacked(names: tuple[Any, ...] | None, ndim: int) -> int:
    """How many leading dimensions are a stack of weights (named ``layers``); at least two remain."""
    n = 0
    while names is not None and n < ndim - 2 and names[n] == STACKED:
        n += 1
    return n


def _inputs(names: tuple[Any, ...] | None, ndim: int, stacked: int) -> int:
    """How many dimensions (after the stacked ones) are inputs: all but the last, or only the first when
    it is named ``embed`` (a projection out of the model dimension, e.g. attention's ``q (embed, heads, kv)``)."""
    if names is not None and names[stacked] == EMBED:
        return 1
    return ndim - stacked - 1


class LoRAModel:
    """A model with LoRA adapters on the parameters ``lora.targets`` match (the weight path; module docstring).

    ``model`` is anything :func:`~partitioning.as_model` takes; ``lora`` a
    :class:`~partitioning.finetune.LoRA` or its mapping. A target matching no parameter
    of at least two dimensions is a ConfigError listing those it could match
    (``origin``, e.g. a config's ``file:line: model.lora.targets``, replaces its
    ``lora.targets`` prefix).

    Example::

        >>> from flax import nnx
        >>> from partitioning.finetune.lora_model import LoRAModel
        >>> model = LoRAModel(pt.NNXModel(lambda rngs: nnx.Linear(8, 4, rngs=rngs)), {"rank": 2, "targets": ["kernel"]})
        >>> variables = model.init(jax.random.key(0), (jnp.ones((3, 8)),), {})
        >>> sorted(variables["params"])
        ['bias', 'kernel', 'kernel_lora_a', 'kernel_lora_b']
        >>> y, _ = model.apply(variables, (jnp.ones((3, 8)),), {}, rngs={}, train=False)   # B = 0: the base model
        >>> y.shape
        (3, 4)
    """

    def __init__(self, model: Any, lora: Any, *, origin: str | None = None):
        self.inner = as_model(model)
        parsed = LoRA.parse(lora)
        if parsed is None:
            raise ConfigError("LoRAModel needs lora options, got None", arg="lora")
        if parsed.dropout:
            raise ConfigError(
                f"lora.dropout must be 0 for this model, got {parsed.dropout:g}: dropout on the adapters' input "
                "needs the activation path, which only the reference models have (gpt and the Hugging Face families)",
                arg="lora.dropout",
            )
        if parsed.base_dtype is not None:
            raise ConfigError(
                f"lora.base_dtype: a quantized base ({parsed.base_dtype}) needs layers that dequantize their own "
                "kernels, which only the reference models have (gpt and the Hugging Face families); drop base_dtype",
                arg="lora.base_dtype",
            )
        self.lora, self.origin = parsed, origin
        self.kind = self.inner.kind

    @property
    def axis_names(self) -> list[str]:
        return self.inner.axis_names

    @property
    def model_class(self) -> Any:  # what error messages name: the wrapped model
        cls = getattr(self.inner, "model_class", None)
        module = getattr(self.inner, "module", None)
        return cls if cls is not None else type(module) if module is not None else None

    @property
    def apply_fn(self) -> Any:
        return getattr(self.inner, "apply_fn", self.inner)

    def _flat(self, params: Any) -> dict[tuple[str, ...], Any]:
        if not isinstance(params, Mapping):
            raise ConfigError(
                f"LoRA on this model needs its params as nested dicts, got {type(params).__name__}", arg="lora"
            )
        return traverse_util.flatten_dict(dict(params))

    def targets(self, params: Any) -> list[tuple[str, ...]]:
        """The paths of the weights this model's LoRA adapts (ConfigError for a target matching none)."""
        flat = self._flat(params)
        candidates = [
            k
            for k, v in flat.items()
            if len(jnp.shape(v.value if is_box(v) else v)) >= 2 and not is_adapter("/".join(map(str, k)))
        ]
        try:
            check_targets(self.lora, ["/".join(map(str, k)) for k in candidates], what="parameter of >= 2 dims")
        except ConfigError as e:
            if self.origin is None:
                raise
            raise ConfigError(f"{self.origin}: {str(e).removeprefix('lora.targets: ')}", arg=e.arg) from None
        return [k for k in candidates if self.lora.matches("/".join(map(str, k)))]

    def abstract(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return jax.eval_shape(lambda rng: self.boxed(rng, args, kwargs), jax.random.key(0))

    def boxed(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        variables = dict(self.inner.boxed(rng, args, kwargs))
        flat = self._flat(variables.get("params", {}))
        key = jax.random.fold_in(rng, _ADAPTER_STREAM)
        rank, dtype = self.lora.rank, jnp.dtype(self.lora.dtype)
        for i, path in enumerate(self.targets(variables.get("params", {}))):
            leaf = flat[path]
            shape = tuple(jnp.shape(leaf.value if is_box(leaf) else leaf))
            names = _names_of(leaf, len(shape))
            s = _stacked(names, len(shape))
            n = s + _inputs(names, len(shape), s)
            stack, ins, out = shape[:s], shape[s:n], shape[n:]
            bound = 1.0 / math.sqrt(math.prod(ins))
            a = jax.random.uniform(jax.random.fold_in(key, i), (*stack, *ins, rank), dtype, -bound, bound)
            b = jnp.zeros((*stack, rank, *out), dtype)
            if names is not None:
                a_box: Any = LogicallyPartitioned(a, (*names[:n], RANK_AXIS))
                b_box: Any = LogicallyPartitioned(b, (*names[:s], RANK_AXIS, *names[n:]))
            else:
                a_box, b_box = a, b
            flat[(*path[:-1], path[-1] + A_SUFFIX)] = a_box
            flat[(*path[:-1], path[-1] + B_SUFFIX)] = b_box
        return {**variables, "params": traverse_util.unflatten_dict(flat)}

    def init(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return unbox(self.boxed(rng, args, kwargs))

    def merged(self, params: Any) -> Any:
        """The wrapped model's params: each adapted weight ``W + scale * A @ B``, the adapters removed."""
        flat = self._flat(params)
        out = {k: v for k, v in flat.items() if not is_adapter("/".join(map(str, k)))}
        for path in out:
            a_key, b_key = (*path[:-1], path[-1] + A_SUFFIX), (*path[:-1], path[-1] + B_SUFFIX)
            if a_key not in flat:
                continue
            w, a, b = out[path], flat[a_key], flat[b_key]
            delta = lora_delta(a, b, stacked=a.ndim + b.ndim - 2 - w.ndim)  # stacked leading dimensions
            w32 = w.astype(jnp.float32) + self.lora.scale * delta
            out[path] = w32.astype(w.dtype)
        return traverse_util.unflatten_dict(out)

    def apply(
        self,
        variables: Mapping[str, Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        rngs: Mapping[str, jax.Array],
        train: bool,
    ) -> tuple[Any, dict[str, Any]]:
        variables = {**variables, "params": self.merged(variables["params"])}
        return self.inner.apply(variables, args, kwargs, rngs=rngs, train=train)


guard(LoRAModel)

__all__ = ["LoRAModel", "STACKED"]
