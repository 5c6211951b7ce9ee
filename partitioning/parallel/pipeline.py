"""Pipeline parallelism chosen by the mesh: a stack of layers that runs as a pipeline (GPipe, circular) over ``stage``.

A model opts in once, where it stacks its repeated block:

- Linen: :class:`LayerStack` ``(block, length, block_kwargs)`` in place of
  ``nn.scan(block, variable_axes={"params": 0}, length=…, metadata_params=
  {nn.PARTITION_NAME: "layers"})``: the same parameters (one tree, every leaf
  with a leading ``layers`` axis), the same init;
- NNX: :func:`scan_layers` ``(blocks, x)`` in place of ``jax.lax.scan`` over a
  module built with ``nnx.vmap(…, transform_metadata={nnx.PARTITION_NAME:
  "layers"})``.

Whether it pipelines is the layout's business, not the model's: when the
mesh in context has a ``stage`` axis of size ``S > 1`` (and the rules put
``layers`` on it, presets ``pp`` / ``pp_fsdp``), the stack runs the pipeline
schedule of :mod:`partitioning.parallel.schedule` with ``M`` micro-batches and
``R`` repeats (:func:`microbatching`; ``Trainer(microbatches=M,
pipeline_repeats=R)`` / ``train.microbatches``, ``train.pipeline_repeats`` set
them, default ``S`` and 1: GPipe; ``R > 1`` is the circular schedule, each
stage holding ``R`` non-adjacent chunks of layers); otherwise it is a plain
scan. Either way the layers axis is the same array, so a checkpoint moves
between pipelined and unpipelined layouts unchanged.

Example::

    >>> class Block(nn.Module):                      # nn.scan's convention: (x, *args) -> (x, y)
    ...     dim: int
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         init = pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    ...         return x + jnp.tanh(x @ self.param("w", init, (self.dim, self.dim))), None
    >>> class Stack(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         return pt.parallel.LayerStack(Block, length=8, block_kwargs={"dim": 64}, name="blocks")(x)[0]
    >>> x, mesh = jnp.ones((16, 64)), pt.make_mesh({"stage": 4, "data": 2})
    >>> params = Stack().init(jax.random.key(0), x)
    >>> pt.logical_names(params)["params"]["blocks"]["w"]         # the stack's leading axis is `layers`
    ('layers', 'embed', 'mlp')
    >>> with pt.sharding_context(mesh, "pp"), pt.parallel.microbatching(8):
    ...     y = jax.jit(Stack().apply)(params, x)                   # 4 stages x 8 micro-batches
    >>> y.shape
    (16, 64)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import unbox
from partitioning.context import get_logical_axis_rules
from partitioning.model.interface import SOWN_LOSSES
from partitioning.model.task import sown_losses
from partitioning.parallel.checks import PipelineError, check_layers, check_microbatches, layers_sizes, pipeline_stages
from partitioning.parallel.schedule import gpipe
from partitioning.parallel.trace import record

# Collections a scanned block may write: sown losses (MoE load balancing) are stacked per layer.
SCANNED: dict[Any, Any] = {"params": 0, "losses": 0, "cache": 0}  # nn.scan's variable_axes; cache: decoding
_local = threading.local()


@contextlib.contextmanager
def microbatching(microbatches: int | None, repeats: int = 1) -> Iterator[None]:
    """Sets the pipeline micro-batches (None: ``S``) and repeats (circular schedule) for stacks traced in this thread.

    Example::

        >>> from partitioning.models import GPT
        >>> model, tokens = GPT(embed=64, mlp=128, layers=4), jnp.zeros((8, 16), jnp.int32)
        >>> params = model.init(jax.random.key(0), tokens)
        >>> with pt.sharding_context(pt.make_mesh({"stage": 4, "data": 2}), "pp"), pt.parallel.microbatching(4):
        ...     logits = jax.jit(model.apply)(params, tokens)
        >>> logits.shape
        (8, 16, 256)
        >>> model8 = GPT(embed=64, mlp=128, layers=8)        # circular: each stage holds 2 chunks of layers
        >>> params8 = model8.init(jax.random.key(0), tokens)
        >>> mesh = pt.make_mesh({"stage": 4, "data": 2})
        >>> with pt.sharding_context(mesh, "pp"), pt.parallel.microbatching(4, repeats=2):
        ...     logits = jax.jit(model8.apply)(params8, tokens)
        >>> logits.shape
        (8, 16, 256)
    """
    old = getattr(_local, "microbatches", None), getattr(_local, "repeats", 1)
    _local.microbatches, _local.repeats = microbatches, int(repeats or 1)
    try:
        yield
    finally:
        _local.microbatches, _local.repeats = old


def current_microbatches(stages: int) -> int:
    """``M`` for a stack traced now: the :func:`microbatching` value, else ``stages``."""
    m = getattr(_local, "microbatches", None)
    return int(m) if m else int(stages)


def current_repeats() -> int:
    """``R`` for a stack traced now: the :func:`microbatching` value, else 1 (GPipe)."""
    return int(getattr(_local, "repeats", 1) or 1)


def _check_traced(stages: int, n_layers: int, batch: int, m: int, repeats: int) -> None:
    """The Trainer's checks, for a stack applied directly under a stage mesh."""
    check_layers([n_layers], stages, repeats)
    check_microbatches(
        jax.sharding.get_abstract_mesh(), get_logical_axis_rules(), m, batch, f"a batch of {batch}", repeats
    )


def _record_stack(
    n_layers: int, stages: int, microbatches: int, x: jax.Array, repeats: int = 1, layers: Any = None
) -> None:
    """For plan's analytic costs (:mod:`partitioning.parallel.trace`): the stack's shape, once per trace."""
    rules = get_logical_axis_rules()
    record(
        "pipeline",
        layers=int(n_layers),
        stages=int(stages),
        microbatches=int(microbatches),
        repeats=int(repeats),
        param_bytes=sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(layers)) if layers is not None else 0,
        shape=tuple(x.shape),
        dtype=str(x.dtype),
        batch_axes=tuple(rules.batch_axes) if rules else (),
    )


def _batched(args: tuple, batch: int) -> tuple[list[int], list[int]]:
    """Positions of the args with the batch's leading dimension (micro-batched) and the rest (broadcast)."""
    per_example = [i for i, a in enumerate(args) if getattr(a, "ndim", 0) and a.shape[0] == batch]
    return per_example, [i for i in range(len(args)) if i not in per_example]


def run_stack(layer_fn: Any, layers: Any, x: jax.Array, args: tuple = ()) -> tuple[jax.Array, dict]:
    """``layer_fn`` over stacked ``layers``: pipelined when the mesh has a ``stage`` axis, else a scan.

    ``layer_fn(layer, x, args, layer_index, micro_index) -> (x, aux)``. Arrays in
    ``args`` with ``x``'s batch dimension are micro-batched; others are passed
    to every layer unchanged.
    """
    n_layers = jax.tree.leaves(layers)[0].shape[0]
    s = pipeline_stages()
    m = current_microbatches(s) if s > 1 else 1
    r = current_repeats() if s > 1 else 1
    rules = get_logical_axis_rules()
    _record_stack(n_layers, s, m, x, r, layers)
    if s <= 1:

        def body(carry, kl):
            h, aux = carry
            layer, i = kl
            h, new = layer_fn(layer, h, args, i, jnp.zeros((), jnp.int32))
            return (h, {k: aux.get(k, 0) + v for k, v in dict(new).items()}), None

        first = jax.tree.map(lambda a: a[0], layers)
        zero = jnp.zeros((), jnp.int32)
        _, shapes = jax.eval_shape(lambda lp, h: layer_fn(lp, h, args, zero, zero), first, x)
        aux0 = {k: jnp.zeros((), v.dtype) for k, v in dict(shapes).items()}
        (x, aux), _ = jax.lax.scan(body, (x, aux0), (layers, jnp.arange(n_layers, dtype=jnp.int32)))
        return x, aux
    _check_traced(s, n_layers, x.shape[0], m, r)
    per_example, shared = _batched(args, x.shape[0])

    def staged_fn(layer, h, mb_args, i, j):
        full = list(args)
        for pos, a in zip(per_example, mb_args, strict=True):
            full[pos] = a
        return layer_fn(layer, h, tuple(full), i, j)

    return gpipe(
        staged_fn,
        layers,
        x,
        [args[i] for i in per_example],
        stages=s,
        microbatches=m,
        repeats=r,
        batch_axes=rules.batch_axes if rules else None,
    )


class LayerStack(nn.Module):
    """``length`` copies of a Linen ``block`` with stacked params (a leading ``layers`` axis); GPipe over ``stage``.

    Unpipelined it *is* ``nn.scan(block, variable_axes={"params": 0, "losses": 0},
    split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast, length=length,
    metadata_params={nn.PARTITION_NAME: "layers"})`` sharing this module's scope, so params sit at
    ``<name>/<block's own params>`` exactly as with ``nn.scan``. ``block`` follows ``nn.scan``'s
    convention: ``__call__(self, x, *args) -> (x, y)`` (``y`` is dropped). Under a mesh with a
    ``stage`` axis (size > 1) it runs the pipeline schedule instead; per-example ``args`` (leading
    batch dim) are micro-batched, the rest broadcast; RNG streams (``rng_streams``) are folded
    per layer and micro-batch; scalars the block sows into ``losses`` are summed over layers and
    averaged over micro-batches. Other mutable collections are not supported while pipelined.

    Example::

        >>> class Block(nn.Module):                      # nn.scan's convention: (x, *args) -> (x, y)
        ...     dim: int
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         init = pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
        ...         return x + jnp.tanh(x @ self.param("w", init, (self.dim, self.dim))), None
        >>> class Stack(nn.Module):
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         return pt.parallel.LayerStack(Block, length=8, block_kwargs={"dim": 64}, name="blocks")(x)[0]
        >>> Stack().init(jax.random.key(0), jnp.ones((16, 64)))["params"]["blocks"]["w"].names
        ('layers', 'embed', 'mlp')
    """

    block: Any
    length: int
    block_kwargs: Mapping[str, Any] | None = None
    rng_streams: Sequence[str] = ("dropout",)
    # Per-layer data (a tuple of `length` scalars, e.g. which layers are local): each block is
    # called with its own entry as the keyword `layer`, carried through the scan as data.
    layer_data: tuple | None = None

    def setup(self):
        scanned = nn.scan(
            self.block if self.layer_data is None else _with_layer_data(self.block),
            variable_axes=dict(SCANNED),
            split_rngs={"params": True, **{r: True for r in self.rng_streams}},
            in_axes=nn.broadcast if self.layer_data is None else (0, nn.broadcast),
            length=self.length,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        self.scanned = scanned(**dict(self.block_kwargs or {}))
        nn.share_scope(self, self.scanned)

    def __call__(self, x, *args):
        if pipeline_stages() <= 1 or self.is_initializing():
            if not self.is_initializing():
                _record_stack(self.length, 1, 1, x)
            if self.layer_data is not None:
                return self.scanned(x, jnp.asarray(self.layer_data), args)
            return self.scanned(x, *args)
        params = unbox(self.variables["params"])
        base = {r: self.make_rng(r) for r in self.rng_streams if self.has_rng(r)}
        block = self.block(**dict(self.block_kwargs or {}), parent=None)

        data = {} if self.layer_data is None else {"layer": jnp.asarray(self.layer_data)}

        def layer_fn(layer, h, layer_args, i, j):
            rngs = {r: jax.random.fold_in(jax.random.fold_in(k, i), j) for r, k in base.items()}
            kw = {k: v[i] for k, v in data.items()}
            (h, _), sown = block.apply({"params": layer}, h, *layer_args, **kw, rngs=rngs, mutable=["losses"])
            return h, sown_losses(sown.get(SOWN_LOSSES, {}))

        y, aux = run_stack(layer_fn, params, x, args)
        for name, value in aux.items():
            self.sow("losses", name, value)
        return y, None


def _with_layer_data(block: Any) -> Any:
    """``block`` called as ``(x, layer, args)`` (scan's per-layer input, then the broadcast ones)."""

    class WithLayerData(block):
        def __call__(self, x, layer, args):
            return super().__call__(x, *args, layer=layer)

    return WithLayerData


def scan_layers(blocks: Any, x: jax.Array, *args: Any) -> jax.Array:
    """Applies a stacked NNX module (``nnx.vmap``-built, leading ``layers`` axis) layer by layer; pipelined over stages.

    Replaces ``jax.lax.scan(lambda x, b: (b(x, *args), None), x, blocks)[0]``; a
    block returns ``x`` (or ``(x, y)``, ``y`` dropped). While pipelined, the
    blocks' own state updates (RNG counters, batch statistics) are not kept.

    Example::

        >>> from flax import nnx
        >>> class Stack(nnx.Module):
        ...     def __init__(self, rngs):
        ...         @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        ...         def blocks(key):
        ...             return nnx.Linear(64, 64, rngs=nnx.Rngs(key))
        ...         self.blocks = blocks(jax.random.split(rngs.params(), 4))
        ...     def __call__(self, x):
        ...         return pt.parallel.scan_layers(self.blocks, x)     # GPipe when the mesh has a `stage` axis
        >>> Stack(nnx.Rngs(0))(jnp.ones((8, 64))).shape
        (8, 64)
    """

    def layer_fn(block, h, layer_args, i, j):
        out = block(h, *layer_args)
        return (out[0] if isinstance(out, tuple) else out), {}

    return run_stack(layer_fn, blocks, x, tuple(args))[0]


__all__ = [
    "LayerStack",
    "scan_layers",
    "microbatching",
    "pipeline_stages",
    "current_microbatches",
    "current_repeats",
    "check_microbatches",
    "check_layers",
    "layers_sizes",
    "run_stack",
    "PipelineError",
    "SCANNED",
]
