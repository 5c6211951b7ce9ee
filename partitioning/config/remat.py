"""``model.remat: auto``, the default for a model with a ``remat`` option: the policy resolved at run start.

``auto`` becomes the policy ``tune`` would pick for this model on this mesh
and hardware (:func:`partitioning.tune.remat.choose_remat`: every policy the
model takes, priced for the run's own layout; the fastest that fits the
device memory), before the model is built, so models only ever see a concrete
policy. The hardware is the one this process runs on
(:func:`partitioning.tune.measure.local_profile`): an accelerator's built-in
profile, or the CPU measured once and cached. ``train`` and ``check`` say
which policy and why in one line; a policy written in the config (or
``--set model.remat=full``) is used as it is.

Example::

    >>> from partitioning.config.remat import is_auto, remat_policies, resolve_remat
    >>> cfg = pt.load_config("configs/quickstart.yaml")       # its model names no remat policy
    >>> is_auto(cfg), remat_policies(cfg)
    (True, ('none', 'dots', 'dots_no_batch', 'offload', 'full'))
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
    >>> resolved, note = resolve_remat(cfg, mesh)            # the first time on a machine: the CPU is measured
    >>> resolved.model_options["remat"] in remat_policies(cfg), note
    (True, 'remat: auto -> ...: the fastest of 4 policies, est. ... of CPU time per simulated device per step ...')
    >>> resolve_remat(pt.load_config("configs/quickstart.yaml", ["model.remat=full"]), mesh)[1] is None   # as written
    True
"""

from __future__ import annotations

import copy
from typing import Any

from partitioning.config.build import AUTO, model_from_config
from partitioning.config.planning import tune_inputs
from partitioning.config.schema import Config
from partitioning.errors import PartitioningError
from partitioning.model.registry import constructor_options, model_class
from partitioning.parallel.pipeline import check_microbatches
from partitioning.plan.budget import device_memory
from partitioning.tune.hardware import hardware
from partitioning.tune.host import priced_remats
from partitioning.tune.measure import local_profile
from partitioning.tune.remat import choose_remat
from partitioning.tune.workload import REMATS


def is_auto(cfg: Config) -> bool:
    """The config leaves the remat policy to the run: ``remat: auto``, or a registered model's ``remat`` unset."""
    value = cfg.model_options.get("remat")
    if value is not None:
        return value == AUTO
    if cfg.model_hf is not None:
        return True  # a checkpoint's model: auto by default
    if cfg.model_target:
        return False
    try:
        return isinstance(constructor_options(model_class(cfg.model_name)).get("remat"), str)
    except PartitioningError:
        return False


def with_remat(cfg: Config, policy: str) -> Config:
    """A copy of ``cfg`` whose model has ``remat: policy``."""
    out = copy.copy(cfg)
    out.model_options = {**cfg.model_options, "remat": policy}
    return out


def remat_policies(cfg: Config) -> tuple[str, ...]:
    """The policies of :data:`~partitioning.tune.workload.REMATS` the config's model accepts (``()``: it has no
    ``remat`` option)."""
    if not is_auto(cfg) and "remat" not in cfg.model_options:
        return ()
    ok = []
    for policy in REMATS:
        try:
            model_from_config(with_remat(cfg, policy))
            ok.append(policy)
        except PartitioningError:
            pass
    return tuple(ok)


def price_remat(
    cfg: Config,
    sizes: dict[str, int],
    hw: Any,
    budget: int,
    policies: tuple[str, ...] | None = None,
    microbatches: int | None = None,
) -> Any:
    """``choose_remat`` of this config's model and layout on mesh axis ``sizes``, hardware ``hw`` and memory
    ``budget``: every policy in ``policies`` (default: all the model takes) priced, the fastest that fits chosen.
    ``microbatches``: the pipeline's, as ``check_microbatches`` resolved them (default 1)."""
    t = cfg.train
    inputs = tune_inputs(cfg)
    return choose_remat(
        inputs.params,
        inputs.opt_state,
        sizes,
        cfg.rules,
        inputs.workload,
        hw,
        budget,
        policies=priced_remats(policies or remat_policies(cfg), hw),
        optimizer_rules=cfg.optimizer_rules,
        grad_accum=t.grad_accum,
        microbatches=microbatches or 1,
        repeats=t.pipeline_repeats,
        records=inputs.records,
        activations=inputs.names,
        on_indivisible=cfg.on_indivisible,
        frozen=inputs.frozen,
        offload=t.offload,
        offload_update=t.offload_update,
    )


def resolve_remat(cfg: Config, mesh: Any) -> tuple[Config, str | None]:
    """``(cfg with a concrete remat policy, the one-line note saying which and why)``; ``(cfg, None)`` when the
    config names its policy. ``mesh``: the run's ``jax.sharding.Mesh``."""
    if not is_auto(cfg):
        return cfg, None
    policies = remat_policies(cfg)
    if not policies:
        return cfg, None
    sizes = {a: int(n) for a, n in mesh.shape.items()}
    hw, source = local_profile(mesh.size)
    if hw is None:
        hw, source = hardware("h100"), f"{source}: priced as an h100"
    budget = cfg.mesh.memory_bytes or device_memory() or hw.memory
    t = cfg.train
    try:
        m, _, _ = check_microbatches(
            mesh, cfg.rules, t.microbatches, t.batch_size // max(1, t.grad_accum), repeats=t.pipeline_repeats
        )
        choice = price_remat(cfg, sizes, hw, budget, policies, microbatches=m)
    except PartitioningError:
        # The layout itself is wrong: the model is built with the model's default and the checks that
        # follow (the trainer's) say what to change.
        return cfg, None
    note = f"remat: auto -> {choice.describe()}; {source}"
    return with_remat(cfg, choice.policy), note


__all__ = ["is_auto", "with_remat", "remat_policies", "price_remat", "resolve_remat"]
