"""Greedy decoding with a KV cache, on a mesh under a rule table.

A model that can decode has a ``decode`` attribute (Flax's decode pattern, as
the reference decoder :class:`partitioning.models.GPT` has): cloned with
``decode=True`` its attention layers keep each layer's keys and values in a
``cache`` collection — stacked with the layers when they are scanned — and
every call appends the new positions to it. The cache is created directly in
its shards (its logical names ``(batch, length, kv_heads, kv)`` go through the
same rules as everything else); the prompt is run once (prefill), then one
token per step, each step a jitted call that updates the cache in place
(donated).

One prompt is decoded, repeated over the batch shards (the rules' batch axes)
so every layout applies as it does in training; all rows are identical.

Example::

    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> model, variables = pt.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")   # a tiny random-weight Llama
    >>> pt.generate(model, variables["params"], [1, 272, 203], mesh=mesh, rules="fsdp", max_tokens=4)
    [174, 174, 174, 174]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.boxes import unbox
from partitioning.errors import ConfigError
from partitioning.layout import tree_shardings
from partitioning.mesh import sharding_context
from partitioning.parallel.pipeline import pipeline_stages
from partitioning.rules import as_rules
from partitioning.train.batch import place

CACHE = "cache"


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

    Example::

        >>> from partitioning.train.generate import Decoder
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
        >>> model, variables = pt.load_hf("tests/fixtures/hf/llama", mesh, "fsdp_tp")
        >>> dec = Decoder(model, mesh, "fsdp_tp", max_len=16)
        >>> dec.rows, dec.cache_shardings["blocks"]["attn"]["cached_key"].spec   # (layers, batch, length, kv_heads, kv)
        (4, P(None, ('data', 'fsdp'), None, 'tensor', None))
        >>> dec.greedy(variables["params"], [1, 272, 203], max_tokens=4)
        [174, 174, 174, 174]
        >>> dec.greedy(variables["params"], [1, 90, 3], max_tokens=8)    # same prompt length: no new compile
        [253, 141, 314, 149, 32, 89, 212, 130]
    """

    def __init__(self, model: Any, mesh: jax.sharding.Mesh, rules: Any, *, max_len: int, on_indivisible: str = "error"):
        self.model, self.mesh, self.rules = decoder_of(model, mesh), mesh, as_rules(rules).validate(mesh)
        self.rows, self.max_len = batch_rows(mesh, self.rules), int(max_len)
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
        self._step = jax.jit(self._step_fn, out_shardings=(replicated, self.cache_shardings), donate_argnums=1)

    def _step_fn(self, params: Any, cache: Any, tokens: jax.Array) -> tuple[jax.Array, Any]:
        logits, updated = self.model.apply({"params": params, CACHE: cache}, tokens, mutable=[CACHE])
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), updated[CACHE]

    def step(self, params: Any, cache: Any, tokens: np.ndarray) -> tuple[jax.Array, Any]:
        """(the greedy next token of each row, the cache with ``tokens`` appended); ``tokens`` is ``(rows, t)``."""
        placed = place(np.asarray(tokens, np.int32), self.token_sharding)
        with sharding_context(self.mesh, self.rules):
            return self._step(params, cache, placed)

    def greedy(self, params: Any, prompt: Sequence[int], max_tokens: int, stop_id: int | None = None) -> list[int]:
        """The greedy continuation of ``prompt``: up to ``max_tokens`` tokens, ending early at ``stop_id``."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ConfigError("the prompt has no tokens")
        if len(prompt) + max_tokens > self.max_len:
            raise ConfigError(
                f"{len(prompt)} prompt tokens + {max_tokens} new ones exceed this decoder's {self.max_len} positions"
            )
        cache = self._zeros()
        out: list[int] = []
        tokens = np.tile(np.asarray(prompt, np.int32), (self.rows, 1))
        for _ in range(max_tokens):
            nxt, cache = self.step(params, cache, tokens)
            token = int(np.asarray(nxt.addressable_data(0))[0])
            out.append(token)
            if token == stop_id:
                break
            tokens = np.full((self.rows, 1), token, np.int32)
        return out


def generate(
    model: Any,
    params: Any,
    prompt: Sequence[int],
    *,
    mesh: jax.sharding.Mesh,
    rules: Any,
    max_tokens: int = 32,
    stop_id: int | None = None,
    on_indivisible: str = "error",
) -> list[int]:
    """Greedy decoding with a KV cache: the tokens that follow ``prompt`` (token ids), under ``mesh`` and ``rules``.

    ``params`` are the model's (sharded) params, e.g. from :func:`partitioning.load_hf`
    or a restored checkpoint; decoding stops after ``max_tokens`` tokens or at
    ``stop_id`` (included). See :mod:`partitioning.train.generate`.

    Example::

        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> model, variables = pt.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")
        >>> pt.generate(model, variables["params"], [1, 90, 3], mesh=mesh, rules="fsdp", max_tokens=6, stop_id=314)
        [253, 141, 314]
    """
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}", arg="max_tokens")
    decoder = Decoder(model, mesh, rules, max_len=len(prompt) + max_tokens, on_indivisible=on_indivisible)
    return decoder.greedy(unbox(params), prompt, max_tokens, stop_id)


__all__ = ["generate", "Decoder", "decoder_of", "batch_rows", "CACHE"]
