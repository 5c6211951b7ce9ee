"""Models the trainer can drive: Flax Linen modules, Flax NNX modules and plain functions.

One interface for the three, so the train step, the plan and checkpoints never ask which kind they hold:

- ``boxed(rng, args, kwargs)``: the initial variables, boxed (``{"params": ..., "batch_stats": ..., ...}``;
  each box carries the logical or mesh-axis names the model gave it), traceable; ``abstract(args, kwargs)``
  is its ``jax.eval_shape``: nothing allocated;
- ``init(rng, args, kwargs)``: the same tree, unboxed, traceable (the trainer jits it with ``out_shardings``
  so every array is born in its shard);
- ``apply(variables, args, kwargs, rngs=, train=)``: ``(outputs, updated collections)`` — the collections
  other than ``params`` that the model mutates in training (BatchNorm's ``batch_stats``, NNX's RNG counters).

Train vs eval mode is found, in this order, as a ``deterministic`` / ``train`` / ``training`` argument of the
model's ``__call__``; a field of the module of that name; a field of a config dataclass the module holds
(Flax's lm1b: ``config.deterministic``); NNX's ``model.train()`` / ``model.eval()``.
Where the mode is a field, training uses the model as configured and eval flips it to deterministic.

Example::

    >>> from flax import nnx
    >>> linen = pt.as_model(nn.Dense(4))
    >>> nnx_model = pt.NNXModel(lambda rngs: nnx.Linear(8, 4, rngs=rngs))       # NNX: a factory taking rngs
    >>> functions = pt.FunctionModel(lambda rng: {"w": jnp.ones((8, 4))}, lambda p, x: x @ p["w"])
    >>> linen.kind, nnx_model.kind, functions.kind
    ('linen', 'nnx', 'function')
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from partitioning.boxes import LogicallyPartitioned, unbox
from partitioning.model.axis_names import bind_named_axes
from partitioning.model.tracing import guard

MODE_ARGS = ("deterministic", "train", "training", "is_training")
# Collections a Linen init may return that are not state to carry between steps.
TRANSIENT = ("intermediates", "losses")
# Scalars a model sows here are terms of the training objective (an MoE load-balancing loss):
# ``apply`` returns them among its updates, the trainer adds them to the loss.
SOWN_LOSSES = "losses"
# NNX variable types grouped into collections (the rest, except intermediates, go to "state").
NNX_GROUPS = (("params", nnx.Param), ("batch_stats", nnx.BatchStat), ("rngs", nnx.RngState))


def _call_params(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _mode_kwargs(params: set[str], train: bool) -> dict[str, bool]:
    for name in MODE_ARGS:
        if name in params:
            return {name: (not train) if name == "deterministic" else train}
    return {}


class LinenModel:
    """A Flax Linen module (``nn.Module`` instance).

    Example::

        >>> from partitioning.models import MLP
        >>> model = pt.LinenModel(MLP())
        >>> model.abstract((jnp.zeros((8, 16), jnp.int32),), {})["params"]["wi_0"]   # boxed ShapeDtypeStructs
        LogicallyPartitioned(value=ShapeDtypeStruct(shape=(64, 256), dtype=float32), names=('embed', 'mlp'), ...)
    """

    kind = "linen"

    def __init__(self, module: nn.Module):
        self.module = module
        self.axis_names: list[str] = []  # pmap-era collective axes the model reduces over (learned)
        self._call = _call_params(type(module).__call__)
        self._eval_module = self._deterministic_clone(module)

    def _deterministic_clone(self, module: nn.Module) -> nn.Module:
        """The module with its mode field (or its config's) set for eval; itself when it has none."""
        if _mode_kwargs(self._call, False):
            return module
        fields = {f.name for f in dataclasses.fields(module)} if dataclasses.is_dataclass(module) else set()
        for name in MODE_ARGS:
            if name in fields:
                mode: dict[str, Any] = {name: name == "deterministic"}
                return module.clone(**mode)
        for f in fields - {"parent", "name"}:
            cfg = getattr(module, f, None)
            if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
                inner = {g.name for g in dataclasses.fields(cfg)}
                for name in MODE_ARGS:
                    if name in inner:
                        config: dict[str, Any] = {f: dataclasses.replace(cfg, **{name: name == "deterministic"})}
                        return module.clone(**config)
        return module

    def _module(self, train: bool) -> nn.Module:
        return self.module if train else self._eval_module

    def abstract(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return jax.eval_shape(lambda rng: self.boxed(rng, args, kwargs), jax.random.key(0))

    def boxed(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        rngs = {"params": rng, "dropout": jax.random.fold_in(rng, 1)}
        kw = {**kwargs, **_mode_kwargs(self._call, False)}
        module = self._module(False)
        abstract_args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
        variables: Mapping[str, Any]
        try:
            # lazy_init keeps only what params depend on: compiling the init costs no forward pass.
            variables = module.lazy_init(rngs, *abstract_args, **kw)
        except flax.errors.LazyInitError:
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), args)
            variables = module.init(rngs, *zeros, **kw)
        return {k: v for k, v in dict(variables).items() if k not in TRANSIENT}

    def init(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return unbox(self.boxed(rng, args, kwargs))

    def apply(
        self,
        variables: Mapping[str, Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        rngs: Mapping[str, jax.Array],
        train: bool,
    ) -> tuple[Any, dict[str, Any]]:
        module = self._module(train)
        kw = {**kwargs, **_mode_kwargs(self._call, train)}
        mutable = ([c for c in variables if c != "params"] if train else []) + [SOWN_LOSSES]
        out, updates = bind_named_axes(
            lambda: module.apply(dict(variables), *args, rngs=dict(rngs), mutable=mutable, **kw), self.axis_names
        )
        keep = {k: v for k, v in dict(updates).items() if k not in TRANSIENT or k == SOWN_LOSSES}
        return out, (keep if train else {k: v for k, v in keep.items() if k == SOWN_LOSSES})


def _nnx_names(var: nnx.Variable) -> tuple[Any, ...] | None:
    meta = var.get_metadata()
    names = meta.get("out_sharding", meta.get("sharding"))
    if names is None:
        return None
    return tuple(getattr(names, "spec", names))  # a NamedSharding's spec, a PartitionSpec or a tuple


def _to_boxed(state: nnx.State) -> dict[str, Any]:
    """An NNX State as a plain nested dict whose leaves are boxes carrying the variables' names."""

    def leaf(var: nnx.Variable) -> Any:
        value = var.get_value()
        names = _nnx_names(var)
        return LogicallyPartitioned(value, names) if names is not None else value

    boxed = jax.tree.map(leaf, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return _plain(boxed)


def _plain(tree: Any) -> Any:
    if isinstance(tree, (nnx.State, Mapping)):
        return {k: _plain(v) for k, v in tree.items()}
    return tree


def _key_to_data(x: Any) -> Any:
    # Typed PRNG keys (NNX's RngKey) are stored as their raw uint32 data: checkpoints hold plain arrays.
    return jax.random.key_data(x) if jnp.issubdtype(getattr(x, "dtype", jnp.float32), jax.dtypes.prng_key) else x


class NNXModel:
    """A Flax NNX module, built by ``factory(rngs)`` (so the trainer can build it sharded, inside jit).

    An already-built module works too (``NNXModel(module=m)``); its current
    values are the init.

    Example::

        >>> from flax import nnx
        >>> init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
        >>> model = pt.NNXModel(lambda rngs: nnx.Linear(64, 256, kernel_init=init, rngs=rngs))
        >>> pt.tree_layouts(model.abstract((jnp.zeros((8, 64)),), {}), {"data": 1, "fsdp": 8}, "fsdp")[-1].spec
        P('fsdp', None)
    """

    kind = "nnx"

    def __init__(self, factory: Callable[[nnx.Rngs], nnx.Module] | None = None, *, module: nnx.Module | None = None):
        if (factory is None) == (module is None):
            raise TypeError("NNXModel needs exactly one of factory(rngs) or module=")
        self.factory, self.module = factory, module
        if module is not None:
            abstract = module
        else:
            make = factory
            assert make is not None  # exactly one of the two, checked above
            with nnx.use_eager_sharding(False):
                abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
        self.model_class = type(abstract)
        filters = [f for _, f in NNX_GROUPS]
        self._graphdef, *states = nnx.split(abstract, *filters, ...)
        self._templates = dict(zip([g for g, _ in NNX_GROUPS] + ["state"], states, strict=True))
        abstract.train()
        self._train_def = nnx.graphdef(abstract)
        abstract.eval()
        self._eval_def = nnx.graphdef(abstract)
        self._call = _call_params(type(abstract).__call__)
        self.axis_names: list[str] = []

    def _split(self, model: nnx.Module) -> dict[str, nnx.State]:
        _, *states = nnx.split(model, *[f for _, f in NNX_GROUPS], ...)
        return dict(zip([g for g, _ in NNX_GROUPS] + ["state"], states, strict=True))

    def abstract(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return jax.eval_shape(lambda rng: self.boxed(rng, args, kwargs), jax.random.key(0))

    def _states(self, rng: jax.Array) -> dict[str, nnx.State]:
        if self.module is not None:
            return self._split(self.module)
        # The trainer's out_shardings place every variable; NNX's own eager
        # constraints would only repeat them (and refuse a replicated fallback).
        assert self.factory is not None  # no module: built by the factory
        with nnx.use_eager_sharding(False):
            return self._split(self.factory(nnx.Rngs(rng)))

    def boxed(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for group, state in self._states(rng).items():
            if len(state):
                out[group] = jax.tree.map(
                    _key_data_leaf, _to_boxed(state), is_leaf=lambda x: isinstance(x, LogicallyPartitioned)
                )
        return out

    def init(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return unbox(self.boxed(rng, args, kwargs))

    def merge(self, variables: Mapping[str, Any], train: bool) -> nnx.Module:
        """The NNX module holding ``variables`` (pure dicts), in train or eval mode."""
        states = []
        for group, template in self._templates.items():
            state = jax.tree.map(lambda v: v, template, is_leaf=lambda x: isinstance(x, nnx.Variable))
            if group in variables:
                pure = jax.tree.map(
                    lambda t, v: jax.random.wrap_key_data(v) if _is_key(t) else v,
                    nnx.to_pure_dict(template),
                    dict(variables[group]),
                )
                nnx.replace_by_pure_dict(state, pure)
            states.append(state)
        return nnx.merge(self._train_def if train else self._eval_def, *states)

    def apply(
        self,
        variables: Mapping[str, Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        rngs: Mapping[str, jax.Array],
        train: bool,
    ) -> tuple[Any, dict[str, Any]]:
        model = self.merge(variables, train)
        out = bind_named_axes(lambda: model(*args, **{**kwargs, **_mode_kwargs(self._call, train)}), self.axis_names)
        if not train:
            return out, {}
        states = self._split(model)
        return out, {
            g: jax.tree.map(_key_to_data, nnx.to_pure_dict(s))
            for g, s in states.items()
            if g != "params" and g in variables
        }


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(getattr(x, "dtype", jnp.float32), jax.dtypes.prng_key)


def _key_data_leaf(x: Any) -> Any:
    if isinstance(x, LogicallyPartitioned):
        return x.replace_boxed(_key_to_data(x.value))
    return _key_to_data(x)


class FunctionModel:
    """A model given as plain functions: ``init(rng) -> params`` and ``apply(params, *args, **kwargs)``.

    ``init`` may box its arrays with logical names
    (:func:`partitioning.with_logical_partitioning`, ``nn.LogicallyPartitioned``);
    ``apply`` receives ``rngs=`` / ``train=`` when its signature takes them.

    Example::

        >>> def init(rng):
        ...     return {"w": pt.LogicallyPartitioned(jax.random.normal(rng, (64, 10)), ("embed", "vocab"))}
        >>> pt.FunctionModel(init, lambda p, x: x @ p["w"]).abstract((), {})["params"]["w"].names
        ('embed', 'vocab')
    """

    kind = "function"

    def __init__(self, init: Callable[[jax.Array], Any], apply: Callable[..., Any]):
        self.init_fn, self.apply_fn = init, apply
        self._call = _call_params(apply)

    def abstract(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return jax.eval_shape(lambda rng: self.boxed(rng, args, kwargs), jax.random.key(0))

    def boxed(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {"params": self.init_fn(rng)}

    def init(self, rng: jax.Array, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {"params": unbox(self.init_fn(rng))}

    def apply(
        self,
        variables: Mapping[str, Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        rngs: Mapping[str, jax.Array],
        train: bool,
    ) -> tuple[Any, dict[str, Any]]:
        kw = dict(kwargs)
        if "rngs" in self._call:
            kw["rngs"] = rngs
        if "train" in self._call:
            kw["train"] = train
        return self.apply_fn(variables["params"], *args, **kw), {}


# A failure in the model's own code while it is traced: one ModelError line (partitioning.model.tracing).
for _adapter in (LinenModel, NNXModel, FunctionModel):
    guard(_adapter)


def _is_adapter(model: Any) -> bool:
    # An object with the adapters' interface (LoRAModel wraps one): used as it is.
    return not isinstance(model, type) and all(hasattr(model, a) for a in ("kind", "abstract", "boxed", "apply"))


def as_model(model: Any) -> Any:
    """The adapter for ``model``: a Linen module, an NNX module, an adapter, or ``(init, apply)``.

    Example::

        >>> from flax import nnx
        >>> pt.as_model(nn.Dense(4)).kind, pt.as_model(nnx.Linear(4, 4, rngs=nnx.Rngs(0))).kind
        ('linen', 'nnx')
    """
    if isinstance(model, (LinenModel, NNXModel, FunctionModel)) or _is_adapter(model):
        return model
    if isinstance(model, nn.Module):
        return LinenModel(model)
    if isinstance(model, nnx.Module):
        return NNXModel(module=model)
    if isinstance(model, tuple) and len(model) == 2 and all(callable(f) for f in model):
        return FunctionModel(*model)
    raise TypeError(
        f"cannot train a {type(model).__name__}: expected a Flax Linen module, an NNX module "
        f"(or NNXModel(factory)), or FunctionModel(init, apply)"
    )


def abstract_params(model: Any) -> Any:
    """A token model's boxed abstract params: ``eval_shape`` of its init on one token (nothing allocated)."""
    return jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"]


def param_names(abstract: Any) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Each parameter's logical axis names by path, from the boxes ``model.init`` returns."""
    return {k: tuple(box.names) for k, box in flax.traverse_util.flatten_dict(abstract).items()}


__all__ = ["LinenModel", "NNXModel", "FunctionModel", "as_model", "abstract_params", "param_names", "SOWN_LOSSES"]
