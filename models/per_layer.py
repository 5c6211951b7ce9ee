"""Gemma 4's per-layer inputs (PLE), its value norm and its layer scalar.

- **per-layer inputs** (:class:`PerLayerInputs`): besides the token embedding, each token gets a small vector
  per layer, ``(batch, length, layers, per_layer)``: a lookup in ``per_layer_embedding`` (``(vocab,
  per_layer_layers, per_layer)``, scaled by ``sqrt(per_layer)``) plus a projection of the scaled token embedding
  (``per_layer_proj``, times ``embed ** -0.5``, RMS-normed over ``per_layer``), the sum times ``2 ** -0.5``,
  as transformers' ``get_per_layer_inputs`` / ``project_per_layer_inputs`` compute it.
- **the per-layer residual** (:class:`PerLayerResidual`): after the MLP, each layer adds
  ``norm(W_up(act(W_gate x) * input_i))``, its own slice ``input_i`` of those vectors.
- **value norm** (:func:`value_norm`): an RMSNorm without a scale of each value head.
- **layer scalar**: every layer's output is multiplied by a stored scalar (``layer_scalar``, ``(1,)``).
- **shared keys and values** (:func:`kv_sharing`): the last ``kv_shared_layers`` layers have no key or value
  projections; each attends with its own queries to the keys and values of the last earlier layer of its type
  (decoding, it caches them too: the same values, so the same logits; the memory transformers saves is not saved).

Example::

    >>> from partitioning.models.per_layer import PerLayerInputs
    >>> ple = PerLayerInputs(vocab=32, layers=3, width=4, dtype=jnp.float32, param_dtype=jnp.float32)
    >>> tokens, x = jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 5, 16))
    >>> v = ple.init(jax.random.key(0), tokens, x)
    >>> ple.apply(v, tokens, x).shape                      # (batch, length, layers, per_layer)
    (2, 5, 3, 4)
    >>> pt.logical_names(v)["params"]["per_layer_embedding"]
    ('vocab', 'per_layer_layers', 'per_layer')
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import logical_spec, param_for_compute, with_logical_constraint, with_logical_partitioning
from partitioning.errors import ConfigError
from partitioning.models.layers import ACTIVATIONS, Norm, kernel, order, row_parallel


def value_norm(v: jax.Array, eps: float) -> jax.Array:
    """RMSNorm of each head's features with no scale (Gemma 4's ``v_norm``), statistics in float32.

    Example::

        >>> from partitioning.models.per_layer import value_norm
        >>> [round(float(v), 4) for v in value_norm(jnp.array([3.0, 4.0]), 1e-6)]     # RMS 3.5355
        [0.8485, 1.1314]
    """
    v32 = v.astype(jnp.float32)
    return (v32 * jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + eps)).astype(v.dtype)


class PerLayerInputs(nn.Module):
    """The per-layer input vectors ``(batch, length, layers, width)`` from the tokens and their scaled embedding."""

    vocab: int
    layers: int
    width: int
    dtype: Any
    param_dtype: Any
    eps: float = 1e-6
    out_in: bool = False

    @nn.compact
    def __call__(self, tokens, x):
        names = ("vocab", "per_layer_layers", "per_layer")
        init = with_logical_partitioning(nn.initializers.normal(1.0), names)
        table = self.param("per_layer_embedding", init, (self.vocab, self.layers, self.width), self.param_dtype)
        table = param_for_compute(table, names)
        b, t, d = x.shape
        flat = table.reshape(self.vocab, self.layers * self.width)
        spec = logical_spec(("batch", "length", None))  # Explicit axes: the gather's output layout, named
        looked = jnp.take(flat, tokens, axis=0) if spec is None else flat.at[tokens].get(out_sharding=spec, mode="fill")
        looked = looked.reshape(b, t, self.layers, self.width).astype(self.dtype)
        looked = looked * jnp.asarray(self.width**0.5, self.dtype)  # rounded to the compute dtype, as transformers
        outs = (("per_layer_layers", self.layers), ("per_layer", self.width))
        w = kernel(self, "per_layer_proj", (("embed", d),), outs, self.param_dtype, d, self.out_in)
        proj = jnp.einsum(f"btd,{order(self.out_in, 'd', 'lp')}->btlp", x, w.astype(self.dtype))
        proj = proj * jnp.asarray(d**-0.5, self.dtype)
        proj = Norm("rms", self.eps, self.dtype, self.param_dtype, axis="per_layer", name="per_layer_norm")(proj)
        out = (proj + looked) * jnp.asarray(2**-0.5, self.dtype)
        return with_logical_constraint(out, ("batch", "length", "per_layer_layers", "per_layer"))


class PerLayerResidual(nn.Module):
    """One layer's ``x + norm(W_up(act(W_gate x) * per_layer_input))``."""

    width: int
    dtype: Any
    param_dtype: Any
    act: str = "gelu_tanh"
    eps: float = 1e-6
    out_in: bool = False

    @nn.compact
    def __call__(self, x, per_layer_input):
        d, oi, dt = x.shape[-1], self.out_in, self.dtype
        embed, width = (("embed", d),), (("per_layer", self.width),)
        wg = kernel(self, "gate", embed, width, self.param_dtype, d, oi)
        wu = kernel(self, "up", width, embed, self.param_dtype, self.width, oi)
        h = ACTIVATIONS[self.act](jnp.einsum(f"btd,{order(oi, 'd', 'p')}->btp", x, wg.astype(dt)))
        h = row_parallel(f"btp,{order(oi, 'p', 'd')}->btd", h * per_layer_input.astype(dt), wu.astype(dt))
        return x + Norm("rms", self.eps, dt, self.param_dtype, name="norm")(h)


def check_per_layer(model: Any) -> None:
    """A GPT's Gemma 4 options: sizes positive, the global ones with ``layer_types``, unscanned (ConfigError)."""
    for name in ("global_head_dim", "global_kv_heads", "per_layer_input", "per_layer_vocab"):
        value = getattr(model, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}", arg=name)
    glob = [n for n in ("global_head_dim", "global_kv_heads", "global_k_eq_v") if getattr(model, n)]
    if glob and model.layer_types is None:
        raise ConfigError(f"{glob[0]} needs layer_types (which layers are full_attention)", arg=glob[0])
    if model.global_kv_heads and model.heads % model.global_kv_heads:
        raise ConfigError(
            f"global_kv_heads {model.global_kv_heads} must divide heads {model.heads}", arg="global_kv_heads"
        )
    if model.kv_shared_layers and not 0 < model.kv_shared_layers < model.layers:
        raise ConfigError(
            f"kv_shared_layers must be below layers ({model.layers}), got {model.kv_shared_layers!r}",
            arg="kv_shared_layers",
        )
    kv_sharing(model.layer_types, model.layers, model.kv_shared_layers)
    sized = glob + [n for n in ("per_layer_input", "kv_shared_layers") if getattr(model, n)]
    if sized and model.scan_layers:
        raise ConfigError(f"{sized[0]} needs scan_layers: false (its layers differ)", arg="scan_layers")


def kv_sharing(layer_types: Any, layers: int, shared: int) -> tuple[str | None, ...]:
    """Each layer's part in kv sharing, as transformers' ``kv_sharing_modes``: the last ``shared`` layers ``reuse``
    the keys and values of the last earlier layer of their type (``store``); None for the others.

    Example::

        >>> from partitioning.models.per_layer import kv_sharing
        >>> kv_sharing(["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"], 4, 1)
        (None, 'store', 'store', 'reuse')
    """
    if not shared:
        return (None,) * layers
    types = list(layer_types or ["full_attention"] * layers)
    first = layers - shared
    modes: list[str | None] = [None if i < first else "reuse" for i in range(layers)]
    for kind in set(types):
        earlier = [i for i in range(first) if types[i] == kind]
        if not earlier:
            raise ConfigError(
                f"kv_shared_layers {shared}: no earlier {kind} layer to share keys and values with",
                arg="kv_shared_layers",
            )
        modes[earlier[-1]] = "store"
    return tuple(modes)


def layer_shape(model: Any, i: int, head_dim: int, kv_heads: int, modes: tuple = ()) -> dict[str, Any]:
    """Layer ``i``'s :class:`~partitioning.models.block.Block` options that differ from the model's (a global layer
    of Gemma 4: its head size, kv heads, values from the keys; a layer storing or reusing shared keys and values);
    ``{}`` for the others."""
    own: dict[str, Any] = {}
    mode = modes[i] if modes else None
    if mode == "store":
        own["store_kv"] = True
    if mode == "reuse" and model.shared_wide_mlp:
        own["mlp"] = 2 * model.mlp
    if model.layer_types is None or model.layer_types[i] != "full_attention":
        return own
    if model.global_head_dim and model.global_head_dim != head_dim:
        own["head_dim"] = model.global_head_dim
    if model.global_kv_heads and model.global_kv_heads != kv_heads:
        own["kv_heads"] = model.global_kv_heads
    if model.global_k_eq_v:
        own["k_eq_v"] = True
    return own


def per_layer_kwargs(ple: Any, i: int, shared: dict, types: Any, modes: tuple) -> dict[str, Any]:
    """Layer ``i``'s call arguments: its slice of the per-layer inputs, the keys and values it reuses."""
    out: dict[str, Any] = {} if ple is None else {"per_layer_input": ple[:, :, i]}
    if modes and modes[i] == "reuse":
        out["shared_kv"] = shared[(types or ["full_attention"] * len(modes))[i]]
    return out


def layer_scalar(module: nn.Module, x: jax.Array) -> jax.Array:
    """``x`` times the layer's stored ``layer_scalar`` (``(1,)``, named ``per_layer_scalar``; initialised at 1)."""
    names = ("per_layer_scalar",)
    init = with_logical_partitioning(nn.initializers.ones, names)
    scalar = param_for_compute(module.param("layer_scalar", init, (1,), module.param_dtype), names)
    return x * scalar.astype(x.dtype)


__all__ = [
    "PerLayerInputs",
    "PerLayerResidual",
    "check_per_layer",
    "kv_sharing",
    "layer_scalar",
    "layer_shape",
    "per_layer_kwargs",
    "value_norm",
]
