"""The sharded init of a :class:`~partitioning.train.step.Trainer`: params, then the optimizer state from them.

Two jitted phases, each with ``out_shardings`` so every array is born in its
shard (and, when offloaded, in host memory): the params (random init, with its
temporaries), then the optimizer state from them — the RNG's scratch space
never coexists with the optimizer state, so the init's peak stays at about the
final state. :meth:`Init.init_from` starts from given params instead (e.g.
pretrained weights). A mixin of :class:`Trainer`, which supplies the model,
the optimizer and the shardings.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16, offload=("optimizer",))
    >>> state = trainer.init(jax.random.key(0))
    >>> state.params["wi_0"].sharding.memory_kind, state.opt_state[0].mu["wi_0"].sharding.memory_kind
    ('device', 'pinned_host')
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from partitioning.boxes import unbox
from partitioning.mesh import sharding_context
from partitioning.train.offload import init_optimizer
from partitioning.train.state import TrainState


class Init:
    """The sharded init and ``init_from`` of a Trainer (see the module docstring)."""

    mesh: Any
    rules: Any
    tx: Any
    model: Any
    seed: int
    offload: Any
    subset: Any
    abstract_state: Any
    state_shardings: Any
    _init_params_jit: Any
    _init_opt_jit: Any

    def _model_args(self, batch: Any) -> tuple[tuple, dict]:
        raise NotImplementedError

    def _micro_abstract(self) -> Any:
        raise NotImplementedError

    def _init_params_fn(self, rng):
        args, kwargs = self._model_args(self._micro_abstract())
        variables = dict(self.model.init(rng, args, kwargs))
        return variables.pop("params"), variables

    def _init_opt_fn(self, params):
        # Unboxed params give the unboxed optimizer state: the structure of state_shardings.opt_state.
        train, shardings = self.subset.trainable(params), self.subset.trainable(self.state_shardings.params)
        return jnp.zeros((), jnp.int32), init_optimizer(self.tx, train, self.offload, shardings)

    def init(self, rng: jax.Array) -> TrainState:
        """A fresh TrainState, every array created directly in its shard."""
        with sharding_context(self.mesh, self.rules):
            params, collections = self._init_params_jit(rng)
            step, opt_state = self._init_opt_jit(params)
        return TrainState(step=step, params=params, opt_state=opt_state, collections=collections)

    def init_from(self, params: Any) -> TrainState:
        """A TrainState at step 0 starting from ``params`` (e.g. pretrained weights), the optimizer state
        initialised from them. ``params`` has the structure of the model's params (boxed or not); arrays
        already in this trainer's layout and dtype are used as they are (:func:`partitioning.hf.load_hf` with the
        trainer's mesh and rules makes them so), others are cast and moved there.

        Example::

            >>> import optax
            >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
            >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")
            >>> trainer = pt.Trainer(model, optax.adamw(1e-3), mesh, "fsdp", batch_size=8, seq_len=16)
            >>> state = trainer.init_from(variables["params"])
            >>> int(state.step), state.params["embedding"] is variables["params"]["embedding"]   # in place: used as is
            (0, True)
            >>> state.opt_state[0].mu["embedding"].sharding.spec          # Adam's moments laid out like their params
            P(None, 'fsdp')
        """
        params = unbox(params)
        shardings, abstract = self.state_shardings.params, unbox(self.abstract_state.params)
        want: Any = jax.tree.structure(abstract)  # PyTreeDef compares, whatever its stubs say
        got = jax.tree.structure(params)
        if want != got:
            raise ValueError(f"init_from: params do not have the model's structure: {got} vs the model's {want}")

        def fit(x, a, s):
            x = x if x.dtype == a.dtype else x.astype(a.dtype)
            return x if isinstance(x, jax.Array) and x.sharding == s else jax.device_put(x, s)

        params = jax.tree.map(fit, params, abstract, shardings)
        with sharding_context(self.mesh, self.rules):
            step, opt_state = self._init_opt_jit(params)
            collections = self._collections_template
            if jax.tree.leaves(collections):  # the model's other collections (batch statistics, ...) as at init
                collections = self._init_collections_jit(jax.random.key(self.seed))
        return TrainState(step=step, params=params, opt_state=opt_state, collections=collections)

    @functools.cached_property
    def _init_collections_jit(self):
        # The params of this init are dead code: XLA drops them.
        return jax.jit(lambda rng: self._init_params_fn(rng)[1], out_shardings=self.state_shardings.collections)

    @functools.cached_property
    def _collections_template(self) -> Any:
        return unbox(self.abstract_state.collections)


__all__ = ["Init"]
