"""Causal self-attention with rotary positions: grouped-query, optional biases, sliding window, scaling.

RoPE is the rotate-half form of Llama / GPT-NeoX (``transformers``' ``apply_rotary_pos_emb``):
the frequencies ``theta ** (-i / half)`` optionally rescaled as Llama 3.1 (``llama3``) or by
position interpolation (``linear``). A sliding window ``w`` lets query ``i`` see keys
``i - w < j <= i`` (Mistral). Scores are ``q . k * scale`` (default ``head_dim ** -0.5``)
with the softmax in float32.

Example::

    >>> from partitioning.models.attention import Attention
    >>> attn = Attention(8, 2, 16, 500000.0, jnp.float32, jnp.float32, window=4)   # 8 heads, 2 kv heads
    >>> x = jax.random.normal(jax.random.key(1), (2, 10, 64))                    # (batch, length, embed)
    >>> variables = jax.jit(attn.init)(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, pt.unbox(variables))["params"]
    {'k': (64, 2, 16), 'o': (8, 16, 64), 'q': (64, 8, 16), 'v': (64, 2, 16)}
    >>> pt.logical_names(variables)["params"]["k"]
    ('embed', 'kv_heads', 'kv')
    >>> apply = jax.jit(attn.apply)
    >>> y, y2 = apply(variables, x), apply(variables, x.at[:, 0].set(5.0))    # another first token
    >>> bool(jnp.allclose(y[:, :4], y2[:, :4])), bool(jnp.allclose(y[:, 4:], y2[:, 4:]))  # seen by positions 0-3 only
    (False, True)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import logical_spec, with_logical_constraint
from partitioning.decode.cache import cache_length, cache_positions, cached_kv
from partitioning.errors import ConfigError
from partitioning.models.fused_attention import cudnn_attention, fused_applies
from partitioning.models.layers import bias_param, kernel, order, row_parallel
from partitioning.models.lora import adapt, project
from partitioning.models.per_layer import value_norm
from partitioning.models.rope import SCALINGS, attention_factor, scaled_frequencies
from partitioning.models.variants import local_mask, local_rope, qk_norms, sink_softmax, skip_rope, softcap
from partitioning.parallel.context import context_attention, context_axes, context_size

# rope_type -> the keys it needs besides rope_type (yarn and longrope: models/rope.py's SCALINGS).
ROPE_SCALINGS = {
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "linear": ("factor",),
}


def parse_rope_scaling(value: Any) -> tuple | None:
    """``{"rope_type": "llama3", "factor": 8.0, ...}`` (``type`` also accepted) -> a hashable, checked tuple.

    Raises :class:`~partitioning.ConfigError` (``arg="rope_scaling"``) for an unknown type or a missing key.

    Example::

        >>> from partitioning.models.attention import parse_rope_scaling
        >>> parse_rope_scaling({"rope_type": "linear", "factor": 2.0})
        (('rope_type', 'linear'), ('factor', 2.0))
    """
    if value is None or isinstance(value, tuple):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"rope_scaling must be a mapping with a rope_type, got {value!r}", arg="rope_scaling")
    kind = value.get("rope_type", value.get("type", "default"))
    if kind == "default":
        return None
    required: tuple[str, ...] = ROPE_SCALINGS.get(kind, ())
    optional: tuple[str, ...] = ()
    if kind in SCALINGS:
        required, optional = SCALINGS[kind]
    elif kind not in ROPE_SCALINGS:
        supported = ", ".join([*ROPE_SCALINGS, *SCALINGS])
        raise ConfigError(f"rope_type {kind!r} is not supported; supported: default, {supported}", arg="rope_scaling")
    missing = [k for k in required if value.get(k) is None]
    if missing:
        raise ConfigError(f"rope_scaling of type {kind!r} needs {', '.join(missing)}", arg="rope_scaling")

    def number(v: Any) -> Any:
        # Hashable: LongRoPE's per-frequency factors become tuples.
        return v if isinstance(v, bool) else tuple(map(float, v)) if isinstance(v, list | tuple) else float(v)

    keys = [*required, *(k for k in optional if value.get(k) is not None)]
    return (("rope_type", kind),) + tuple((k, number(value[k])) for k in keys)


def rope_frequencies(dim: int, theta: float, scaling: tuple | None = None, length: Any = None) -> jax.Array:
    """The ``dim // 2`` inverse frequencies, rescaled as ``transformers`` does for ``llama3`` / ``linear`` (and
    ``yarn`` / ``longrope``: :mod:`partitioning.models.rope`; ``length``, the sequence's, picks LongRoPE's factors)."""
    half = dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if not scaling:
        return freqs
    s = dict(scaling)
    if s["rope_type"] in SCALINGS:
        return scaled_frequencies(dim, theta, s, length)
    if s["rope_type"] == "linear":
        return freqs / s["factor"]
    # Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth ramp between.
    factor, low, high, old = (
        s["factor"],
        s["low_freq_factor"],
        s["high_freq_factor"],
        s["original_max_position_embeddings"],
    )
    wavelen = 2 * jnp.pi / freqs
    scaled = jnp.where(wavelen > old / low, freqs / factor, freqs)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return jnp.where(medium, smoothed, scaled)


def rope(x, theta: float, scaling: tuple | None = None, positions=None, rotary_dim: int | None = None):
    """Rotary position embedding over the last axis of ``(batch, length, heads, dim)``.

    ``positions`` (``(length,)`` or ``(batch, length)``) default to ``0 .. length - 1``. ``rotary_dim``
    (partial rotary, Phi-4-mini): only the first ``rotary_dim`` features rotate, with that many frequencies;
    the rest pass through.
    """
    if rotary_dim is not None and rotary_dim < x.shape[-1]:
        rotated = rope(x[..., :rotary_dim], theta, scaling, positions)
        return jnp.concatenate([rotated, x[..., rotary_dim:]], axis=-1)
    t, k = x.shape[1], x.shape[-1]
    half = k // 2
    pos = jnp.arange(t, dtype=jnp.float32) if positions is None else jnp.asarray(positions, jnp.float32)
    freqs = rope_frequencies(k, theta, scaling, t if positions is None else jnp.max(pos) + 1)
    angles = pos[..., None] * freqs
    angles = angles[None, :, None, :] if angles.ndim == 2 else angles[:, :, None, :]
    factor = attention_factor(dict(scaling)) if scaling else 1.0
    sin, cos = jnp.sin(angles) * factor, jnp.cos(angles) * factor
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def causal_mask(t: int, window: int | None = None) -> jax.Array:
    """``(t, t)`` booleans: query ``i`` sees key ``j`` when ``j <= i`` (and ``j > i - window``)."""
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    ok = j <= i
    return ok if window is None else ok & (j > i - window)


def segment_mask(segment_ids: jax.Array, window: int | None = None) -> jax.Array:
    """``(batch, 1, 1, t, t)`` booleans for packed rows: :func:`causal_mask` and the same segment.

    Query ``i`` sees key ``j`` only inside its own example (``segment_ids[i] == segment_ids[j]``; padding,
    segment 0, sees only padding), so no example attends to another packed into the same row.

    Example::

        >>> from partitioning.models.attention import segment_mask
        >>> segment_mask(jnp.array([[1, 1, 2, 0]]))[0, 0, 0].astype(int).tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    """
    t = segment_ids.shape[-1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal_mask(t, window)[None] & same)[:, None, None]


def packed_args(module: Any, segment_ids: Any, positions: Any) -> tuple:
    """A decoder block's extra arguments for packed rows: ``()`` without them, else ``(segment_ids, positions)``.

    Missing ``positions`` restart at 0 where the segment id changes; missing ``segment_ids`` are all 1.
    Packed rows are for training: a model in decode mode (KV cache) refuses them.

    Example::

        >>> from partitioning.models.attention import packed_args
        >>> packed_args(None, jnp.array([[1, 1, 1, 2, 2, 0]]), None)[1].tolist()
        [[0, 1, 2, 0, 1, 0]]
    """
    if segment_ids is None and positions is None:
        return ()
    if getattr(module, "decode", False):
        raise ConfigError("segment_ids / positions (packed rows) are for training, not decode mode", arg="decode")
    if segment_ids is None:
        segment_ids = jnp.ones(jnp.shape(positions), jnp.int32)
    segment_ids = jnp.asarray(segment_ids, jnp.int32)
    if positions is None:
        t = segment_ids.shape[-1]
        idx = jnp.broadcast_to(jnp.arange(t), segment_ids.shape)
        starts = jnp.concatenate(
            [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1
        )
        positions = idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return segment_ids, jnp.asarray(positions, jnp.int32)


class Attention(nn.Module):
    """Grouped-query causal attention; ``q (embed, heads, kv)``, ``k``/``v (embed, kv_heads, kv)``,
    ``o (heads, kv, embed)`` (``out_in``: outputs first, ``q (heads, kv, embed)``, ...); biases
    ``q_bias (heads, kv)``, ``k_bias``/``v_bias (kv_heads, kv)``, ``o_bias (embed,)``.
    ``rope=False`` for models with learned absolute positions (GPT-2)."""

    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    dtype: Any
    param_dtype: Any
    qkv_bias: bool = False
    out_bias: bool = False
    rope: bool = True
    rope_scaling: tuple | None = None
    window: int | None = None
    scale: float | None = None
    decode: bool = False  # keep keys and values in the `cache` collection (partitioning/decode/cache.py)
    out_in: bool = False  # weights stored (out, in), as torch's Linear
    lora: Any = None  # LoRA adapters on q / k / v / o (partitioning.models.lora)

    # The newer families' options (models/variants.py): q/k norm (`head` | `all`) of the model's
    # `norm` flavour, score soft-capping, and the (theta, scaling) RoPE of local layers.
    qk_norm: str | None = None
    norm: str = "rms"
    norm_eps: float = 1e-6
    softcap: float | None = None
    local_rope: tuple | None = None
    impl: str = "xla"  # xla | cudnn (models/fused_attention.py): where cuDNN applies, else the einsums
    # all_gather | ring: attention over a `length` the rules split (partitioning/parallel/context.py)
    context_parallel: str = "ring"
    rotary_dim: int | None = None  # partial rotary: the features RoPE rotates (None: all)
    sinks: bool = False  # attention sinks (GPT-OSS): a learned logit per head, `sinks (heads,)`
    gate: bool = False  # an output gate (Qwen3.5, Qwen3-Next): out * sigmoid(x W_q_gate), `q_gate` shaped as `q`
    v_norm: bool = False  # Gemma 4: values RMS-normed per head, no scale (models/per_layer.py)
    k_eq_v: bool = False  # Gemma 4's global layers (attention_k_eq_v): no `v`, the values are the keys' projection
    store_kv: bool = False  # return (output, (keys, values)): later layers reuse them (Gemma 4's num_kv_shared_layers)

    @nn.compact
    def __call__(self, x, segment_ids=None, positions=None, local=None, nope=None, shared_kv=None):
        # `nope`: True (or traced) on a layer without RoPE (SmolLM3's NoPE layers). `shared_kv`: another layer's
        # (keys, values) after their norms and RoPE, used instead of this layer's own (Gemma 4's shared kv layers).
        b, t, d = x.shape
        h, g, k = self.heads, self.kv_heads, self.head_dim
        pd, dt, oi = self.param_dtype, self.dtype, self.out_in
        embed, heads, groups = (("embed", d),), (("heads", h), ("kv", k)), (("kv_heads", g), ("kv", k))
        wq = kernel(self, "q", embed, heads, pd, d, oi)
        wo = kernel(self, "o", heads, embed, pd, h * k, oi)
        q = project(self, "q", f"btd,{order(oi, 'd', 'hk')}->bthk", x, wq, dt, self.lora, embed, heads, oi)
        own = shared_kv is None  # Gemma 4's layers that reuse another's keys and values have no k / v of their own
        kk: Any = None
        v: Any = None
        if own:
            wk = kernel(self, "k", embed, groups, pd, d, oi)
            kk = project(self, "k", f"btd,{order(oi, 'd', 'gk')}->btgk", x, wk, dt, self.lora, embed, groups, oi)
            if not self.k_eq_v:
                wv = kernel(self, "v", embed, groups, pd, d, oi)
                v = project(self, "v", f"btd,{order(oi, 'd', 'gk')}->btgk", x, wv, dt, self.lora, embed, groups, oi)
        gate = None
        if self.gate:
            wg = kernel(self, "q_gate", embed, heads, pd, d, oi)
            gate = jnp.einsum(f"btd,{order(oi, 'd', 'hk')}->bthk", x, wg.astype(dt))
        if self.qkv_bias:
            q = q + bias_param(self, "q_bias", ("heads", "kv"), (h, k), pd).astype(dt)
            if own:
                kk = kk + bias_param(self, "k_bias", ("kv_heads", "kv"), (g, k), pd).astype(dt)
            if own and not self.k_eq_v:
                v = v + bias_param(self, "v_bias", ("kv_heads", "kv"), (g, k), pd).astype(dt)
        if own and self.k_eq_v:  # the keys before their norm and RoPE
            v = kk
        if own and self.v_norm:
            v = value_norm(v, self.norm_eps)
        q, kk = qk_norms(self, q, kk)
        q = with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        if own:
            kk = with_logical_constraint(kk, ("batch", "length", "kv_heads", "kv"))
        if self.decode:
            positions = cache_positions(self, t)
        q0, k0 = q, kk
        if self.rope and nope is not True:
            rot = functools.partial(rope, rotary_dim=self.rotary_dim)
            q = rot(q, self.rope_theta, self.rope_scaling, positions)
            q = skip_rope(q0, local_rope(q0, q, local, self.local_rope, positions, rot), nope)
            if own:
                kk = rot(kk, self.rope_theta, self.rope_scaling, positions)
                kk = skip_rope(k0, local_rope(k0, kk, local, self.local_rope, positions, rot), nope)
        if not own:
            kk, v = shared_kv
        # `local` given (mixed local/global layers): the window applies on local layers only.
        window = self.window if local is None else None
        v = with_logical_constraint(v, ("batch", "length", "kv_heads", "kv"))
        stored = (kk, v)  # what a later layer sharing these keys and values receives (store_kv)
        scale = k**-0.5 if self.scale is None else self.scale
        sinks = bias_param(self, "sinks", ("heads",), (h,), pd) if self.sinks else None
        split = context_axes()
        # Decoding, a prefill chunk that splits over the context devices attends to the (split) cache the same way;
        # a one-token step, or a chunk that does not split, keeps the einsums.
        if split and self.decode:
            c, cached = context_size(split), cache_length(self)
            if positions is None or cached is None or t % c or cached % c:
                split = ()
        if split:  # the rules split `length`: every device holds a block of the sequence
            q_pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32) if positions is None else positions, (b, t))
            k_pos, k_seg = q_pos, segment_ids
            if self.decode:  # the chunk written into the cache; its queries see every cached position so far
                kk, v, _ = cached_kv(self, kk, v, positions, window)
                k_pos = jnp.broadcast_to(jnp.arange(kk.shape[1], dtype=jnp.int32), kk.shape[:2])
            out = context_attention(
                q,
                kk,
                v,
                q_pos,
                k_pos,
                segment_ids,
                k_seg,
                scale=scale,
                window=self.window,
                windowed=local,
                softcap=self.softcap,
                strategy=self.context_parallel,
                axes=split,
                sinks=sinks,
            )
        elif self.impl == "cudnn" and sinks is None and fused_applies(self.decode, segment_ids, local, self.softcap):
            out = cudnn_attention(q, kk, v, scale, window)
        else:
            out = self._einsum_attention(q, kk, v, scale, window, segment_ids, local, positions, sinks)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        out = with_logical_constraint(out, ("batch", "length", "heads", "kv"))
        eq = f"bthk,{order(oi, 'hk', 'd')}->btd"
        y = adapt(self, "o", row_parallel(eq, out, wo.astype(dt)), out, eq, self.lora, heads, embed, oi)
        if self.out_bias:
            y = y + bias_param(self, "o_bias", ("embed",), (d,), pd).astype(dt)
        return (y, stored) if self.store_kv else y

    def _einsum_attention(self, q, kk, v, scale, window, segment_ids, local, positions, sinks=None):
        """``softmax(q k^T * scale) v`` with the causal / window / segment masks, as einsums with named layouts."""
        b, t, h, k = q.shape
        g, dt = kk.shape[2], self.dtype
        mask = causal_mask(t, window) if segment_ids is None else segment_mask(segment_ids, window)
        if self.decode:  # attend to every cached position so far, this call's included
            kk, v, mask = cached_kv(self, kk, v, positions, window)
        # Packed rows restart `positions` per example: the window is over row indices, as the mask's.
        mask = local_mask(mask, local, self.window, positions if self.decode else None)
        # Grouped-query: each kv head serves heads // kv_heads query heads.
        q = q.reshape(b, t, g, h // g, k)
        # Explicit axes with `length` sharded (seq): name the layouts of the two
        # attention products, which need every key position on every query shard.
        scores = jnp.einsum(
            "btgrk,bsgk->bgrts", q, kk, out_sharding=logical_spec(("batch", "kv_heads", None, "length", None))
        )
        scores = softcap(scores.astype(jnp.float32) * scale, self.softcap)
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = sink_softmax(scores, sinks).astype(dt)
        out = jnp.einsum(
            "bgrts,bsgk->btgrk", probs, v, out_sharding=logical_spec(("batch", "length", "kv_heads", None, None))
        ).reshape(b, t, h, k)
        return out


__all__ = ["Attention", "rope", "rope_frequencies", "parse_rope_scaling", "causal_mask", "ROPE_SCALINGS"]
