"""Decoding with a KV cache (greedy or sampled), on a mesh under a rule table.

A model that can decode has a ``decode`` attribute (Flax's decode pattern, as
the reference decoder :class:`partitioning.models.GPT` has): cloned with
``decode=True`` its attention layers keep each layer's keys and values in a
``cache`` collection — stacked with the layers when they are scanned — and
every call appends the new positions to it. The cache is created directly in
its shards (its logical names ``(batch, length, kv_heads, kv)`` go through the
same rules as everything else); the prompt is run once (prefill), then one
token per step, each step a jitted call that updates the cache in place
(donated).

A batch of prompts is decoded together, its rows padded to a multiple of the
batch shards (the rules' batch axes) so every layout applies as it does in
training. Each step chooses the next token inside the jitted call: greedy, or
sampled (temperature, top-k, top-p; see :mod:`partitioning.decode.sampling`)
from a key folded from the seed and the position.

Example::

    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")   # a tiny random-weight Llama
    >>> pt.decode.generate(model, variables["params"], [1, 272, 203], mesh=mesh, rules="fsdp", max_tokens=4)
    [174, 174, 174, 174]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.boxes import unbox
from partitioning.data.batch import place
from partitioning.decode.sampling import Sampling, choose
from partitioning.errors import ConfigError
from partitioning.layout import tree_shardings
from partitioning.mesh import sharding_context
from partitioning.parallel.context import context_axes, context_size
from partitioning.parallel.pipeline import pipeline_stages
from partitioning.rules import as_rules

CACHE = "cache"
GREEDY = Sampling()


def decoder_of(model: Any, mesh: jax.sharding.Mesh | None = None) -> Any:
    """``model`` in decode mode (``model.clone(decode=True)``); a ConfigError for models without one,
    or for a ``mesh`` with a ``stage`` axis (decoding does not run pipelined)."""
    if mesh is not None and pipeline_stages(mesh) > 1:
        raise ConfigError(
            f"decoding does not run pipelined: the mesh has a `stage` axis of {pipeline_stages(mesh)}; "
            f"decode on a mesh without one (e.g. its devices on fsdp)",
            arg="stage",
        )
    module = getattr(model, "module", model)  # a LinenModel adapter holds the module
    fields = {f.name for f in dataclasses.fields(module)} if dataclasses.is_dataclass(module) else set()
    if "decode" not in fields:
        raise ConfigError(
            f"{type(module).__name__} has no decode mode (a `decode` attribute and a KV cache); "
            f"generate works with the reference decoder (gpt and the Hugging Face families)"
        )
    return module.clone(decode=True)


def batch_rows(mesh: jax.sharding.Mesh, rules: Any) -> int:
    """Rows one global batch needs so its batch dimension divides over the rules' batch axes."""
    spec = as_rules(rules).batch_spec(2)
    axes = spec[0] if len(spec) else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[a] for a in axes)


class Decoder:
    """Jitted prefill and decode steps of one model on one mesh, for sequences up to ``max_len`` tokens.

    ``batch`` prompts are decoded together (rows rounded up to a multiple of the
    rules' batch shards; spare rows repeat the first prompt and are dropped).
    Prompts of different lengths share the cache's positions: every row is fed
    its own prompt token while it has one, then its own sampled tokens.

    Example::

        >>> from partitioning.decode.generate import Decoder
        >>> from partitioning.decode.sampling import Sampling
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
        >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp_tp")
        >>> dec = Decoder(model, mesh, "fsdp_tp", max_len=16)
        >>> dec.rows, dec.cache_shardings["blocks"]["attn"]["cached_key"].spec   # (layers, batch, length, kv_heads, kv)
        (4, P(None, ('data', 'fsdp'), None, 'tensor', None))
        >>> dec.greedy(variables["params"], [1, 272, 203], max_tokens=4)
        [174, 174, 174, 174]
        >>> dec.greedy(variables["params"], [1, 90, 3], max_tokens=8)    # same prompt length: no new compile
        [253, 141, 314, 149, 32, 89, 212, 130]
        >>> dec.decode(variables["params"], [[1, 272, 203], [1, 90, 3]], max_tokens=4, stop_ids=[314])  # a batch
        [[174, 174, 174, 174], [253, 141, 314]]
        >>> hot = Sampling(temperature=1.0, top_k=50)
        >>> a = dec.decode(variables["params"], [[1, 90, 3]], 8, sampling=hot, seed=7)
        >>> a == dec.decode(variables["params"], [[1, 90, 3]], 8, sampling=hot, seed=7)   # same seed, same tokens
        True
    """

    def __init__(
        self,
        model: Any,
        mesh: jax.sharding.Mesh,
        rules: Any,
        *,
        max_len: int,
        batch: int = 1,
        on_indivisible: str = "error",
    ):
        self.model, self.mesh, self.rules = decoder_of(model, mesh), mesh, as_rules(rules).validate(mesh)
        shards = batch_rows(mesh, self.rules)
        with sharding_context(mesh, self.rules):
            split = context_axes()
            # A cache whose length splits over the context devices: its prefill is ring / all_gather attention.
            c = context_size(split) if split else 1
        self.rows, self.max_len = -(-max(int(batch), 1) // shards) * shards, -(-int(max_len) // c) * c
        tokens = jax.ShapeDtypeStruct((self.rows, self.max_len), jnp.int32)
        with sharding_context(mesh, self.rules):
            abstract = jax.eval_shape(lambda: self.model.init(jax.random.key(0), tokens))
        if CACHE not in abstract:
            raise ConfigError(f"{type(self.model).__name__} made no `cache` collection in decode mode")
        self.cache_shardings = tree_shardings(abstract[CACHE], mesh, self.rules, on_indivisible=on_indivisible)
        shapes = unbox(abstract[CACHE])
        self._zeros = jax.jit(
            lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), out_shardings=self.cache_shardings
        )
        self.token_sharding = NamedSharding(mesh, self.rules.batch_spec(2))
        replicated = NamedSharding(mesh, PartitionSpec())
        self._step = jax.jit(
            self._step_fn,
            static_argnames="sampling",
            out_shardings=(replicated, self.cache_shardings),
            donate_argnums=1,
        )

    def _step_fn(
        self, params: Any, cache: Any, tokens: jax.Array, key: jax.Array, sampling: Sampling
    ) -> tuple[jax.Array, Any]:
        logits, updated = self.model.apply({"params": params, CACHE: cache}, tokens, mutable=[CACHE])
        return choose(logits[:, -1], sampling, key), updated[CACHE]

    def step(
        self, params: Any, cache: Any, tokens: np.ndarray, key: jax.Array | None = None, sampling: Sampling = GREEDY
    ) -> tuple[jax.Array, Any]:
        """(the next token of each row, the cache with ``tokens`` appended); ``tokens`` is ``(rows, t)``."""
        placed = place(np.asarray(tokens, np.int32), self.token_sharding)
        key = jax.random.key(0) if key is None else key
        with sharding_context(self.mesh, self.rules):
            return self._step(params, cache, placed, key, sampling=sampling)

    def greedy(self, params: Any, prompt: Sequence[int], max_tokens: int, stop_id: int | None = None) -> list[int]:
        """The greedy continuation of ``prompt``: up to ``max_tokens`` tokens, ending early at ``stop_id``."""
        return self.decode(params, [prompt], max_tokens, stop_ids=() if stop_id is None else (stop_id,))[0]

    def decode(
        self,
        params: Any,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        *,
        stop_ids: Sequence[int] = (),
        sampling: Sampling = GREEDY,
        seed: int = 0,
    ) -> list[list[int]]:
        """The continuation of each prompt: up to ``max_tokens`` tokens, ending early at (and with) a ``stop_ids``
        token; chosen by ``sampling`` (greedy by default) with the random key of ``seed``."""
        rows = [[int(t) for t in p] for p in prompts]
        if not rows or not all(rows):
            raise ConfigError("a prompt has no tokens" if rows else "no prompts")
        longest = max(len(p) for p in rows)
        if longest + max_tokens > self.max_len:
            raise ConfigError(
                f"{longest} prompt tokens + {max_tokens} new ones exceed this decoder's {self.max_len} positions"
            )
        key = jax.random.key(seed)
        out: list[list[int]] = []
        for first in range(0, len(rows), self.rows):
            group = rows[first : first + self.rows]
            out += self._decode_rows(params, group, max_tokens, set(stop_ids), sampling, key)
        return out

    def _decode_rows(
        self,
        params: Any,
        prompts: list[list[int]],
        max_tokens: int,
        stops: set[int],
        sampling: Sampling,
        key: jax.Array,
    ) -> list[list[int]]:
        rows = prompts + [prompts[0]] * (self.rows - len(prompts))
        shortest = min(len(p) for p in rows)
        out: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        cache = self._zeros()
        # The common prefix in chunks of powers of two: any prompt length compiles at most log2(max_len) shapes.
        pos, size = 0, 1 << (shortest.bit_length() - 1)
        while pos < shortest:
            while pos + size > shortest:
                size //= 2
            chunk = np.asarray([p[pos : pos + size] for p in rows], np.int32)
            pos += size
            nxt, cache = self.step(params, cache, chunk, jax.random.fold_in(key, pos), sampling)
        while True:  # `nxt` holds each row's choice for position `pos`
            chosen = np.asarray(nxt.addressable_data(0))  # replicated: every process holds all rows
            feed = []
            for r, p in enumerate(rows):
                if pos < len(p):  # still in its prompt: the prompt's token, not the model's
                    feed.append(p[pos])
                    continue
                token = int(chosen[r])
                feed.append(token)
                if r < len(out) and not done[r]:
                    out[r].append(token)
                    done[r] = token in stops or len(out[r]) == max_tokens
            if all(done):
                return out
            pos += 1
            tokens = np.asarray(feed, np.int32)[:, None]
            nxt, cache = self.step(params, cache, tokens, jax.random.fold_in(key, pos), sampling)


def generate(
    model: Any,
    params: Any,
    prompt: Sequence[int] | Sequence[Sequence[int]],
    *,
    mesh: jax.sharding.Mesh,
    rules: Any,
    max_tokens: int = 32,
    stop_id: int | Sequence[int] | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    on_indivisible: str = "error",
) -> Any:
    """Decoding with a KV cache: the tokens that follow ``prompt`` (token ids), under ``mesh`` and ``rules``.

    ``params`` are the model's (sharded) params, e.g. from :func:`partitioning.hf.load_hf`
    or a restored checkpoint; decoding stops after ``max_tokens`` tokens or at a
    ``stop_id`` (one id or several, e.g. EOS and a chat model's end of turn; included).
    Greedy by default; ``temperature`` > 0 samples, filtered by ``top_k`` / ``top_p``
    as transformers does, drawn from the random key of ``seed`` (same seed, same tokens).
    ``prompt`` may be a list of prompts (lists of ids): they are decoded together as
    one batch and a list of continuations comes back. See :mod:`partitioning.decode.generate`.

    Example::

        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")
        >>> params = variables["params"]
        >>> pt.decode.generate(model, params, [1, 90, 3], mesh=mesh, rules="fsdp", max_tokens=6, stop_id=314)
        [253, 141, 314]
        >>> pt.decode.generate(model, params, [[1, 90, 3], [1, 272]], mesh=mesh, rules="fsdp", max_tokens=3)
        [[253, 141, 314], [89, 54, 54]]
    """
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}", arg="max_tokens")
    sampling = Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    batched = len(prompt) > 0 and not isinstance(prompt[0], (int, np.integer))
    prompts = cast(list[Sequence[int]], list(prompt) if batched else [prompt])
    stops = () if stop_id is None else (stop_id,) if isinstance(stop_id, (int, np.integer)) else tuple(stop_id)
    longest = max((len(p) for p in prompts), default=0)
    decoder = Decoder(
        model, mesh, rules, max_len=longest + max_tokens, batch=len(prompts), on_indivisible=on_indivisible
    )
    out = decoder.decode(unbox(params), prompts, max_tokens, stop_ids=stops, sampling=sampling, seed=seed)
    return out if batched else out[0]


__all__ = ["generate", "Decoder", "decoder_of", "batch_rows", "CACHE"]
