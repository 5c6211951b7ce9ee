"""What a :class:`~partitioning.train.step.Trainer` shows without running: layouts, lowered and compiled steps.

The abstract inputs (state and batch as ``ShapeDtypeStruct`` s carrying their
shardings), the per-array layouts, the lowered init / train / eval steps, the
init's peak memory and the step's FLOPs — all from ``eval_shape`` and
``lower``, nothing allocated. A mixin of :class:`Trainer`, which supplies the
jitted functions and shardings.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> compiled = trainer.lower_train_step().compile()    # nothing allocated
    >>> trainer.num_params, trainer.init_peak_bytes() >= 3 * 4 * trainer.num_params // 8   # params + adam moments
    (98304, True)
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from partitioning.boxes import unbox
from partitioning.finetune.quantize import weight_counts
from partitioning.layout import LeafLayout, tree_layouts
from partitioning.mesh import sharding_context
from partitioning.plan.compiled import memory_stats


class Lowering:
    """Layouts, lowered steps, init peak and FLOPs of a Trainer (see the module docstring)."""

    mesh: Any
    rules: Any
    optimizer_rules: Any
    on_indivisible: str
    abstract_state: Any
    abstract_batch: Any
    state_shardings: Any
    batch_shardings: Any
    _init_params_jit: Any
    _init_opt_jit: Any
    _step_jit: Any
    _eval_jit: Any
    subset: Any
    offload: Any

    def state_layouts(self) -> list[LeafLayout]:
        """One :class:`LeafLayout` per array of params, optimizer state and collections."""
        a = self.abstract_state
        kw: dict[str, Any] = {"on_indivisible": self.on_indivisible, "warn_replicated": False}
        return (
            tree_layouts({"params": a.params}, self.mesh, self.rules, **kw)
            + tree_layouts({"opt_state": a.opt_state}, self.mesh, self.optimizer_rules, **kw)
            + tree_layouts({"collections": a.collections}, self.mesh, self.rules, **kw)
        )

    def abstract_inputs(self) -> tuple[Any, Any]:
        """(state, batch) as ShapeDtypeStructs carrying their shardings; nothing allocated."""
        state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            unbox(self.abstract_state),
            self.state_shardings,
        )
        batch = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract_batch, self.batch_shardings
        )
        return state, batch

    def lower_init(self) -> tuple[jax.stages.Lowered, jax.stages.Lowered]:
        """The two lowered init phases (params from the rng; optimizer state from the params).

        The init's peak per-device memory is the larger of the two compiled
        phases' ``argument + output + temp - alias`` bytes (:meth:`init_peak_bytes`).
        """
        state, _ = self.abstract_inputs()
        with sharding_context(self.mesh, self.rules):
            return (self._init_params_jit.lower(jax.random.key(0)), self._init_opt_jit.lower(state.params))

    def init_peak_bytes(self) -> int:
        """Peak per-device bytes of the compiled init (compiles it; allocates nothing)."""
        first, second = (memory_stats(lowered.compile()) for lowered in self.lower_init())
        if first is None or second is None:
            raise NotImplementedError(f"the {jax.default_backend()} backend reports no memory analysis")
        # Device bytes only: offloaded params are in host memory (the phases' figures split them off too).
        on_device = not self.offload.params
        params = sum(leaf.per_device_bytes for leaf in self.state_layouts() if leaf.path.startswith("params/"))
        params *= on_device
        phase1 = first["peak_estimate"]
        # The params stay alive through phase 2 whether or not it reads them
        # (jit drops unused arguments, e.g. for adam's zeros_like).
        phase2 = max(params, second["argument"]) + second["output"] + second["temp"]
        return max(phase1, phase2)

    def lower_train_step(self) -> jax.stages.Lowered:
        """The lowered train step from abstract inputs (nothing allocated).

        Example::

            >>> import optax
            >>> from partitioning.models import MLP
            >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
            ...                      batch_size=8, seq_len=16)
            >>> compiled = trainer.lower_train_step().compile()
            >>> compiled.memory_analysis().temp_size_in_bytes > 0, "all-gather" in compiled.as_text()
            (True, True)
        """
        with sharding_context(self.mesh, self.rules):
            return self._step_jit.lower(*self.abstract_inputs())

    def step_flops(self) -> float | None:
        """FLOPs one device does in one train step: the compiled step's cost analysis, loop trips counted.

        Compiles the step (the same executable the first ``train_step`` then
        uses). See :mod:`partitioning.plan.flops`.

        Example::

            >>> import optax
            >>> from partitioning.models import MLP
            >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
            ...                      batch_size=8, seq_len=16)
            >>> flops = trainer.step_flops() * trainer.mesh.size    # all devices, one step
            >>> flops > 0
            True
        """
        from partitioning.plan.flops import step_flops

        return step_flops(self.lower_train_step().compile())

    def lower_eval_step(self) -> jax.stages.Lowered:
        state, batch = self.abstract_inputs()
        with sharding_context(self.mesh, self.rules):
            return self._eval_jit.lower(state.params, state.collections, batch)

    @property
    def frozen(self) -> frozenset[str]:
        """The paths of the frozen params (no gradient, no optimizer state); empty when all train."""
        return self.subset.frozen

    @functools.cached_property
    def num_params(self) -> int:
        """The model's weights (a quantized base counts the float weights its codes stand for, as ``plan``)."""
        leaves = tree_layouts(
            self.abstract_state.params, self.mesh, self.rules, on_indivisible=self.on_indivisible, warn_replicated=False
        )
        return sum(weight_counts(leaves).values())


__all__ = ["Lowering"]
