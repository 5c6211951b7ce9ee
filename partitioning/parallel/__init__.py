"""Parallelism over the layers, the experts and the sequence: the ``stage``, ``expert`` and ``context`` mesh axes.

Each is chosen like every other layout — a mesh axis plus rules — and the
model only marks where its layers stack, where its experts sit and where it attends:

- :mod:`~partitioning.parallel.schedule` — ``gpipe``: the GPipe / circular schedule as a pure function (vmap over
  stages with ``spmd_axis_name="stage"``, a collective-permute shift), and ``bubble_fraction``.
- :mod:`~partitioning.parallel.pipeline` — ``LayerStack`` (Linen) and ``scan_layers`` (NNX): a stack of layers
  that is a scan, or a pipeline when the mesh has a ``stage`` axis; ``microbatching``.
- :mod:`~partitioning.parallel.checks` — the up-front checks of a pipeline layout (stages, layers, micro-batches,
  rules), shared by the Trainer, ``check`` and ``plan``; ``PipelineError``.
- :mod:`~partitioning.parallel.experts` — mixture-of-experts routing (top-k, load-balancing loss), capacity,
  dispatch / combine; the dispatched tokens' layout is the rules' (``expert`` axis: all-to-all).
- :mod:`~partitioning.parallel.context` — attention over a sequence split across the ``context`` axis:
  all-gathered or a ring of key/value blocks, exact, and the load-balanced causal order (``balance``).
- :mod:`~partitioning.parallel.ring` — the masks by position, one masked block, the ring and its backward pass.
- :mod:`~partitioning.parallel.trace` — records of the stacks (and expert layers) a forward pass traced,
  for the plan's analytic costs.

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
    >>> params = Stack().init(jax.random.key(0), jnp.ones((16, 64)))
    >>> params["params"]["blocks"]["w"].value.shape   # one tree, a leading `layers` axis: a scan or a pipeline
    (8, 64, 64)
"""

from partitioning.parallel.context import balance, context_attention, context_axes
from partitioning.parallel.experts import clamped_swiglu, expert_capacity, group_route, moe_ffn
from partitioning.parallel.pipeline import (
    LayerStack,
    PipelineError,
    check_layers,
    check_microbatches,
    layers_sizes,
    microbatching,
    pipeline_stages,
    scan_layers,
)
from partitioning.parallel.schedule import bubble_fraction, gpipe

__all__ = [
    "LayerStack",
    "scan_layers",
    "microbatching",
    "pipeline_stages",
    "check_microbatches",
    "check_layers",
    "layers_sizes",
    "PipelineError",
    "gpipe",
    "bubble_fraction",
    "moe_ffn",
    "expert_capacity",
    "context_attention",
    "context_axes",
    "balance",
    "clamped_swiglu",
    "group_route",
]
