"""The sharded init and the jitted train / eval steps, built from the rules.

:class:`Trainer` takes a Flax module, an optax transformation, a mesh and a
rule table and

1. traces the init abstractly (``jax.eval_shape``), keeping the boxes that
   carry logical names on params *and* optimizer state (optax states built
   from boxed params keep the boxes);
2. turns those into ``NamedSharding`` s (:func:`tree_shardings`), the optimizer
   state through ``optimizer_rules`` when given (ZeRO-1: params replicated,
   optimizer state sharded);
3. jits the init with ``out_shardings`` so every array is born in its shard,
   and the step with ``in_shardings`` / ``out_shardings`` / ``donate_argnums``.

Tracing happens inside :func:`sharding_context`, so the model's
``with_logical_constraint`` calls resolve through the same rules.

Example::

    >>> trainer = Trainer(model, optax.adamw(1e-3), mesh, "fsdp", batch_size=32, seq_len=128)
    >>> state = trainer.init(jax.random.key(0))
    >>> state, metrics = trainer.train_step(state, batch)     # metrics stay on device
    >>> trainer.lower_train_step().compile().memory_analysis()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.boxes import unbox, with_logical_constraint
from partitioning.errors import ShardingError
from partitioning.layout import LeafLayout, tree_layouts, tree_shardings
from partitioning.mesh import sharding_context
from partitioning.resolve import axes_tuple
from partitioning.rules import as_rules
from partitioning.train.optimizer import current_lr
from partitioning.train.state import TrainState, strip_foreign_boxes
from partitioning.train.task import lm_loss


class Trainer:
    """Builds the sharded init and the jitted train / eval steps.

    Args:
      model: a Flax Linen module mapping int tokens ``(batch, length)`` to logits.
      tx: an optax transformation (``make_optimizer`` reports the learning rate).
      mesh: the device mesh; rules: a rule table, preset name or list of pairs.
      batch_size, seq_len: the global batch shape of one step.
      loss_fn: ``(logits, batch) -> (loss, aux)``; aux values become metrics.
      optimizer_rules: a separate table for the optimizer state (default: ``rules``).
      on_indivisible: ``'error'`` or ``'replicate'`` (see :meth:`Rules.resolve`).
      grad_accum: micro-batches per step; gradients are averaged over them.

    Example::

        >>> trainer = Trainer(model, tx, make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                   batch_size=32, seq_len=128, grad_accum=2)
        >>> state = trainer.init(jax.random.key(0))
    """

    def __init__(self, model: Any, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh, rules: Any,
                 *, batch_size: int, seq_len: int, loss_fn: Callable[..., Any] = lm_loss,
                 optimizer_rules: Any = None, on_indivisible: str = "error", grad_accum: int = 1):
        self.model, self.tx, self.mesh, self.loss_fn = model, tx, mesh, loss_fn
        self.rules = as_rules(rules).validate(mesh)
        self.optimizer_rules = as_rules(optimizer_rules).validate(mesh) if optimizer_rules is not None else self.rules
        self.on_indivisible = on_indivisible
        self.batch_size, self.seq_len, self.grad_accum = int(batch_size), int(seq_len), int(grad_accum)
        if self.grad_accum < 1 or self.batch_size % self.grad_accum:
            raise ShardingError(
                f"batch_size {batch_size} must be a positive multiple of grad_accum {grad_accum}", arg="grad_accum")
        self.micro_batch = self.batch_size // self.grad_accum
        self.batch_spec = self._batch_spec()
        self.batch_sharding = NamedSharding(mesh, self.batch_spec)
        self.abstract_state = self._abstract_state()
        replicated = NamedSharding(mesh, PartitionSpec())
        # Wrapped in {"params": ...} so error messages name `params/...` paths, as `check` does.
        self.state_shardings = TrainState(
            step=replicated,
            params=tree_shardings({"params": self.abstract_state.params}, mesh, self.rules,
                                  on_indivisible=on_indivisible)["params"],
            opt_state=tree_shardings({"opt_state": self.abstract_state.opt_state}, mesh, self.optimizer_rules,
                                     on_indivisible=on_indivisible)["opt_state"],
        )
        self.replicated = replicated
        batch_sh = {"inputs": self.batch_sharding, "targets": self.batch_sharding}
        # Two phases: params (random init, with its temporaries), then the optimizer
        # state from them. The RNG's scratch space never coexists with the
        # optimizer state, so the init's peak stays at about the final state.
        self._init_params_jit = jax.jit(self._init_params_fn, out_shardings=self.state_shardings.params)
        self._init_opt_jit = jax.jit(self._init_opt_fn, in_shardings=(self.state_shardings.params,),
                                     out_shardings=(replicated, self.state_shardings.opt_state))
        self._step_jit = jax.jit(self._step_fn, in_shardings=(self.state_shardings, batch_sh),
                                 out_shardings=(self.state_shardings, replicated), donate_argnums=0)
        self._eval_jit = jax.jit(self._eval_fn, in_shardings=(self.state_shardings.params, batch_sh),
                                 out_shardings=replicated)

    # -- shapes and shardings --------------------------------------------------
    def _batch_spec(self) -> PartitionSpec:
        spec = self.rules.batch_spec(2)
        axes = axes_tuple(spec[0])
        n = math.prod(self.mesh.shape[a] for a in axes)
        if self.micro_batch % n:
            what = (f"batch_size {self.batch_size}" if self.grad_accum == 1 else
                    f"micro-batch {self.micro_batch} (batch_size {self.batch_size} / grad_accum {self.grad_accum})")
            raise ShardingError(
                f"{what} is not divisible by the batch mesh axes {axes!r} of size {n}; "
                f"use a multiple of {n}", arg="batch_size")
        return spec

    def _dummy_tokens(self):
        return jax.ShapeDtypeStruct((self.micro_batch, self.seq_len), jnp.int32)

    def _boxed_init(self, rng):
        params = self._variables(rng)["params"]
        opt_state = strip_foreign_boxes(self.tx.init(params), params)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)

    def _abstract_state(self) -> TrainState:
        with sharding_context(self.mesh, self.rules):
            return jax.eval_shape(self._boxed_init, jax.random.key(0))

    def state_layouts(self) -> list[LeafLayout]:
        """One :class:`LeafLayout` per array of params and optimizer state (``params/...``, ``opt_state/...``)."""
        a, kw = self.abstract_state, {"on_indivisible": self.on_indivisible}
        return (tree_layouts({"params": a.params}, self.mesh, self.rules, **kw)
                + tree_layouts({"opt_state": a.opt_state}, self.mesh, self.optimizer_rules, **kw))

    def abstract_inputs(self) -> tuple[Any, dict[str, jax.ShapeDtypeStruct]]:
        """(state, batch) as ShapeDtypeStructs carrying their shardings; nothing allocated."""
        state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            unbox(self.abstract_state), self.state_shardings)
        tok = jax.ShapeDtypeStruct((self.batch_size, self.seq_len), jnp.int32, sharding=self.batch_sharding)
        return state, {"inputs": tok, "targets": tok}

    # -- traced functions --------------------------------------------------------
    def _variables(self, rng):
        # lazy_init keeps only the computations params depend on: compiling the
        # init then costs no forward pass. Modules whose params depend on input
        # values need a real forward (LazyInitError): fall back to init.
        try:
            return self.model.lazy_init(rng, self._dummy_tokens())
        except flax.errors.LazyInitError:
            return self.model.init(rng, jnp.zeros((self.micro_batch, self.seq_len), jnp.int32))

    def _init_params_fn(self, rng):
        return unbox(self._variables(rng)["params"])

    def _init_opt_fn(self, params):
        # Unboxed params give the unboxed optimizer state: the structure of state_shardings.opt_state.
        return jnp.zeros((), jnp.int32), self.tx.init(params)

    def _loss(self, params, batch):
        logits = self.model.apply({"params": params}, batch["inputs"])
        return self.loss_fn(logits, batch)

    def _grads(self, params, batch):
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)
        if self.grad_accum == 1:
            return grad_fn(params, batch)
        a, mb = self.grad_accum, self.micro_batch
        # Micro-batch j is rows j, j+a, j+2a, ...: every device already holds
        # its share of each micro-batch, so splitting moves no data.
        micro = jax.tree.map(
            lambda x: with_logical_constraint(x.reshape(mb, a, *x.shape[1:]).swapaxes(0, 1),
                                              (None, "batch") + (None,) * (x.ndim - 1)), batch)

        def body(acc, mbatch):
            (loss, aux), g = grad_fn(params, mbatch)
            return jax.tree.map(jnp.add, acc, ((loss, aux), g)), None

        zero = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro))
        zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero)
        total, _ = jax.lax.scan(body, zero, micro)
        return jax.tree.map(lambda x: x / a, total)

    def _step_fn(self, state: TrainState, batch):
        (loss, aux), grads = self._grads(state.params, batch)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
        lr = current_lr(opt_state)
        if lr is not None:
            metrics["lr"] = jnp.asarray(lr, jnp.float32)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _eval_fn(self, params, batch):
        loss, aux = self._loss(params, batch)
        return {"loss": loss, **aux}

    # -- public steps --------------------------------------------------------------
    def init(self, rng: jax.Array) -> TrainState:
        """A fresh TrainState, every array created directly in its shard."""
        with sharding_context(self.mesh, self.rules):
            params = self._init_params_jit(rng)
            step, opt_state = self._init_opt_jit(params)
        return TrainState(step=step, params=params, opt_state=opt_state)

    def train_step(self, state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer step (the input state is donated). Metrics are device scalars."""
        with sharding_context(self.mesh, self.rules):
            return self._step_jit(state, batch)

    def eval_step(self, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """Loss (and aux metrics) of ``params`` on ``batch``, as device scalars."""
        with sharding_context(self.mesh, self.rules):
            return self._eval_jit(params, batch)

    def lower_init(self) -> tuple[jax.stages.Lowered, jax.stages.Lowered]:
        """The two lowered init phases (params from the rng; optimizer state from the params).

        The init's peak per-device memory is the larger of the two compiled
        phases' ``argument + output + temp - alias`` bytes (:meth:`init_peak_bytes`).
        """
        state, _ = self.abstract_inputs()
        with sharding_context(self.mesh, self.rules):
            return (self._init_params_jit.lower(jax.random.key(0)),
                    self._init_opt_jit.lower(state.params))

    def init_peak_bytes(self) -> int:
        """Peak per-device bytes of the compiled init (compiles it; allocates nothing)."""
        first, second = (lowered.compile().memory_analysis() for lowered in self.lower_init())
        params = sum(l.per_device_bytes for l in self.state_layouts() if l.path.startswith("params/"))
        phase1 = (first.argument_size_in_bytes + first.output_size_in_bytes + first.temp_size_in_bytes
                  - first.alias_size_in_bytes)
        # The params stay alive through phase 2 whether or not it reads them
        # (jit drops unused arguments, e.g. for adam's zeros_like).
        phase2 = max(params, second.argument_size_in_bytes) + second.output_size_in_bytes + second.temp_size_in_bytes
        return max(phase1, phase2)

    def lower_train_step(self) -> jax.stages.Lowered:
        """The lowered train step from abstract inputs (nothing allocated).

        Example::

            >>> compiled = trainer.lower_train_step().compile()
            >>> compiled.memory_analysis().temp_size_in_bytes, len(compiled.as_text())
        """
        with sharding_context(self.mesh, self.rules):
            return self._step_jit.lower(*self.abstract_inputs())

    def lower_eval_step(self) -> jax.stages.Lowered:
        state, batch = self.abstract_inputs()
        with sharding_context(self.mesh, self.rules):
            return self._eval_jit.lower(state.params, batch)

    @functools.cached_property
    def num_params(self) -> int:
        return sum(l.size for l in tree_layouts(self.abstract_state.params, self.mesh, self.rules,
                                                on_indivisible=self.on_indivisible))


__all__ = ["Trainer"]
