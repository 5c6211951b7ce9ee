"""Mixture-of-experts routing and dispatch, laid out by the rules: experts over an ``expert`` mesh axis.

Tokens are routed within *groups* (a sequence each: the ``batch`` dimension),
so what is kept or dropped never depends on the layout. Per group of ``S``
tokens and ``E`` experts:

1. **route** — softmax router probabilities, the top-``k`` experts of each
   token and their renormalised gates; the load-balancing loss
   ``E · Σ_e f_e · P_e`` (``f_e`` the share of assignments to expert ``e``,
   ``P_e`` its mean probability) over the whole batch;
2. **dispatch** — each expert takes up to ``C`` (capacity) tokens, first
   choices before second ones, in token order; the tokens are gathered into a
   ``(groups, experts, capacity, embed)`` buffer (``dropless``: ``C = S``, no
   token is ever dropped);
3. **experts** — each expert's FFN on its buffer row;
4. **combine** — every token sums its experts' outputs weighted by its gates.

Layout is the rules' business. The buffer is constrained to logical names
``(batch, expert, None, embed)``: with a rule ``[expert, expert]`` ahead of the
batch rules (preset ``ep``) its expert dimension goes over the ``expert`` mesh
axis while the groups, split over ``expert`` too outside the expert layer,
fall back to the remaining batch axes — XLA moves the tokens to the devices
holding their experts with one all-to-all, and back with another. Expert
weights named ``(expert, embed, mlp)`` stay where they are stored. With no
such rule (or an ``expert`` axis of size 1) the same code is a plain
data-parallel MoE.

Example::

    >>> G, S, D, E, M = 2, 64, 32, 8, 64                       # groups, tokens, embed, experts, mlp
    >>> k = jax.random.split(jax.random.key(0), 4)
    >>> x, router = jax.random.normal(k[0], (G, S, D)), jax.random.normal(k[1], (D, E))
    >>> wi_0, wi_1 = jax.random.normal(k[2], (E, D, M)) / 8, jax.random.normal(k[3], (E, D, M)) / 8
    >>> wo = jnp.ones((E, M, D)) / M
    >>> capacity = pt.parallel.expert_capacity(S, E, 2, 1.25)
    >>> y, aux = pt.parallel.moe_ffn(x, router, (wi_0, wi_1, wo), top_k=2, capacity=capacity)
    >>> y.shape, aux.shape
    ((2, 64, 32), ())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from partitioning.boxes import with_logical_constraint
from partitioning.context import get_logical_axis_rules
from partitioning.parallel.trace import record
from partitioning.resolve import axes_tuple

DISPATCHED = ("batch", "expert", None, "embed")  # the (groups, experts, capacity, embed) buffer
TOKENS = ("batch", "length", "embed")


def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Tokens one expert takes per group: ``ceil(cf · S · k / E)`` (at most ``S``); ``S`` when dropless (None).

    Example::

        >>> pt.parallel.expert_capacity(128, 8, 2, 1.25), pt.parallel.expert_capacity(128, 8, 2, None)
        (40, 128)
    """
    if capacity_factor is None:
        return int(tokens)
    return max(1, min(int(tokens), math.ceil(capacity_factor * tokens * top_k / experts)))


ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_group")


def route(
    logits: jax.Array, top_k: int, norm_topk_prob: bool | None = None, routing: str = "softmax_topk"
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(gates (G, S, k), experts (G, S, k), load-balancing loss)`` from router logits ``(G, S, E)``.

    ``softmax_topk``: softmax over all experts in float32, then the top ``k``; their probabilities are
    renormalised to sum to 1 when ``norm_topk_prob`` (None: when ``k > 1``), as Mixtral and Qwen3-MoE's
    ``norm_topk_prob: true`` do; else the gates are the raw probabilities. ``topk_softmax`` (GPT-OSS): the
    top ``k`` logits, then a softmax over those ``k``.
    """
    e = logits.shape[-1]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if routing == "topk_softmax":
        top, idx = _top_k(logits.astype(jnp.float32), top_k)
        gates = jax.nn.softmax(top, axis=-1)
    else:
        top, idx = _top_k(probs, top_k)
        norm = top_k > 1 if norm_topk_prob is None else norm_topk_prob
        gates = top / jnp.sum(top, axis=-1, keepdims=True) if norm else top
    share = jnp.mean(jax.nn.one_hot(idx, e, dtype=jnp.float32), axis=(0, 1, 2))  # f_e (sums to 1)
    aux = e * jnp.sum(share * jnp.mean(probs, axis=(0, 1)))
    return gates, idx, aux


def group_route(
    logits: jax.Array,
    correction: jax.Array | None,
    top_k: int,
    groups: int,
    topk_groups: int,
    norm_topk_prob: bool,
    scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """DeepSeek-V3's routing: sigmoid scores; the ``topk_groups`` of ``groups`` expert groups whose two best
    scores (plus the ``correction`` bias) sum highest; the top ``k`` experts within them by corrected score;
    gates their uncorrected scores (renormalised when ``norm_topk_prob``), times ``scale``
    (``routed_scaling_factor``). Returns ``(gates, experts, load-balancing loss)`` as :func:`route`.

    Example::

        >>> logits = jnp.array([[[4.0, 3.0, 0.0, 0.0, 5.0, -9.0, 0.0, 0.0]]])   # 4 groups of 2 experts
        >>> gates, idx, _ = pt.parallel.group_route(logits, None, 2, 4, 1, True, 2.5)
        >>> idx.tolist()                                   # group 0 (4 + 3) beats group 2 (5 - 9): experts 0, 1
        [[[0, 1]]]
    """
    e = logits.shape[-1]
    scores = jax.nn.sigmoid(logits.astype(jnp.float32))
    choice = scores if correction is None else scores + correction.astype(jnp.float32)
    grouped = choice.reshape(*choice.shape[:-1], groups, e // groups)
    best_two = jnp.sum(_top_k(grouped, min(2, e // groups))[0], axis=-1)  # (G, S, groups)
    _, chosen = _top_k(best_two, topk_groups)
    keep = jnp.any(jax.nn.one_hot(chosen, groups, dtype=jnp.bool_), axis=-2)  # (G, S, groups)
    masked = jnp.where(jnp.repeat(keep, e // groups, axis=-1), choice, -jnp.inf)
    _, idx = _top_k(masked, top_k)
    gates = jnp.take_along_axis(scores, idx, axis=-1)
    if norm_topk_prob:
        gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-20)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    share = jnp.mean(jax.nn.one_hot(idx, e, dtype=jnp.float32), axis=(0, 1, 2))
    return gates * scale, idx, e * jnp.sum(share * jnp.mean(probs, axis=(0, 1)))


def _top_k(probs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``lax.top_k`` over the last axis as ``k`` argmaxes: XLA partitions a reduction over the batch
    dimensions, whereas its TopK gathers every token's scores onto every device first."""
    vals, idxs = [], []
    for _ in range(k):
        i = jnp.argmax(probs, axis=-1)
        vals.append(jnp.take_along_axis(probs, i[..., None], axis=-1)[..., 0])
        idxs.append(i.astype(jnp.int32))
        probs = jnp.where(jax.nn.one_hot(i, probs.shape[-1], dtype=jnp.bool_), -jnp.inf, probs)
    return jnp.stack(vals, axis=-1), jnp.stack(idxs, axis=-1)


def _slots(idx: jax.Array, experts: int, cap: int) -> tuple[jax.Array, jax.Array]:
    """Per (token, choice) of one group: the flat slot ``e · C + position`` and whether it fits."""
    s, k = idx.shape
    order = idx.T.reshape(-1)  # first choices of all tokens first
    onehot = jax.nn.one_hot(order, experts, dtype=jnp.int32)
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1).reshape(k, s).T
    keep = position < cap
    return jnp.where(keep, idx * cap + position, experts * cap), keep


def dispatch(x: jax.Array, idx: jax.Array, experts: int, cap: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(buffer (G, E, C, D), slots (G, S, k), keep (G, S, k))``: every group's tokens in their experts' slots."""

    def one(xg, ig):
        slots, keep = _slots(ig, experts, cap)
        s = xg.shape[0]
        token = jnp.full((experts * cap,), s, jnp.int32)
        token = token.at[slots.reshape(-1)].set(jnp.repeat(jnp.arange(s, dtype=jnp.int32), ig.shape[1]), mode="drop")
        padded = jnp.concatenate([xg, jnp.zeros((1, xg.shape[-1]), xg.dtype)])  # row s: an empty slot
        # Gathered straight into (experts, capacity, embed): a reshape of the gathered (experts * capacity) rows
        # would merge the dimension the buffer's `expert` layout splits, which XLA rematerializes in full.
        return padded[token.reshape(experts, cap)], slots, keep

    return jax.vmap(one)(x, idx)


def combine(y: jax.Array, slots: jax.Array, keep: jax.Array, gates: jax.Array) -> jax.Array:
    """``(G, S, D)``: each token's experts' outputs (``y``: ``(G, E, C, D)``) summed with its gates."""

    def one(yg, sg, kg, gg):
        # Indexed by (expert, position), not through a reshape to (experts * capacity) rows (see dispatch).
        e, c = yg.shape[0], yg.shape[1]
        slot = jnp.minimum(sg, e * c - 1)
        picked = yg[slot // c, slot % c]  # (S, k, D)
        w = (gg * kg).astype(picked.dtype)
        return jnp.einsum("skd,sk->sd", picked, w)

    return jax.vmap(one)(y, slots, keep, gates)


def moe_ffn(
    x: jax.Array,
    router: jax.Array,
    weights: Sequence[jax.Array],
    *,
    top_k: int,
    capacity: int | None = None,
    expert_fn: Callable[..., jax.Array] | None = None,
    norm_topk_prob: bool | None = None,
    router_bias: jax.Array | None = None,
    routing: str = "softmax_topk",
    route_fn: Callable[[jax.Array], tuple[jax.Array, jax.Array, jax.Array]] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """A mixture-of-experts FFN over ``x`` ``(G, S, D)``: ``(y (G, S, D), load-balancing loss)``.

    ``router``: ``(D, E)``; ``weights``: the experts' stacked weights, leading
    ``E`` axis, for ``expert_fn(buffer (G, E, C, D), *weights) -> (G, E, C, D)``
    (default: SwiGLU with ``wi_0, wi_1 (E, D, M)``, ``wo (E, M, D)``).
    ``capacity``: tokens per expert and group (:func:`expert_capacity`); None: dropless
    (``S``). ``norm_topk_prob``, ``routing``: see :func:`route`; ``router_bias`` ``(E,)`` is added to the router's
    logits (GPT-OSS). Name the weights' expert dimension ``expert`` and the rules decide
    where the experts live; the tokens follow (module docstring).

    Example::

        >>> G, S, D, E, M = 2, 64, 32, 8, 64                       # groups, tokens, embed, experts, mlp
        >>> k = jax.random.split(jax.random.key(0), 4)
        >>> x, router = jax.random.normal(k[0], (G, S, D)), jax.random.normal(k[1], (D, E))
        >>> wi_0, wi_1 = jax.random.normal(k[2], (E, D, M)) / 8, jax.random.normal(k[3], (E, D, M)) / 8
        >>> wo = jnp.ones((E, M, D)) / M
        >>> y, aux = pt.parallel.moe_ffn(x, router, (wi_0, wi_1, wo), top_k=2)       # dropless
        >>> float(aux) > 0      # in a model: self.sow("losses", "moe_aux_loss", 0.01 * aux); the Trainer adds it
        True
    """
    e = router.shape[-1]
    capacity = x.shape[1] if capacity is None else int(capacity)
    logits = jnp.einsum("gsd,de->gse", x, router.astype(x.dtype)).astype(jnp.float32)
    if router_bias is not None:
        logits = logits + router_bias.astype(jnp.float32)
    # Every token's scores for all experts where the token is: top-k needs the whole row, so a router
    # split over `expert` is gathered (D x E), not the tokens' logits (tokens x E).
    logits = with_logical_constraint(logits, ("batch", "length", None))
    if route_fn is not None:  # another routing rule (DeepSeek's: group_route)
        gates, idx, aux = route_fn(logits)
    else:
        gates, idx, aux = route(logits, top_k, norm_topk_prob, routing)
    buf, slots, keep = dispatch(x, idx, e, capacity)
    _record(x, e, top_k, capacity)
    # To the devices holding each expert (an all-to-all over `expert` when the rules split it) ...
    buf = with_logical_constraint(buf, DISPATCHED)
    out = (expert_fn or swiglu)(buf, *weights)
    out = with_logical_constraint(out, DISPATCHED)
    # ... and back to the devices holding each token's group.
    out = with_logical_constraint(out, ("batch", None, None, None))
    y = combine(out, slots, keep, gates)
    return with_logical_constraint(y, TOKENS), aux


def swiglu(buf: jax.Array, wi_0: jax.Array, wi_1: jax.Array, wo: jax.Array) -> jax.Array:
    """Each expert's SwiGLU FFN on its rows of ``buf`` ``(G, E, C, D)``."""
    dt = buf.dtype
    gate = jnp.einsum("gecd,edm->gecm", buf, wi_0.astype(dt))
    up = jnp.einsum("gecd,edm->gecm", buf, wi_1.astype(dt))
    h = with_logical_constraint(jax.nn.silu(gate) * up, ("batch", "expert", None, "mlp"))
    return jnp.einsum("gecm,emd->gecd", h, wo.astype(dt))


def clamped_swiglu(limit: float, alpha: float) -> Callable[..., jax.Array]:
    """GPT-OSS's experts: ``(up + 1) * gate * sigmoid(alpha * gate)`` with ``gate <= limit`` and
    ``|up| <= limit``, each projection with its bias when given:
    ``expert_fn(buf, wi_0, wi_1, wo[, wi_0_bias, wi_1_bias, wo_bias])`` (biases ``(E, M)``, ``(E, M)``, ``(E, D)``).

    Example::

        >>> buf, w = jnp.ones((1, 2, 3, 4)), jnp.ones((2, 4, 5)) * 10
        >>> fn = pt.parallel.clamped_swiglu(7.0, 1.702)
        >>> out = fn(buf, w, w, jnp.ones((2, 5, 4)), jnp.zeros((2, 5)), jnp.zeros((2, 5)), jnp.zeros((2, 4)))
        >>> round(float(out[0, 0, 0, 0]), 2)                  # 5 x (7 + 1) x 7 sigmoid(1.702 x 7): both clamped
        280.0
    """

    def fn(buf, wi_0, wi_1, wo, *biases):
        dt = buf.dtype
        b0, b1, bo = (b.astype(dt)[:, None] for b in biases) if biases else (0, 0, 0)
        gate = jnp.einsum("gecd,edm->gecm", buf, wi_0.astype(dt)) + b0
        up = jnp.einsum("gecd,edm->gecm", buf, wi_1.astype(dt)) + b1
        gate, up = jnp.minimum(gate, limit), jnp.clip(up, -limit, limit)
        h = with_logical_constraint((up + 1) * gate * jax.nn.sigmoid(gate * alpha), ("batch", "expert", None, "mlp"))
        return jnp.einsum("gecm,emd->gecd", h, wo.astype(dt)) + bo

    return fn


def _record(x: jax.Array, experts: int, top_k: int, cap: int) -> None:
    rules = get_logical_axis_rules()
    tokens = rules.resolve(TOKENS) if rules else None
    buffer = rules.resolve(DISPATCHED) if rules else None
    record(
        "experts",
        experts=int(experts),
        top_k=int(top_k),
        capacity=int(cap),
        embed=int(x.shape[-1]),
        groups=int(x.shape[0]),
        dtype=str(x.dtype),
        batch_axes=axes_tuple(tokens[0]) if tokens else (),
        expert_axes=axes_tuple(buffer[1]) if buffer else (),
    )


__all__ = [
    "clamped_swiglu",
    "group_route",
    "ROUTINGS",
    "expert_capacity",
    "route",
    "dispatch",
    "combine",
    "moe_ffn",
    "swiglu",
    "DISPATCHED",
    "TOKENS",
]
