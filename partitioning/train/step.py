"""The sharded init and the jitted train / eval steps, built from the rules.

:class:`Trainer` takes a model (Flax Linen, Flax NNX or plain functions; see
:mod:`partitioning.model.interface`), an optax transformation, a mesh and a rule
table, and

1. traces the init abstractly (``jax.eval_shape``), keeping the boxes that
   carry logical names on params, mutable collections *and* optimizer state
   (optax states built from boxed params keep the boxes);
2. turns those into ``NamedSharding`` s (:func:`tree_shardings`), the optimizer
   state through ``optimizer_rules`` when given (ZeRO-1: params replicated,
   optimizer state sharded);
3. jits the init with ``out_shardings`` so every array is born in its shard,
   and the step with ``in_shardings`` / ``out_shardings`` / ``donate_argnums``.

Tracing happens inside :func:`sharding_context`, so the model's constraints —
the toolkit's or Flax's own — resolve through the same rules. What the model
is trained to do is a :class:`~partitioning.model.task.Task`; RNG streams the
model asks for (``dropout``, ...) are derived from ``seed`` and the step.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> state = trainer.init(jax.random.key(0))
    >>> batch = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding).batch_at(0)
    >>> state, metrics = trainer.train_step(state, batch)     # metrics stay on device
    >>> int(state.step), sorted(metrics)[:3]
    (1, ['accuracy', 'grad_norm', 'loss'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.boxes import unbox
from partitioning.data.batch import batch_shapes, batch_size_of, batch_specs, micro_batches, place, stream_keys
from partitioning.errors import ShardingError
from partitioning.finetune.trainable import subset_of
from partitioning.layout import tree_shardings
from partitioning.mesh import sharding_context
from partitioning.model.annotated import annotated_model
from partitioning.model.interface import SOWN_LOSSES
from partitioning.model.task import as_task, model_inputs, sown_losses
from partitioning.parallel.pipeline import (
    check_layers,
    check_microbatches,
    layers_sizes,
    microbatching,
    pipeline_stages,
)
from partitioning.rules import as_rules
from partitioning.train.init import Init
from partitioning.train.lowering import Lowering
from partitioning.train.nonfinite import FLAG, check_policy, keep_if_finite, nonfinite_flag
from partitioning.train.offload import Offload, apply_update, check_host_update, device_lr, to_device
from partitioning.train.optimizer import current_lr
from partitioning.train.state import TrainState, strip_foreign_boxes


class Trainer(Lowering, Init):
    """Builds the sharded init and the jitted train / eval steps.

    Args:
      model: a Flax Linen module, a Flax NNX module (or ``NNXModel(factory)`` for a
        sharded init), or ``FunctionModel(init, apply)`` (see :func:`as_model`).
      tx: an optax transformation (``make_optimizer`` reports the learning rate).
      mesh: the device mesh.
      rules: a rule table, preset name or list of pairs.
      batch_size: with ``seq_len``, the language-model shorthand for the global batch
        (``{"inputs", "targets"}``, int32 ``(batch_size, seq_len)``); or ``batch``.
      seq_len: see ``batch_size`` (a ``batch`` with integer 2-D ``inputs`` gives it too).
      batch: any pytree of arrays / ``ShapeDtypeStruct`` s: one global batch.
      batch_names: optional logical names per batch leaf (default: dim 0 over
        the rules' batch axes).
      task: ``"next_token"`` (default), ``"same_token"``, ``"classification"``, a
        loss function ``(outputs, batch)``, or a :class:`Task`. ``loss_fn`` is the
        same as a loss function task.
      rng_streams: the RNG streams handed to the model (default ``("dropout",)``),
        derived from ``seed`` and the step.
      optimizer_rules: a separate table for the optimizer state (default: ``rules``).
      on_indivisible: ``'error'`` or ``'replicate'`` (see :meth:`Rules.resolve`).
      grad_accum: micro-batches per step; gradients are averaged over them.
      microbatches: pipeline micro-batches (per grad_accum micro-batch) when the mesh has a
        ``stage`` axis (default: its size); see :mod:`partitioning.parallel.pipeline`.
      on_nonfinite: ``"stop"`` (:func:`fit` stops at a NaN / infinite loss or gradient norm)
        or ``"skip_step"`` (such a step's update is dropped on device and counted);
        see :mod:`partitioning.train.nonfinite`. The metric ``nonfinite`` flags such steps.
      pipeline_repeats: chunks of layers each pipeline stage holds (1: GPipe; more: the circular
        schedule, bubble ``(S-1)/(R M+S-1)``, needs ``microbatches >= S``).
      trainable: regexes (``re.search``) over the param paths; the others are frozen: no gradient, no
        optimizer state (``trainer.frozen``, :mod:`partitioning.finetune.trainable`). Default: all, or the
        LoRA adapters (``_lora_[ab]$``) when the model has some.
      annotations: an :class:`~partitioning.Annotations` (or its rows) naming the model's
        variables by path; the optimizer state mirrors the names (:mod:`partitioning.annotations`).
      offload: ``("optimizer",)``, ``("params",)`` or both: that state keeps its layout but lives in
        ``pinned_host`` memory between steps (:mod:`partitioning.train.offload`).
      offload_update: where the update of an offloaded optimizer state runs: ``"device"`` (moved there
        for it) or ``"host"`` (``compute_on``).

    Scalars the model sows into its ``losses`` collection (an MoE load-balancing
    loss) are added to the objective and reported as metrics under their names;
    the ``loss`` metric stays the task's loss.

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), mesh, "fsdp", batch_size=32, seq_len=128, grad_accum=2)
        >>> trainer.micro_batch
        16
        >>> images, labels = jnp.zeros((16, 8, 8, 1)), jnp.zeros((16,), jnp.int32)
        >>> classifier = nn.Sequential([lambda x: x.reshape(x.shape[0], -1), nn.Dense(10)])
        >>> trainer = pt.Trainer(classifier, optax.sgd(0.1), mesh, "fsdp",
        ...                      batch={"inputs": images, "targets": labels}, task="classification")
        >>> state = trainer.init(jax.random.key(0))
    """

    def __init__(
        self,
        model: Any,
        tx: optax.GradientTransformation,
        mesh: jax.sharding.Mesh,
        rules: Any,
        *,
        batch_size: int | None = None,
        seq_len: int | None = None,
        batch: Any = None,
        batch_names: Any = None,
        task: Any = None,
        loss_fn: Callable[..., Any] | None = None,
        rng_streams: Sequence[str] = ("dropout",),
        seed: int = 0,
        optimizer_rules: Any = None,
        on_indivisible: str = "error",
        grad_accum: int = 1,
        microbatches: int | None = None,
        on_nonfinite: str = "stop",
        pipeline_repeats: int = 1,
        trainable: Sequence[str] | str | None = None,
        annotations: Any = None,
        offload: Sequence[str] = (),
        offload_update: str = "device",
    ):
        self.model, self.tx, self.mesh, self._trainable_arg = annotated_model(model, annotations), tx, mesh, trainable
        self.on_nonfinite = check_policy(on_nonfinite)
        self.offload = Offload.of(offload, offload_update)
        self.offload.check_backend(mesh)
        self.task = as_task(task if task is not None else loss_fn)
        self.rules = as_rules(rules).validate(mesh)
        self.optimizer_rules = as_rules(optimizer_rules).validate(mesh) if optimizer_rules is not None else self.rules
        self.on_indivisible, self.rng_streams, self.seed = on_indivisible, tuple(rng_streams), int(seed)
        self.abstract_batch = batch_shapes(batch, batch_size, seq_len, "Trainer")
        if seq_len is None:
            # A language-model batch passed whole (as configs do): its length makes tokens/s and 6·N·tokens.
            inputs = self.abstract_batch.get("inputs") if isinstance(self.abstract_batch, dict) else None
            if inputs is not None and len(inputs.shape) == 2 and jnp.issubdtype(inputs.dtype, jnp.integer):
                seq_len = int(inputs.shape[1])
        self.batch_size, self.seq_len = batch_size_of(self.abstract_batch), seq_len
        self.grad_accum = int(grad_accum)
        if self.grad_accum < 1 or self.batch_size % self.grad_accum:
            raise ShardingError(
                f"batch_size {self.batch_size} must be a positive multiple of grad_accum {grad_accum}", arg="grad_accum"
            )
        self.micro_batch = self.batch_size // self.grad_accum
        what = (
            f"batch_size {self.batch_size}"
            if self.grad_accum == 1
            else f"micro-batch {self.micro_batch} (batch_size {self.batch_size} / grad_accum {self.grad_accum})"
        )
        # Pipeline stages (a `stage` mesh axis) run micro-batches of these micro-batches.
        self.stages = pipeline_stages(mesh)
        self.pipeline_repeats = int(pipeline_repeats) if self.stages > 1 else 1
        self.microbatches, rows, what = check_microbatches(
            mesh, self.rules, microbatches, self.micro_batch, what, pipeline_repeats
        )
        self.batch_specs = batch_specs(self.abstract_batch, self.rules, mesh, batch_names, micro_batch=rows, what=what)
        self.batch_shardings = jax.tree.map(
            lambda s: NamedSharding(mesh, s), self.batch_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )
        # The sharding of a (batch, length) leaf: what TokenBatches and most data sources need.
        self.batch_spec = self.rules.batch_spec(2)
        self.batch_sharding = NamedSharding(mesh, self.batch_spec)
        self.abstract_state = self._abstract_state()
        check_layers(layers_sizes(self.abstract_state.params), self.stages, self.pipeline_repeats)
        replicated = NamedSharding(mesh, PartitionSpec())
        # Wrapped in {"params": ...} so error messages name `params/...` paths, as `check` does.
        # The params warn when most of them would be replicated (ReplicationWarning; their optimizer
        # state follows them, so one warning says it all).
        a, off = self.abstract_state, self.offload
        quiet: dict[str, Any] = {"on_indivisible": on_indivisible, "warn_replicated": False}
        self.state_shardings = TrainState(  # offloaded parts: the same layouts, in host memory
            step=replicated,
            params=off.stored(
                tree_shardings({"params": a.params}, mesh, self.rules, on_indivisible=on_indivisible)["params"],
                "params",
            ),
            opt_state=off.stored(
                tree_shardings({"opt_state": a.opt_state}, mesh, self.optimizer_rules, **quiet)["opt_state"],
                "opt_state",
            ),
            collections=tree_shardings(a.collections, mesh, self.rules, **quiet),
        )
        self.replicated = replicated
        if off.host_update:  # an update that cannot run on the host is refused now, in one line
            train = self.subset.trainable(unbox(a.params))
            shardings = self.subset.trainable(self.state_shardings.params)
            check_host_update(tx, train, unbox(a.opt_state), shardings, self.state_shardings.opt_state)
        s = self.state_shardings
        # Two phases: params (random init, with its temporaries), then the optimizer
        # state from them. The RNG's scratch space never coexists with the
        # optimizer state, so the init's peak stays at about the final state.
        self._init_params_jit = jax.jit(self._init_params_fn, out_shardings=(s.params, s.collections))
        self._init_opt_jit = jax.jit(
            self._init_opt_fn, in_shardings=(s.params,), out_shardings=(replicated, s.opt_state)
        )
        self._step_jit = jax.jit(
            self._step_fn, in_shardings=(s, self.batch_shardings), out_shardings=(s, replicated), donate_argnums=0
        )
        self._eval_jit = jax.jit(
            self._eval_fn, in_shardings=(s.params, s.collections, self.batch_shardings), out_shardings=replicated
        )

    # -- shapes and shardings --------------------------------------------------
    def _model_args(self, batch: Any) -> tuple[tuple, dict]:
        return model_inputs(self.task, batch)

    def _micro_abstract(self) -> Any:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((self.micro_batch, *x.shape[1:]), x.dtype), self.abstract_batch
        )

    def _abstract_state(self) -> TrainState:
        args, kwargs = self._model_args(self._micro_abstract())

        def boxed(rng):
            variables = dict(self.model.boxed(rng, args, kwargs))
            params = variables.pop("params")
            # The params' paths (static while tracing) pick the trainable subset; the optimizer sees only it.
            self.subset = subset_of(params, self._trainable_arg)
            trainable = self.subset.trainable(params)
            opt_state = strip_foreign_boxes(self.tx.init(trainable), trainable, self.model)  # its table's rows
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state, collections=variables)

        with sharding_context(self.mesh, self.rules):
            return jax.eval_shape(boxed, jax.random.key(0))

    def place(self, host_batch: Any) -> Any:
        """A global batch of numpy arrays (the same on every process) as sharded jax Arrays."""
        return place(host_batch, self.batch_shardings)

    # -- traced functions --------------------------------------------------------
    def _loss(self, params, collections, batch, rngs, train: bool):
        updated, sown = dict(collections), dict[str, Any]()

        def forward(*args, **kwargs):
            with microbatching(self.microbatches, self.pipeline_repeats):
                out, updates = self.model.apply({"params": params, **updated}, args, kwargs, rngs=rngs, train=train)
            updates = dict(updates)
            for name, value in sown_losses(updates.pop(SOWN_LOSSES, {})).items():
                sown[name] = sown.get(name, 0.0) + value
            updated.update(updates)
            return out

        loss, aux = self.task.run(forward, batch)
        if sown:
            # The objective adds the model's own loss terms; the `loss` metric stays the task's.
            aux = {**aux, **sown, "loss": loss}
            loss = loss + sum(sown.values())
        return loss, (aux, updated)

    def _grads(self, params, frozen, collections, batch, step):
        def loss_fn(trainable, colls, b, rngs):
            return self._loss(self.subset.merge(trainable, frozen), colls, b, rngs, train=True)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if self.grad_accum == 1:
            return grad_fn(params, collections, batch, stream_keys(self.seed, step, self.rng_streams))
        micro = micro_batches(batch, self.grad_accum, self.batch_specs)

        def body(carry, xs):
            acc, colls = carry
            j, mbatch = xs
            (loss, (aux, colls)), g = grad_fn(params, colls, mbatch, stream_keys(self.seed, step, self.rng_streams, j))
            return (jax.tree.map(jnp.add, acc, ((loss, aux), g)), colls), None

        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(grad_fn, params, collections, first, stream_keys(self.seed, step, self.rng_streams))
        (_, (aux_shape, _)), g_shape = shapes
        zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), ((shapes[0][0], aux_shape), g_shape))
        (total, colls), _ = jax.lax.scan(body, (zero, collections), (jnp.arange(self.grad_accum), micro))
        (loss, aux), grads = jax.tree.map(lambda x: x / self.grad_accum, total)
        return (loss, (aux, colls)), grads

    def _step_fn(self, state: TrainState, batch):
        # Only the trainable part is differentiated and updated; frozen params pass through untouched.
        # Offloaded params come to the device for the passes; the update runs where `offload` says.
        off, shardings = self.offload, self.state_shardings
        stored, frozen = self.subset.split(state.params)
        trainable, used_frozen = self.subset.split(
            to_device(state.params, shardings.params) if off.params else state.params
        )
        (loss, (aux, collections)), grads = self._grads(trainable, used_frozen, state.collections, batch, state.step)
        grad_norm = optax.tree.norm(grads)
        flag = nonfinite_flag(loss, grad_norm)
        skip = self.on_nonfinite == "skip_step"  # drop a non-finite step's whole update: the last finite state
        new, opt_state = apply_update(
            self.tx,
            grads,
            state.opt_state,
            stored if off.host_update else trainable,
            off=off,
            param_shardings=self.subset.trainable(shardings.params),
            opt_shardings=shardings.opt_state,
            keep=flag if skip else None,
        )
        params = self.subset.merge(new, frozen)
        if skip:
            collections = keep_if_finite(flag, collections, state.collections)
        metrics = {"loss": loss, "grad_norm": grad_norm, **aux, FLAG: flag}
        lr = current_lr(opt_state)
        if lr is not None:
            metrics["lr"] = device_lr(lr) if off.optimizer else jnp.asarray(lr, jnp.float32)
        new = TrainState(step=state.step + 1, params=params, opt_state=opt_state, collections=collections)
        return new, metrics

    def _eval_fn(self, params, collections, batch):
        if self.offload.params:
            params = to_device(params, self.state_shardings.params)
        loss, (aux, _) = self._loss(params, collections, batch, stream_keys(self.seed, 0, self.rng_streams), False)
        return {"loss": loss, **aux}

    # -- public steps --------------------------------------------------------------
    def train_step(self, state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer step (the input state is donated). Metrics are device scalars."""
        with sharding_context(self.mesh, self.rules):
            return self._step_jit(state, batch)

    def eval_step(self, params: Any, batch: Any, collections: Any = None) -> dict[str, jax.Array]:
        """Loss (and aux metrics) of ``params`` on ``batch`` in eval mode, as device scalars.

        ``collections`` (e.g. BatchNorm statistics) default to the init's; pass ``state.collections``.
        """
        if collections is None:
            collections = self._empty_collections()
        with sharding_context(self.mesh, self.rules):
            return self._eval_jit(params, collections, batch)

    def evaluate_state(self, state: TrainState, batch: Any) -> dict[str, jax.Array]:
        """:meth:`eval_step` of a whole train state (its params and collections)."""
        return self.eval_step(state.params, batch, state.collections)

    def _empty_collections(self) -> Any:
        if not jax.tree.leaves(self._collections_template):
            return self._collections_template
        raise TypeError(
            "this model carries collections (e.g. batch_stats): pass eval_step(..., collections="
            "state.collections) or use evaluate_state(state, batch)"
        )


__all__ = ["Trainer"]
