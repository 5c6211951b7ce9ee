"""The decoder's building blocks other than attention: parameters, norms, embedding lookup, MLPs.

Every parameter is created with its true shape and logical names (Flax's
``nn.DenseGeneral`` flattens kernel shapes before calling the initializer,
which breaks 3-name annotations), so the layers use ``self.param`` +
``einsum`` directly. The options cover the published decoder families
(:mod:`partitioning.models.hf`): RMSNorm with ``scale`` or ``(1 + scale)``
(Gemma), LayerNorm with a bias (GPT-2), gated (SwiGLU / GeGLU) or plain MLPs
with silu / gelu activations and optional biases.

Example::

    >>> from partitioning.models.layers import MlpBlock
    >>> mlp = MlpBlock(512, jnp.float32, jnp.float32, act="gelu_tanh", glu=False, bias=True)  # GPT-2's MLP
    >>> abstract = jax.eval_shape(mlp.init, jax.random.key(0), jnp.zeros((2, 8, 128)))
    >>> jax.tree.map(jnp.shape, pt.unbox(abstract))["params"]
    {'wi': (128, 512), 'wi_bias': (512,), 'wo': (512, 128), 'wo_bias': (128,)}
    >>> pt.logical_names(abstract)["params"]["wi"]      # true shapes, named: the rules can split them
    ('embed', 'mlp')
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import (
    compute_spec,
    logical_spec,
    param_for_compute,
    with_logical_constraint,
    with_logical_partitioning,
)
from partitioning.context import get_logical_axis_rules
from partitioning.models.lora import adapt, project
from partitioning.models.quantized import base_quantization, quantized_kernel

NORMS = ("rms", "layer", "rms_offset")
# The activations of the families' MLPs, by HF name too: gelu_new / gelu_pytorch_tanh are the tanh approximation.
ACTIVATIONS = {
    "silu": nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": nn.relu,
}


def dense_param(mod: nn.Module, name: str, names: tuple, shape: tuple, dtype: Any, fan_in: int):
    """A weight initialised N(0, 1/fan_in), boxed with ``names``, resharded for compute on Explicit meshes."""
    init = nn.initializers.normal(stddev=fan_in**-0.5)
    return param_for_compute(mod.param(name, with_logical_partitioning(init, names), shape, dtype), names)


def kernel(
    mod: nn.Module,
    name: str,
    ins: tuple,
    outs: tuple,
    dtype: Any,
    fan_in: int,
    out_in: bool = False,
    quantizable: bool = True,
):
    """A projection weight over ``ins`` then ``outs`` (``((logical name, size), ...)``); ``out_in`` stores it
    outputs first, as torch's ``Linear`` does (the Hugging Face families: loading them is then a reshape).
    Stored quantized when the module's ``lora`` has a ``base_dtype`` (:mod:`partitioning.models.quantized`)
    and ``quantizable``."""
    axes = tuple(outs) + tuple(ins) if out_in else tuple(ins) + tuple(outs)
    names, shape = tuple(n for n, _ in axes), tuple(s for _, s in axes)
    base = base_quantization(mod) if quantizable else None
    if base is not None:
        return quantized_kernel(mod, name, names, shape, dtype, fan_in, base)
    return dense_param(mod, name, names, shape, dtype, fan_in)


def order(out_in: bool, ins: str, outs: str) -> str:
    """The einsum subscripts of a :func:`kernel`: ``ins + outs``, or ``outs + ins`` when ``out_in``."""
    return outs + ins if out_in else ins + outs


def bias_param(mod: nn.Module, name: str, names: tuple, shape: tuple, dtype: Any):
    """A bias (zeros) named by the dimensions it lives on, e.g. ``("heads", "kv")`` for a query bias."""
    return param_for_compute(
        mod.param(name, with_logical_partitioning(nn.initializers.zeros, names), shape, dtype), names
    )


class Norm(nn.Module):
    """RMSNorm (``rms``: ``x * scale``, as in Llama; ``rms_offset``: ``x * (1 + scale)``, scale
    initialised at 0, as in Gemma) or LayerNorm (``layer``: scale and bias, as in GPT-2);
    statistics in float32."""

    kind: str = "rms"
    eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    axis: str = "embed"  # the logical name of the normalised dimension (MLA's latents: q_lora, kv_lora)

    @nn.compact
    def __call__(self, x):
        def vector(name, init):
            box = with_logical_partitioning(init, (self.axis,))
            return param_for_compute(self.param(name, box, (x.shape[-1],), self.param_dtype), (self.axis,))

        x32 = x.astype(jnp.float32)
        if self.kind == "rms_offset":
            scale = 1.0 + vector("scale", nn.initializers.zeros).astype(jnp.float32)
        else:
            scale = vector("scale", nn.initializers.ones).astype(jnp.float32)
        if self.kind != "layer":
            return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps) * scale).astype(
                self.dtype
            )
        bias = vector("bias", nn.initializers.zeros).astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
        return ((x32 - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias).astype(self.dtype)


def make_norm(kind: str, dtype, param_dtype, name: str, eps: float = 1e-6) -> Norm:
    return Norm(kind, eps=eps, dtype=dtype, param_dtype=param_dtype, name=name)


def embed_lookup(emb, tokens):
    """``emb[tokens]``; on Explicit axes JAX cannot infer a gather's output layout, so it is named."""
    spec = logical_spec(("batch", "length", "embed"))
    if spec is None:
        if get_logical_axis_rules() and not jax.sharding.get_abstract_mesh().empty:
            # Gather the table over the batch axes first (FSDP's all-gather), so the lookup is local:
            # XLA cannot move a lookup split along `embed` to a batch split over several axes (ep)
            # without replicating the activations.
            emb = jax.lax.with_sharding_constraint(emb, compute_spec(("vocab", "embed")))
        return jnp.take(emb, tokens, axis=0)
    return emb.at[tokens].get(out_sharding=spec, mode="fill")


def row_parallel(equation: str, h, w):
    """An output projection contracting a (tensor-sharded) dimension back to ``embed``.

    On Explicit axes JAX cannot infer the output layout of a contraction over
    a sharded dimension, so it is named; on Auto axes XLA inserts the all-reduce.
    """
    y = jnp.einsum(equation, h, w, out_sharding=logical_spec(("batch", "length", "embed")))
    return with_logical_constraint(y, ("batch", "length", "embed"))


class MlpBlock(nn.Module):
    """Gated (``glu``: SwiGLU as in Llama, GeGLU as in Gemma: ``wi_0`` gate, ``wi_1`` up) or plain
    (``wi``, as in GPT-2) MLP, then ``wo`` back to ``embed``; ``bias`` adds ``<weight>_bias`` vectors."""

    mlp: int
    dtype: Any
    param_dtype: Any
    act: str = "silu"
    glu: bool = True
    bias: bool = False
    out_in: bool = False  # weights stored (out, in), as torch's Linear
    lora: Any = None  # LoRA adapters on wi / wi_0 / wi_1 / wo (partitioning.models.lora)

    @nn.compact
    def __call__(self, x):
        d, m, pd, dt, oi = x.shape[-1], self.mlp, self.param_dtype, self.dtype, self.out_in
        embed, mlp = (("embed", d),), (("mlp", m),)
        w_in, w_out = f"btd,{order(oi, 'd', 'm')}->btm", f"btm,{order(oi, 'm', 'd')}->btd"

        def project_in(name):
            y = project(self, name, w_in, x, kernel(self, name, embed, mlp, pd, d, oi), dt, self.lora, embed, mlp, oi)
            return y + bias_param(self, f"{name}_bias", ("mlp",), (m,), pd).astype(dt) if self.bias else y

        act = ACTIVATIONS[self.act]
        if self.glu:
            # Created in this order (gate, up, down) so the default's init is unchanged.
            w0 = kernel(self, "wi_0", embed, mlp, pd, d, oi)
            w1 = kernel(self, "wi_1", embed, mlp, pd, d, oi)
            wo = kernel(self, "wo", mlp, embed, pd, m, oi)
            gate = project(self, "wi_0", w_in, x, w0, dt, self.lora, embed, mlp, oi)
            up = project(self, "wi_1", w_in, x, w1, dt, self.lora, embed, mlp, oi)
            if self.bias:
                gate = gate + bias_param(self, "wi_0_bias", ("mlp",), (m,), pd).astype(dt)
                up = up + bias_param(self, "wi_1_bias", ("mlp",), (m,), pd).astype(dt)
            hdn = act(gate) * up
        else:
            hdn = act(project_in("wi"))
            wo = kernel(self, "wo", mlp, embed, pd, m, oi)
        hdn = with_logical_constraint(hdn, ("batch", "length", "mlp"))
        y = adapt(self, "wo", row_parallel(w_out, hdn, wo.astype(dt)), hdn, w_out, self.lora, mlp, embed, oi)
        if self.bias:
            y = y + bias_param(self, "wo_bias", ("embed",), (d,), pd).astype(dt)
        return y


__all__ = [
    "Norm",
    "MlpBlock",
    "make_norm",
    "dense_param",
    "kernel",
    "order",
    "bias_param",
    "embed_lookup",
    "row_parallel",
    "NORMS",
    "ACTIVATIONS",
]
