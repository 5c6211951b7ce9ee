"""Host offload: train state that keeps its rule-table layout but lives in host memory between steps.

``offload=("optimizer",)`` (and ``"params"``) puts that part of the state in
``pinned_host`` memory: its ``NamedSharding`` s are the rule table's, with
``memory_kind="pinned_host"`` (JAX's memory kinds). A step moves it where it is
used, inside the one jitted step, and its ``out_shardings`` put it back:

- ``params``: moved to the device at the start of the step for the forward
  and backward passes (the device holds them during the step; between steps
  and in checkpoints they are on the host);
- ``optimizer``, with ``update="device"`` (MaxText's
  ``optimizer_memory_host_offload``): the gradients are computed first, then
  the optimizer state comes to the device for the update and goes back. The
  device never holds it beside the activations: its peak is
  ``params + gradients + max(activations, optimizer state)``; the host link
  carries the state twice a step;
- ``optimizer``, with ``update="host"``: the update runs on the host
  (``jax.experimental.compute_on("device_host")``); the gradients and params
  cross to the host and the new params back, and the device never holds the
  optimizer state (``params + gradients + activations``).

On the CPU both are the same memory; on an accelerator the faster one depends
on its host link and host CPU (``benchmarks/gpu``'s ``offload`` section measures
both against no offload).

Example::

    >>> from partitioning.train.offload import Offload
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> off = Offload.of(["optimizer"])
    >>> off.optimizer, off.params, off.update
    (True, False, 'device')
    >>> s = jax.NamedSharding(mesh, jax.P("fsdp"))
    >>> off.stored({"opt_state": s}, "opt_state")["opt_state"].memory_kind
    'pinned_host'
    >>> Offload.of(["optimiser"])
    Traceback (most recent call last):
    partitioning.errors.ConfigError: offload: 'optimiser' cannot be offloaded; choose from optimizer, params; \
did you mean 'optimizer'?
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.experimental.compute_on import compute_on

from partitioning.errors import ConfigError, did_you_mean
from partitioning.train.nonfinite import keep_if_finite

OFFLOADABLE = ("optimizer", "params")
UPDATES = ("device", "host")
HOST = "pinned_host"
DEVICE = "device"
# The part of a TrainState each offloadable name stores on the host.
FIELDS = {"optimizer": "opt_state", "params": "params"}


def host_memory_kinds(device: Any = None) -> list[str]:
    """The memory kinds a device can address (``device``, ``pinned_host``, ...).

    Example::

        >>> from partitioning.train.offload import host_memory_kinds
        >>> "pinned_host" in host_memory_kinds()      # the CPU backend has it too
        True
    """
    device = device if device is not None else jax.devices()[0]
    return [str(m.kind) for m in device.addressable_memories()]


def _kind(tree: Any, kind: str) -> Any:
    return jax.tree.map(lambda s: s.with_memory_kind(kind), tree)


@dataclasses.dataclass(frozen=True)
class Offload:
    """What of the train state lives on the host, and where the optimizer update runs.

    Example::

        >>> from partitioning.train.offload import Offload
        >>> Offload.of(["params", "optimizer"], update="host").names
        ('optimizer', 'params')
        >>> bool(Offload.of(()))
        False
    """

    names: tuple[str, ...] = ()
    update: str = "device"

    @classmethod
    def of(cls, names: Iterable[str] | str | None, update: str = "device") -> Offload:
        """Checked: each name one of :data:`OFFLOADABLE`, ``update`` one of :data:`UPDATES` (one line each)."""
        if isinstance(names, str):
            names = [names]
        got = list(names or ())
        for n in got:
            if n not in OFFLOADABLE:
                raise ConfigError(
                    f"offload: {n!r} cannot be offloaded; choose from {', '.join(OFFLOADABLE)}"
                    f"{did_you_mean(str(n), OFFLOADABLE)}",
                    arg="offload",
                )
        if update not in UPDATES:
            raise ConfigError(
                f"offload_update: {update!r} is not where an update can run; choose device or host"
                f"{did_you_mean(str(update), UPDATES)}",
                arg="offload_update",
            )
        return cls(tuple(n for n in OFFLOADABLE if n in got), update)

    def __bool__(self) -> bool:
        return bool(self.names)

    @property
    def optimizer(self) -> bool:
        return "optimizer" in self.names

    @property
    def params(self) -> bool:
        return "params" in self.names

    @property
    def host_update(self) -> bool:
        """The optimizer update runs on the host (its state offloaded, ``update="host"``)."""
        return self.optimizer and self.update == "host"

    def check_backend(self, mesh: Any) -> None:
        """Refuses (one line) a mesh whose devices have no ``pinned_host`` memory."""
        if not self:
            return
        device = mesh.devices.flat[0]
        kinds = host_memory_kinds(device)
        if HOST not in kinds:
            raise ConfigError(
                f"offload: the {device.platform} devices have no {HOST} memory (their memories: {', '.join(kinds)}); "
                f"remove offload ({', '.join(self.names)}) to train on them",
                arg="offload",
            )

    def stored(self, shardings: Any, field: str) -> Any:
        """``shardings`` (one field of the train state's) in host memory when that field is offloaded."""
        return _kind(shardings, HOST) if any(FIELDS[n] == field for n in self.names) else shardings


def to_device(tree: Any, shardings: Any) -> Any:
    """``tree`` moved to device memory in ``shardings``' layout (a no-op for what is already there).

    Example::

        >>> from partitioning.train.offload import to_device, to_host
        >>> s = jax.NamedSharding(pt.make_mesh({"fsdp": -1}), jax.P("fsdp"))
        >>> x = to_host(jnp.arange(16.0), s)
        >>> x.sharding.memory_kind, x.sharding.spec, to_device(x, s).sharding.memory_kind
        ('pinned_host', P('fsdp',), 'device')
    """
    return jax.device_put(tree, _kind(shardings, DEVICE))


def to_host(tree: Any, shardings: Any) -> Any:
    """``tree`` moved to ``pinned_host`` memory in ``shardings``' layout (example: :func:`to_device`)."""
    return jax.device_put(tree, _kind(shardings, HOST))


def on_host(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled to run on the host, its arguments and results in host memory (``compute_on``).

    Example::

        >>> from partitioning.train.offload import on_host, to_host
        >>> s = jax.NamedSharding(pt.make_mesh({"fsdp": -1}), jax.P("fsdp"))
        >>> y = jax.jit(on_host(lambda x: x * 2))(to_host(jnp.ones(16), s))
        >>> y.sharding.memory_kind, float(y.sum())
        ('pinned_host', 32.0)
    """
    return compute_on("device_host")(jax.jit(fn))


def init_optimizer(tx: Any, params: Any, off: Offload, shardings: Any) -> Any:
    """``tx.init(params)`` on the device (offloaded params brought there first); an offloaded optimizer state
    goes to the host through the init's ``out_shardings``, buffer by buffer, as MaxText's init does."""
    return tx.init(to_device(params, shardings) if off.params else params)


def _update(tx: Any, grads: Any, opt_state: Any, params: Any, flag: jax.Array | None) -> tuple[Any, Any]:
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if flag is None:
        return new_params, new_opt
    return keep_if_finite(flag, (new_params, new_opt), (params, opt_state))


def apply_update(
    tx: Any,
    grads: Any,
    opt_state: Any,
    params: Any,
    *,
    off: Offload,
    param_shardings: Any,
    opt_shardings: Any,
    keep: jax.Array | None = None,
) -> tuple[Any, Any]:
    """``(new params, new optimizer state)`` of one optimizer update, where ``off`` says it runs.

    ``params`` are the stored trainable params (on the host when offloaded), ``opt_state`` the stored optimizer
    state, ``grads`` on the device; ``param_shardings`` / ``opt_shardings`` their layouts. ``keep``: the
    non-finite flag of ``on_nonfinite="skip_step"``: a flagged step keeps the old state, selected where the
    update runs, so no operation mixes memory kinds.
    """
    if off.host_update:
        flag = None if keep is None else to_host(keep, jax.sharding.NamedSharding(_mesh(param_shardings), jax.P()))
        new_params, new_opt = on_host(functools.partial(_update, tx))(
            to_host(grads, param_shardings), opt_state, to_host(params, param_shardings), flag
        )
        return (new_params if off.params else to_device(new_params, param_shardings)), new_opt
    if off.optimizer:
        opt_state = to_device(opt_state, opt_shardings)
    return _update(tx, grads, opt_state, params, keep)


def check_host_update(tx: Any, params: Any, opt_state: Any, param_shardings: Any, opt_shardings: Any) -> None:
    """Refuses (one line) an optimizer whose update cannot run on the host: traced abstractly, as the step would.

    Arrays an update makes afresh (``jnp.zeros_like``, optax's ``clip_by_global_norm`` taking a norm) are placed
    in device memory by JAX, and an operation mixing them with the host's arrays fails; the update on the device
    has no such limit. ``params`` / ``opt_state``: the abstract (unboxed) trainable params and optimizer state.
    """

    def on(tree: Any, shardings: Any) -> Any:
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, _kind(shardings, HOST)
        )

    try:
        jax.eval_shape(
            on_host(functools.partial(_update, tx)),
            on(params, param_shardings),
            on(opt_state, opt_shardings),
            on(params, param_shardings),
            None,
        )
    except ValueError as e:
        if "memory_space" not in str(e):
            raise
        raise ConfigError(
            "offload_update: host: this optimizer's update makes arrays JAX places in device memory (a gradient "
            "clip by global norm does: optimizer.clip_norm), which the host's arrays cannot meet; update on the "
            "device (offload_update: device) or drop the clip",
            arg="offload_update",
        ) from None


def _mesh(shardings: Any) -> Any:
    return next(s.mesh for s in jax.tree.leaves(shardings))


def device_lr(lr: Any) -> jax.Array:
    """A learning rate read off the optimizer state, as a device scalar (a metric)."""
    return jax.device_put(jnp.asarray(lr, jnp.float32), jax.memory.Space.Device)


__all__ = [
    "Offload",
    "OFFLOADABLE",
    "UPDATES",
    "host_memory_kinds",
    "to_device",
    "to_host",
    "on_host",
    "init_optimizer",
    "apply_update",
    "check_host_update",
    "device_lr",
]
