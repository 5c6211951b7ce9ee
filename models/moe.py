"""The reference GPT's mixture-of-experts MLP: a router, ``E`` SwiGLU experts, top-``k`` routing.

Parameters (logical names in brackets): router ``(embed, expert)``; experts
``wi_0`` / ``wi_1`` ``(expert, embed, mlp)`` and ``wo`` ``(expert, mlp, embed)``.
Routing, capacity and dispatch are :mod:`partitioning.parallel.experts`; the
load-balancing loss, times ``aux_loss_weight``, is sown into ``losses`` as
``moe_aux_loss``, which the trainer adds to the objective and reports.

Example::

    >>> from partitioning.models import GPT
    >>> model = GPT(embed=64, mlp=128, layers=2, moe={"experts": 8, "top_k": 2, "capacity_factor": 1.25})
    >>> params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))["params"]
    >>> params["blocks"]["mlp"]["wi_0"].names, params["blocks"]["mlp"]["wi_0"].value.shape
    (('layers', 'expert', 'embed', 'mlp'), (2, 8, 64, 128))
    >>> model = GPT(moe={"experts": 8, "top_k": 2, "dropless": True})
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from partitioning.boxes import with_logical_partitioning
from partitioning.errors import ConfigError, did_you_mean
from partitioning.models.layers import MlpBlock
from partitioning.parallel.experts import ROUTINGS, clamped_swiglu, expert_capacity, group_route, moe_ffn


@dataclasses.dataclass(frozen=True)
class MoE:
    """The ``moe:`` options of the reference GPT.

    ``capacity_factor``: each expert takes ``ceil(cf · tokens · top_k / experts)``
    tokens of a sequence, the rest of its tokens skip it; ``dropless: true``
    lets every expert take every token (no token is ever dropped).
    ``norm_topk_prob``: renormalise the top-``k`` gates to sum to 1 (null: when ``top_k > 1``);
    ``mlp``: each expert's hidden width (null: the model's ``mlp``), as Qwen3-MoE's
    ``moe_intermediate_size`` beside the dense layers' ``intermediate_size``.

    Example::

        >>> from partitioning.models.moe import MoE
        >>> MoE.parse({"experts": 8, "top_k": 2, "dropless": True}).capacity(128)
        128
    """

    experts: int = 8
    top_k: int = 2
    capacity_factor: float | None = 1.25
    dropless: bool = False
    aux_loss_weight: float = 0.01
    norm_topk_prob: bool | None = None
    mlp: int | None = None
    # GPT-OSS: a router bias, biases on every expert projection, the top-k logits' softmax as gates, the
    # clamped SwiGLU (``swiglu_limit`` / ``swiglu_alpha``; partitioning.parallel.experts.clamped_swiglu).
    router_bias: bool = False
    expert_bias: bool = False
    routing: str = "softmax_topk"
    swiglu_limit: float | None = None
    swiglu_alpha: float | None = None
    # DeepSeek-V3 (routing: sigmoid_group, partitioning.parallel.experts.group_route): expert groups, how many
    # a token may use, the gates' scale, a score correction bias ``router_correction (expert,)``, and a shared
    # expert every token passes through (``shared``: a dense SwiGLU MLP this wide).
    groups: int = 1
    topk_groups: int = 1
    routed_scaling: float = 1.0
    correction_bias: bool = False
    shared_mlp: int | None = None

    @classmethod
    def parse(cls, options: Any) -> MoE | None:
        """``None`` / a mapping of options / a ``MoE`` -> ``MoE | None``; a ConfigError naming ``moe``."""
        if options is None or isinstance(options, MoE):
            return options
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"moe must be a mapping of {[f.name for f in dataclasses.fields(cls)]}, got {type(options).__name__}",
                arg="moe",
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for k in options:
            if k not in names:
                raise ConfigError(
                    f"unknown moe option {k!r} (options: {', '.join(names)}){did_you_mean(str(k), names)}", arg="moe"
                )
        for k, v in options.items():
            kinds: tuple[type, ...] = {
                "experts": (int,),
                "top_k": (int,),
                "dropless": (bool,),
                "norm_topk_prob": (bool, type(None)),
                "mlp": (int, type(None)),
                "router_bias": (bool,),
                "expert_bias": (bool,),
                "correction_bias": (bool,),
                "groups": (int,),
                "topk_groups": (int,),
                "shared_mlp": (int, type(None)),
                "routing": (str,),
            }.get(k, (int, float, type(None)))
            if isinstance(v, bool) != (bool in kinds) or not isinstance(v, kinds):
                want = (
                    "a number"
                    if float in kinds
                    else "true or false"
                    if bool in kinds
                    else f"one of {', '.join(ROUTINGS)}"
                    if str in kinds
                    else "an integer"
                )
                raise ConfigError(f"moe.{k} must be {want}, got {v!r}", arg="moe")
        moe = cls(**dict(options))
        if moe.aux_loss_weight is None or moe.aux_loss_weight < 0:
            raise ConfigError(f"moe.aux_loss_weight must be a number >= 0, got {moe.aux_loss_weight!r}", arg="moe")
        if moe.experts < 1 or not 1 <= moe.top_k <= moe.experts:
            raise ConfigError(
                f"moe needs experts >= 1 and 1 <= top_k <= experts, got experts {moe.experts}, top_k {moe.top_k}",
                arg="moe",
            )
        if moe.mlp is not None and moe.mlp < 1:
            raise ConfigError(f"moe.mlp must be >= 1 (or null: the model's mlp), got {moe.mlp}", arg="moe")
        if moe.routing not in ROUTINGS:
            raise ConfigError(f"moe.routing must be one of {', '.join(ROUTINGS)}, got {moe.routing!r}", arg="moe")
        if moe.groups < 1 or moe.experts % moe.groups or not 1 <= moe.topk_groups <= moe.groups:
            raise ConfigError(
                f"moe needs groups dividing experts and 1 <= topk_groups <= groups, got groups {moe.groups}, "
                f"topk_groups {moe.topk_groups}, experts {moe.experts}",
                arg="moe",
            )
        if (moe.swiglu_limit is None) != (moe.swiglu_alpha is None):
            raise ConfigError("moe.swiglu_limit and moe.swiglu_alpha go together (the clamped SwiGLU)", arg="moe")
        if not moe.dropless and (moe.capacity_factor is None or moe.capacity_factor <= 0):
            raise ConfigError("moe.capacity_factor must be > 0 (or set dropless: true)", arg="moe")
        return moe

    def capacity(self, tokens: int) -> int:
        return expert_capacity(tokens, self.experts, self.top_k, None if self.dropless else self.capacity_factor)


def check_moe_layers(moe_layers: Any, layers: int, scan_layers: bool) -> None:
    """``moe_layers`` (the layers whose MLP is MoE) are distinct layer numbers; a mix needs ``scan_layers: false``.

    A scanned stack repeats one block, so dense layers between sparse ones are built unscanned
    (``block_{i}``); compile time then grows with depth (docs/pipeline-experts.md).

    Example::

        >>> from partitioning.models.moe import check_moe_layers
        >>> check_moe_layers((1, 3), 4, True)
        Traceback (most recent call last):
        partitioning.errors.ConfigError: moe_layers (1, 3) puts experts on some layers only: that needs \
scan_layers: false (a scanned stack repeats one block)
    """
    if moe_layers is None:
        return
    bad = [i for i in moe_layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers]
    if bad or len(set(moe_layers)) != len(moe_layers):
        raise ConfigError(
            f"moe_layers must be distinct layer numbers 0..{layers - 1}, got {list(moe_layers)}", arg="moe_layers"
        )
    if scan_layers and set(moe_layers) != set(range(layers)):
        raise ConfigError(
            f"moe_layers {tuple(moe_layers)} puts experts on some layers only: that needs scan_layers: false "
            "(a scanned stack repeats one block)",
            arg="moe_layers",
        )


class MoeMlp(nn.Module):
    """Top-k routed SwiGLU experts in place of the dense MLP."""

    moe: MoE
    mlp: int
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x):
        d, e, m, pd = x.shape[-1], self.moe.experts, self.moe.mlp or self.mlp, self.param_dtype

        def param(name, names, shape, fan_in):
            init = nn.initializers.normal(stddev=fan_in**-0.5)
            return self.param(name, with_logical_partitioning(init, names), shape, pd)

        router = param("router", ("embed", "expert"), (d, e), d)
        experts: tuple[Any, ...] = (
            param("wi_0", ("expert", "embed", "mlp"), (e, d, m), d),
            param("wi_1", ("expert", "embed", "mlp"), (e, d, m), d),
            param("wo", ("expert", "mlp", "embed"), (e, m, d), m),
        )

        def bias(name, names, shape):
            return self.param(name, with_logical_partitioning(nn.initializers.zeros, names), shape, pd)

        router_bias = bias("router_bias", ("expert",), (e,)) if self.moe.router_bias else None
        if self.moe.expert_bias:
            experts += (
                bias("wi_0_bias", ("expert", "mlp"), (e, m)),
                bias("wi_1_bias", ("expert", "mlp"), (e, m)),
                bias("wo_bias", ("expert", "embed"), (e, d)),
            )
        route_fn = None
        if self.moe.routing == "sigmoid_group":
            correction = bias("router_correction", ("expert",), (e,)) if self.moe.correction_bias else None
            o = self.moe
            route_fn = functools.partial(
                group_route,
                correction=correction,
                top_k=o.top_k,
                groups=o.groups,
                topk_groups=o.topk_groups,
                norm_topk_prob=bool(o.norm_topk_prob),
                scale=float(o.routed_scaling),
            )
        fn = None
        if self.moe.swiglu_limit is not None:
            fn = clamped_swiglu(float(self.moe.swiglu_limit), float(self.moe.swiglu_alpha or 1.0))
        y, aux = moe_ffn(
            x,
            router,
            experts,
            top_k=self.moe.top_k,
            capacity=self.moe.capacity(x.shape[1]),
            norm_topk_prob=self.moe.norm_topk_prob,
            router_bias=router_bias,
            routing=self.moe.routing,
            expert_fn=fn,
            route_fn=route_fn,
        )
        if self.moe.shared_mlp:  # DeepSeek's shared expert: every token, no gate
            y = y + MlpBlock(self.moe.shared_mlp, self.dtype, pd, name="shared")(x).astype(y.dtype)
        self.sow("losses", "moe_aux_loss", self.moe.aux_loss_weight * aux)
        return y.astype(self.dtype)


__all__ = ["MoE", "MoeMlp", "check_moe_layers"]
