"""Linear attention by the gated delta rule (Qwen3.5's and Qwen3-Next's ``linear_attention`` layers).

Per value head, a ``(key_dim, value_dim)`` state ``S`` is carried along the sequence: each token decays it by
``exp(g)``, writes its value with the delta rule (``S += k^T beta (v - k S)``) and reads ``q S``; ``q`` and ``k``
are L2-normalised (``q`` scaled by ``key_dim ** -0.5``), ``beta = sigmoid(x W_b)``,
``g = -exp(A_log) softplus(x W_a + dt_bias)``. q, k and v come from one projection through a short causal
depthwise convolution (``conv_kernel`` taps, silu); the output is RMS-normalised per head, gated by
``silu(x W_z)`` and projected back. Fewer key heads than value heads share theirs (``repeat``).

The rule runs as a *chunked scan*, as transformers' ``torch_chunk_gated_delta_rule``: within a chunk of
``chunk`` tokens everything is parallel (a unit lower-triangular solve for the delta rule's corrections),
and only the state crosses chunks (``lax.scan``), so the work is linear in the sequence and the memory a
chunk's ``(chunk, chunk)`` products. In decode mode the cache holds the state and the convolution's last
``conv_kernel - 1`` inputs (``recurrent_state``, ``conv_state``): constant in the sequence length.

Parameters (logical names; ``out_in`` as torch stores them): ``qkv (linear_qkv, embed)`` and ``conv
(linear_qkv, conv)`` (q, k and v channels fused, as in the files: the rules leave them whole), ``z
(linear_heads, linear_v, embed)``, ``a`` / ``b (linear_heads, embed)``, ``dt_bias`` / ``A_log
(linear_heads,)``, ``norm/scale (linear_v,)``, ``o (embed, linear_heads, linear_v)``.

Example::

    >>> from partitioning.models.linear_attention import GatedDeltaNet, LinearShape, gated_delta_rule
    >>> shape = LinearShape(key_heads=2, value_heads=4, key_dim=8, value_dim=8, conv_kernel=4, chunk=4)
    >>> layer = GatedDeltaNet(shape, jnp.float32, jnp.float32)
    >>> x = jax.random.normal(jax.random.key(1), (2, 10, 32))
    >>> v = jax.jit(layer.init)(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, pt.unbox(v))["params"]["conv"], jax.jit(layer.apply)(v, x).shape
    ((64, 4), (2, 10, 32))
    >>> q, k, vv = (jax.random.normal(jax.random.key(i), (1, 10, 2, 8)) for i in range(3))
    >>> g, beta = -jnp.ones((1, 10, 2)) * 0.1, jnp.full((1, 10, 2), 0.5)
    >>> rule = jax.jit(gated_delta_rule, static_argnames="chunk")
    >>> a, s = rule(q, k, vv, g, beta, chunk=4)        # chunks of 4, the state carried between
    >>> b, s2 = rule(q, k, vv, g, beta, chunk=16)      # one chunk: the same numbers
    >>> bool(jnp.allclose(a, b, atol=1e-5)), bool(jnp.allclose(s, s2, atol=1e-5))
    (True, True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import param_for_compute, with_logical_constraint, with_logical_partitioning
from partitioning.decode.cache import CACHE
from partitioning.errors import ConfigError
from partitioning.models.layers import kernel, order, row_parallel

CONV_NAMES = ("batch", None, "linear_qkv")
STATE_NAMES = ("batch", "linear_heads", None, None)


@dataclasses.dataclass(frozen=True)
class LinearShape:
    """The sizes of a gated-delta-rule layer (Qwen3.5's ``linear_*`` config keys) and the scan's chunk."""

    key_heads: int = 16
    value_heads: int = 32
    key_dim: int = 128
    value_dim: int = 128
    conv_kernel: int = 4
    chunk: int = 64

    @classmethod
    def parse(cls, value: Any) -> LinearShape | None:
        """``None`` / a mapping / a ``LinearShape`` -> ``LinearShape | None``; a ConfigError naming ``linear_attn``."""
        if value is None or isinstance(value, LinearShape):
            return value
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, Mapping) or any(k not in names for k in value):
            raise ConfigError(f"linear_attn must be a mapping of {', '.join(names)}, got {value!r}", arg="linear_attn")
        shape = cls(**dict(value))
        sizes = [getattr(shape, n) for n in names]
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) or (
            shape.value_heads % shape.key_heads
        ):
            raise ConfigError(
                f"linear_attn sizes must be integers >= 1, value_heads a multiple of key_heads; got {value!r}",
                arg="linear_attn",
            )
        return shape


def check_linear_layers(layers_: Any, shape: LinearShape | None, layers: int, scan_layers: bool) -> None:
    """``linear_layers`` are distinct layer numbers, given with ``linear_attn``, and built unscanned (a scanned stack
    repeats one block; linear and full attention have different parameters)."""
    if layers_ is None:
        return
    bad = [i for i in layers_ if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers]
    if bad or len(set(layers_)) != len(layers_):
        raise ConfigError(
            f"linear_layers must be distinct layer numbers 0..{layers - 1}, got {list(layers_)}", arg="linear_layers"
        )
    if shape is None:
        raise ConfigError("linear_layers needs linear_attn (the linear-attention sizes)", arg="linear_layers")
    if scan_layers and layers_:
        raise ConfigError(
            "linear_layers needs scan_layers: false (a scanned stack repeats one block)", arg="linear_layers"
        )


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_delta_rule(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, chunk: int = 64, state: Any = None
) -> tuple[jax.Array, jax.Array]:
    """``(out (b, t, h, dv), final state (b, h, dk, dv))`` of the gated delta rule, chunk by chunk (float32).

    ``q``, ``k``: ``(b, t, h, dk)`` (L2-normalised here, ``q`` scaled by ``dk ** -0.5``); ``v``: ``(b, t, h, dv)``;
    ``g`` (log decay, <= 0) and ``beta``: ``(b, t, h)``; ``state``: the state before the first token (zeros).
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    q = l2norm(q.astype(jnp.float32)) * dk**-0.5
    k = l2norm(k.astype(jnp.float32))
    v, g, beta = v.astype(jnp.float32), g.astype(jnp.float32), beta.astype(jnp.float32)
    chunk = min(chunk, t)  # a short call (a decoding step) is one chunk of its own length: no padding to work through
    pad = (-t) % chunk
    n = (t + pad) // chunk

    def chunks(x):  # (b, t, h[, d]) -> (n, b, h, chunk[, d]), padded with zeros (no decay, nothing written)
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, chunk, *x.shape[2:])  # (b, n, chunk, h[, d])
        return x.transpose(1, 0, 3, 2, *range(4, x.ndim))

    q, k, v = chunks(q), chunks(k), chunks(v)
    g, beta = chunks(g), chunks(beta)  # (n, b, h, chunk)
    cum = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # (i, j): j <= i
    kb, vb = k * beta[..., None], v * beta[..., None]
    # The delta rule's corrections within a chunk: (I + strictly lower (k_beta k^T decay)) X = (v_beta, k_beta e^cum).
    system = jnp.tril(kb @ k.swapaxes(-1, -2) * decay, -1) + jnp.eye(chunk)
    rhs = jnp.concatenate([vb, kb * jnp.exp(cum)[..., None]], axis=-1)
    solved = jax.scipy.linalg.solve_triangular(system, rhs, lower=True, unit_diagonal=True)
    values, k_cum = solved[..., :dv], solved[..., dv:]
    intra = q @ k.swapaxes(-1, -2) * decay
    q_decayed = q * jnp.exp(cum)[..., None]
    k_decayed = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])[..., None, None]
    s0 = jnp.zeros((b, h, dk, dv), jnp.float32) if state is None else state.astype(jnp.float32)

    def step(s, c):
        qd, kd, vals, kc, intra_c, cd = c
        v_new = vals - kc @ s
        out = qd @ s + intra_c @ v_new
        return s * cd + kd.swapaxes(-1, -2) @ v_new, out

    s, out = jax.lax.scan(step, s0, (q_decayed, k_decayed, values, k_cum, intra, chunk_decay))
    out = out.transpose(1, 0, 3, 2, 4).reshape(b, n * chunk, h, dv)  # (n, b, h, chunk, dv) -> (b, t, h, dv)
    return out[:, :t], s


def causal_conv(x: jax.Array, w: jax.Array, past: jax.Array | None = None) -> jax.Array:
    """Depthwise causal convolution of ``x (b, t, c)`` by ``w (c, taps)``, the ``taps - 1`` inputs before ``x`` being
    ``past`` (zeros when None), then silu."""
    taps = w.shape[-1]
    before = jnp.zeros((x.shape[0], taps - 1, x.shape[-1]), x.dtype) if past is None else past.astype(x.dtype)
    full = jnp.concatenate([before, x], axis=1)
    t = x.shape[1]
    out = sum(full[:, j : j + t] * w[:, j].astype(x.dtype) for j in range(taps))
    return jax.nn.silu(out)


class GatedDeltaNet(nn.Module):
    """A gated-delta-rule linear-attention layer (see the module docstring)."""

    shape: LinearShape
    dtype: Any
    param_dtype: Any
    norm_eps: float = 1e-6
    decode: bool = False
    out_in: bool = False

    @nn.compact
    def __call__(self, x, segment_ids=None, positions=None, **unused):
        if segment_ids is not None:
            raise ConfigError(
                "packed rows (segment_ids) are not supported by linear-attention layers: their state would carry "
                "one example into the next",
                arg="packing",
            )
        b, t, d = x.shape
        s, pd, dt, oi = self.shape, self.param_dtype, self.dtype, self.out_in
        kh, vh, kd, vd = s.key_heads, s.value_heads, s.key_dim, s.value_dim
        channels = 2 * kh * kd + vh * vd
        embed, heads = (("embed", d),), (("linear_heads", vh),)

        def proj(name, outs, eq_out):
            w = kernel(self, name, embed, outs, pd, d, oi)
            return jnp.einsum(f"btd,{order(oi, 'd', eq_out)}->bt{eq_out}", x, w.astype(dt))

        def vector(name, names, size, init):
            box = with_logical_partitioning(init, names)
            return param_for_compute(self.param(name, box, (size,), pd), names)

        mixed = proj("qkv", (("linear_qkv", channels),), "c")
        z = proj("z", (("linear_heads", vh), ("linear_v", vd)), "hv")
        beta = jax.nn.sigmoid(proj("b", heads, "h").astype(jnp.float32))
        a = proj("a", heads, "h").astype(jnp.float32)
        conv_names = ("linear_qkv", "conv")
        init = with_logical_partitioning(nn.initializers.normal(s.conv_kernel**-0.5), conv_names)
        conv = param_for_compute(self.param("conv", init, (channels, s.conv_kernel), pd), conv_names)
        dt_bias = vector("dt_bias", ("linear_heads",), vh, nn.initializers.ones)
        a_log = vector("A_log", ("linear_heads",), vh, nn.initializers.zeros)
        past_conv, state = self._cached_state(b, channels, vh, kd, vd)
        conved = causal_conv(mixed, conv, past_conv)
        if self.decode and past_conv is not None:
            self._store_conv(mixed, past_conv)
        q = conved[..., : kh * kd].reshape(b, t, kh, kd)
        k = conved[..., kh * kd : 2 * kh * kd].reshape(b, t, kh, kd)
        v = conved[..., 2 * kh * kd :].reshape(b, t, vh, vd)
        q, k = jnp.repeat(q, vh // kh, axis=2), jnp.repeat(k, vh // kh, axis=2)
        g = -jnp.exp(a_log.astype(jnp.float32)) * jax.nn.softplus(a + dt_bias.astype(jnp.float32))
        out, new_state = gated_delta_rule(q, k, v, g, beta, s.chunk, state)
        if self.decode and state is not None:
            self.put_variable(CACHE, "recurrent_state", with_logical_constraint(new_state, STATE_NAMES))
        # The gated RMSNorm of each head's output: normalised in float32, scaled in the compute dtype, then silu(z).
        out = out * jax.lax.rsqrt(jnp.mean(out * out, axis=-1, keepdims=True) + self.norm_eps)
        scale = vector("norm_scale", ("linear_v",), vd, nn.initializers.ones)
        out = (scale.astype(dt) * out.astype(dt)).astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
        out = with_logical_constraint(out.astype(dt), ("batch", "length", "linear_heads", "linear_v"))
        wo = kernel(self, "o", (("linear_heads", vh), ("linear_v", vd)), embed, pd, vh * vd, oi)
        return row_parallel(f"bthv,{order(oi, 'hv', 'd')}->btd", out, wo.astype(dt))

    def _cached_state(self, b: int, channels: int, vh: int, kd: int, vd: int) -> tuple[Any, Any]:
        """Decode mode: (the convolution's past inputs, the state) from the cache; (None, None) while it is made."""
        if not self.decode:
            return None, None
        exists = self.has_variable(CACHE, "recurrent_state")
        conv: Any = self.variable(
            CACHE,
            "conv_state",
            with_logical_partitioning(jnp.zeros, CONV_NAMES),
            (b, self.shape.conv_kernel - 1, channels),
            self.dtype,
        )
        state: Any = self.variable(
            CACHE, "recurrent_state", with_logical_partitioning(jnp.zeros, STATE_NAMES), (b, vh, kd, vd), jnp.float32
        )
        return (conv.value, state.value) if exists else (None, None)

    def _store_conv(self, mixed: jax.Array, past: jax.Array) -> None:
        keep = self.shape.conv_kernel - 1
        full = jnp.concatenate([past.astype(mixed.dtype), mixed], axis=1)[:, -keep:]
        self.put_variable(CACHE, "conv_state", with_logical_constraint(full, CONV_NAMES))


__all__ = [
    "GatedDeltaNet",
    "LinearShape",
    "check_linear_layers",
    "gated_delta_rule",
    "causal_conv",
    "l2norm",
    "CONV_NAMES",
    "STATE_NAMES",
]
