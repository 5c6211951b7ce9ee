"""The decoder options of the newer published families: q/k norms, soft-capping, norm placement, local layers.

- **q/k norm** (:class:`QKNorm`): an RMSNorm of the queries and keys before RoPE. ``head``
  (Qwen3, Gemma 3): over each head's ``kv`` features, one ``scale`` named ``(kv,)`` shared by
  every head. ``all`` (OLMo-2): over the whole projection (every head's features together),
  a ``scale`` named ``(heads, kv)`` / ``(kv_heads, kv)``, so a ``tensor``-split projection
  normalises with a cross-shard mean. The norm's flavour (``rms`` or Gemma's ``rms_offset``)
  and epsilon are the model's.
- **soft-capping** (:func:`softcap`, Gemma 2): ``cap * tanh(x / cap)`` of the attention
  scores (after scaling, before the mask) and of the final logits.
- **norm placement** (:func:`pre_norm`, :func:`post_norm`): ``pre`` (Llama: ``x + f(norm(x))``),
  ``pre_post`` (Gemma 2/3: ``x + norm'(f(norm(x)))``, four norms a block: ``attn_norm``,
  ``attn_post_norm``, ``mlp_norm``, ``mlp_post_norm``), ``post`` (OLMo-2: ``x + norm'(f(x))``).
- **local and global layers** (Gemma 2/3): per-layer flags, carried through the layer scan as
  data (:class:`~partitioning.parallel.pipeline.LayerStack`'s ``layer_data``), pick the
  sliding-window mask and the local RoPE (own base and scaling) inside one compiled block, so
  ``scan_layers`` keeps compile time flat in depth whatever the pattern (Gemma 3 27B's 62
  layers are not a whole number of its 6-layer groups). The price: both RoPE variants of q and
  k are computed on every layer (elementwise work, small beside the projections).
- **attention sinks** (:func:`sink_softmax`, GPT-OSS): a learned logit per head in every softmax row.
- **NoPE layers** (SmolLM3): ``nope_layers`` get no RoPE at all, carried as data the same way
  (a layer's flags: :data:`LOCAL`, :data:`NOPE`).

Example::

    >>> from partitioning.models.variants import QKNorm, softcap
    >>> norm = QKNorm("all", "rms", 1e-6, jnp.float32, jnp.float32, heads_name="heads")
    >>> x = jax.random.normal(jax.random.key(0), (1, 3, 4, 8))          # (batch, length, heads, kv)
    >>> v = norm.init(jax.random.key(0), x)
    >>> pt.logical_names(v)["params"]["scale"]
    ('heads', 'kv')
    >>> float(jnp.mean(norm.apply(v, x)[0, 0] ** 2).round(3))           # unit RMS over every head at once
    1.0
    >>> round(float(softcap(jnp.array(100.0), 30.0)), 2)               # 30 * tanh(100 / 30)
    29.92
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import param_for_compute, with_logical_partitioning
from partitioning.errors import ConfigError

QK_NORMS = ("head", "all")
NORM_PLACEMENTS = ("pre", "pre_post", "post")
# Hugging Face's names of the layer kinds in `layer_types`.
LAYER_TYPES = ("full_attention", "sliding_attention")


class QKNorm(nn.Module):
    """RMSNorm of ``(batch, length, heads, kv)`` queries or keys: per head (``head``) or over all heads (``all``)."""

    kind: str
    norm: str
    eps: float
    dtype: Any
    param_dtype: Any
    heads_name: str = "heads"

    @nn.compact
    def __call__(self, x):
        names = ("kv",) if self.kind == "head" else (self.heads_name, "kv")
        axes = tuple(range(-len(names), 0))
        init = nn.initializers.zeros if self.norm == "rms_offset" else nn.initializers.ones
        box = with_logical_partitioning(init, names)
        scale = param_for_compute(self.param("scale", box, x.shape[-len(names) :], self.param_dtype), names)
        scale = scale.astype(jnp.float32) + (1.0 if self.norm == "rms_offset" else 0.0)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axes, keepdims=True) + self.eps)
        return (y * scale).astype(self.dtype)


def qk_norms(attn: Any, q: jax.Array, k: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
    """``attn``'s q/k norms (``q_norm/scale``, ``k_norm/scale``) applied, when its ``qk_norm`` is set (``k`` None: a
    layer reusing another's keys has no key norm)."""
    if not attn.qk_norm:
        return q, k
    args = (attn.qk_norm, attn.norm, attn.norm_eps, attn.dtype, attn.param_dtype)
    q = QKNorm(*args, heads_name="heads", name="q_norm")(q)
    return q, None if k is None else QKNorm(*args, heads_name="kv_heads", name="k_norm")(k)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(x / cap)`` (in ``x``'s dtype); ``x`` unchanged without a cap."""
    return x if not cap else jnp.tanh(x / cap) * cap


def sink_softmax(scores: jax.Array, sinks: jax.Array | None) -> jax.Array:
    """The attention softmax over the keys (last axis) of ``(..., groups, group_heads, t, s)`` float32 ``scores``, with
    attention sinks (GPT-OSS): one learned logit per head (``(heads,)``, ``heads = groups * group_heads``) that joins
    every row's softmax and takes its share of the mass without a value. ``sinks`` None: the plain softmax.

    Any attention path can call it on its scores (as transformers' eager attention does: the sink's column
    concatenated, the softmax taken, the column dropped).

    Example::

        >>> from partitioning.models.variants import sink_softmax
        >>> scores = jnp.zeros((1, 1, 2, 1, 3))                          # 2 heads, 3 keys, all equal
        >>> probs = sink_softmax(scores, jnp.array([0.0, -100.0]))[0, 0, :, 0]
        >>> [[round(float(p), 3) for p in row] for row in probs]         # the sink takes a share; a -100 one none
        [[0.25, 0.25, 0.25], [0.333, 0.333, 0.333]]
    """
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    g, r = scores.shape[-4], scores.shape[-3]
    sink = sinks.astype(jnp.float32).reshape(g, r)[..., None, None]
    top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sink)
    e = jnp.exp(scores - top)
    return e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))


def local_rope(x: jax.Array, rotated: jax.Array, local: Any, spec: tuple | None, positions: Any, rope: Any) -> Any:
    """``rotated`` (the global RoPE) on global layers, ``x`` rotated by ``rope`` with ``spec = (theta, scaling)``
    (the local RoPE) on local ones (``rope``: attention's, which imports this module)."""
    if local is None or spec is None or local is False:
        return rotated
    other = rope(x, spec[0], spec[1], positions)
    return other if local is True else jnp.where(local, other, rotated)


def local_mask(mask: jax.Array, local: Any, window: int | None, positions: Any) -> jax.Array:
    """A causal ``(t, s)`` mask narrowed to the sliding ``window`` on local layers (``local``: bool or traced)."""
    if local is None or not window or local is False:
        return mask
    t, s = mask.shape[-2:]
    i = jnp.arange(t) if positions is None else positions
    narrowed = mask & (jnp.arange(s)[None, :] > i[:, None] - window)
    return narrowed if local is True else jnp.where(local, narrowed, mask)


def pre_norm(block: Any, x: jax.Array, name: str, make_norm: Any) -> jax.Array:
    """The sublayer's input: ``<name>_norm(x)``, or ``x`` itself with post-norm placement (OLMo-2)."""
    if block.norm_placement == "post":
        return x
    return make_norm(block.norm, block.dtype, block.param_dtype, f"{name}_norm", block.norm_eps)(x)


def post_norm(block: Any, y: jax.Array, name: str, make_norm: Any) -> jax.Array:
    """The sublayer's output before the residual add: ``<name>_post_norm(y)`` unless placement is ``pre``."""
    if block.norm_placement == "pre":
        return y
    return make_norm(block.norm, block.dtype, block.param_dtype, f"{name}_post_norm", block.norm_eps)(y)


def local_layers(layer_types: Any, layers: int) -> tuple[bool, ...] | None:
    """Per-layer ``True`` for sliding-window (local) layers from HF's ``layer_types``; None when not given."""
    if layer_types is None:
        return None
    return tuple(t == "sliding_attention" for t in layer_types)


# The bits of a layer's flags (the per-layer data a scanned stack carries): a sliding-window layer of a mixed
# stack, a layer without RoPE (SmolLM3's NoPE layers).
LOCAL, NOPE = 1, 2


def layer_flags(layer_types: Any, nope_layers: Any, layers: int) -> tuple[int, ...] | None:
    """Per-layer flags (:data:`LOCAL` | :data:`NOPE`), or None when every layer is alike."""
    local = local_layers(layer_types, layers)
    if local is None and not nope_layers:
        return None
    nope = set(nope_layers or ())
    return tuple((LOCAL if local and local[i] else 0) | (NOPE if i in nope else 0) for i in range(layers))


def layer_flag(flags: Any, bit: int, mixed: bool) -> Any:
    """One bit of a layer's ``flags`` (a Python int unscanned, traced in a scan); None when not ``mixed``."""
    if not mixed or flags is None:
        return None
    return bool(flags & bit) if isinstance(flags, int) else (flags & bit) != 0


def skip_rope(x: jax.Array, rotated: jax.Array, nope: Any) -> jax.Array:
    """``x`` unrotated on a NoPE layer (``nope`` a bool or traced), ``rotated`` elsewhere."""
    if nope is None or nope is False:
        return rotated
    return x if nope is True else jnp.where(nope, x, rotated)


def check_layer_types(model: Any) -> None:
    """``layer_types``: one of :data:`LAYER_TYPES` per layer (ConfigError naming the field otherwise)."""
    types = model.layer_types
    if types is None:
        if model.local_rope_theta is not None:
            raise ConfigError("local_rope_theta needs layer_types (which layers are local)", arg="local_rope_theta")
        return
    if isinstance(types, str) or len(types) != model.layers or any(t not in LAYER_TYPES for t in types):
        raise ConfigError(
            f"layer_types must list one of {', '.join(LAYER_TYPES)} per layer ({model.layers}), got {types!r}",
            arg="layer_types",
        )


def check_nope_layers(model: Any) -> None:
    """``nope_layers``: distinct layer numbers (ConfigError naming the field otherwise)."""
    nope = model.nope_layers
    if nope is None:
        return
    bad = isinstance(nope, str) or any(isinstance(i, bool) or not isinstance(i, int) for i in nope)
    if bad or len(set(nope)) != len(nope) or any(not 0 <= i < model.layers for i in nope):
        raise ConfigError(
            f"nope_layers must be distinct layer numbers 0..{model.layers - 1} (the layers without RoPE), got {nope!r}",
            arg="nope_layers",
        )
    if model.positions != "rope":
        raise ConfigError("nope_layers needs positions: rope", arg="nope_layers")


def variant_options(model: Any, parse_rope_scaling: Any) -> dict[str, Any]:
    """The :class:`~partitioning.models.block.Block` options of these variants, from the GPT's fields
    (``parse_rope_scaling``: attention's, which imports this module)."""
    spec = None
    if model.local_rope_theta is not None:
        spec = (float(model.local_rope_theta), parse_rope_scaling(model.local_rope_scaling))
    return dict(
        norm_placement=model.norm_placement,
        qk_norm=model.qk_norm,
        attn_softcap=model.attn_softcap,
        local_rope=spec,
        mixed_window=model.layer_types is not None,
        mixed_rope=bool(model.nope_layers),
        attn_sinks=model.attn_sinks,
    )


__all__ = [
    "QKNorm",
    "qk_norms",
    "softcap",
    "sink_softmax",
    "local_rope",
    "local_mask",
    "pre_norm",
    "post_norm",
    "local_layers",
    "layer_flags",
    "layer_flag",
    "skip_rope",
    "check_layer_types",
    "check_nope_layers",
    "variant_options",
    "QK_NORMS",
    "NORM_PLACEMENTS",
    "LAYER_TYPES",
    "LOCAL",
    "NOPE",
]
