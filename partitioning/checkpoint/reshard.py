"""Offline resharding: rewrite a checkpoint for another mesh and rule table.

Each array's logical names come from the checkpoint's metadata, else from the
new model's params (``abstract_params``), else — for optimizer moments of a
plain orbax checkpoint — from the param whose path and shape they mirror.
The restore reads only each device's slices of the new layout, then the state
is saved as a new checkpoint whose metadata records where it came from.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
    >>> tp_mesh = pt.make_mesh({"data": 1, "tensor": -1})
    >>> result = pt.reshard_checkpoint(run, run / "tp" / "checkpoints", tp_mesh, pt.Rules.preset("tp"),
    ...                                abstract_params=abstract["params"])
    >>> result.step, result.path.relative_to(run)
    (10, PosixPath('tp/checkpoints/10'))
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from partitioning.boxes import unbox
from partitioning.checkpoint.disk import read_metadata, resolve_checkpoint, saved_mesh_str
from partitioning.checkpoint.frozen import saved_arrays
from partitioning.checkpoint.manager import CheckpointManager, names_by_path
from partitioning.checkpoint.restore import restore_checkpoint
from partitioning.checkpoint.target import check_fits, layout_target, names_for_moments, reshard_target
from partitioning.errors import CheckpointError
from partitioning.fmt import fmt_mesh
from partitioning.rules import as_rules


@dataclasses.dataclass(frozen=True)
class ReshardResult:
    """What :func:`reshard_checkpoint` wrote."""

    step: int
    arrays: int
    source: Path
    path: Path
    from_mesh: str
    to_mesh: str


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def reshard_checkpoint(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    mesh: Any,
    rules: Any,
    *,
    optimizer_rules: Any = None,
    on_indivisible: str = "error",
    step: int | None = None,
    abstract_params: Any = None,
    config: Mapping[str, Any] | None = None,
    model_name: str | None = None,
) -> ReshardResult:
    """Rewrites checkpoint ``ckpt`` (latest step, or ``step``) under ``out`` for ``mesh`` and ``rules``.

    ``abstract_params`` (boxed ``eval_shape`` params of the model the new
    layout is for) checks that the checkpoint holds that model and supplies
    logical names the checkpoint lacks. Refuses to overwrite an existing step.

    Example::

        >>> import pathlib, tempfile
        >>> from partitioning.models import MLP
        >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
        >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
        >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
        >>> result = pt.reshard_checkpoint(run, run / "b", pt.make_mesh({"data": 1, "tensor": -1}), "tp")
        >>> pt.checkpoint.checkpoint_metadata(result.path)["arrays"]["params/wi_0"]["spec"]
        [None, 'tensor']
    """
    rules = as_rules(rules)
    ref = resolve_checkpoint(ckpt, step)
    meta = read_metadata(ref)
    saved = saved_arrays(ref)  # with the frozen params a step refers to: the resharded step holds them all
    rules.validate(mesh)
    model_names = None
    if abstract_params is not None and any(p.startswith("params/") for p in saved):
        # The new layout must describe the same model: same parameter paths and shapes.
        check_fits(
            ref,
            {p: md for p, md in saved.items() if p.startswith("params/")},
            {"params": unbox(abstract_params)},
            False,
        )
        model_names = names_by_path({"params": abstract_params})
    target, names = layout_target(
        ref,
        mesh,
        rules,
        optimizer_rules=optimizer_rules,
        on_indivisible=on_indivisible,
        unnamed="replicate",
        names=model_names,
    )
    state = restore_checkpoint(ref.path, target)
    saved_step = meta.get("step", ref.step)
    if saved_step is None:  # plain orbax: the state's own step counter, if it has one
        saved_step = int(state["step"].addressable_data(0)) if isinstance(state, dict) and "step" in state else 0
    out = Path(out)
    if (out / str(saved_step)).exists():
        raise CheckpointError(f"{out / str(saved_step)} already exists; choose another --out")
    extra: dict[str, Any] = {"resharded_from": str(ref.path)}
    if optimizer_rules is not None:
        extra["optimizer_rules"] = as_rules(optimizer_rules).to_list()
    if meta.get("metrics"):
        extra["metrics"] = meta["metrics"]
    with CheckpointManager(
        out,
        async_=False,
        keep=0,
        rules=rules,
        config=_jsonable(config) if config else None,
        model_name=model_name,
        names=names,
        extra=extra,
    ) as mngr:
        mngr.save(int(saved_step), state, force=True)
    before = saved_mesh_str(saved)
    if meta.get("mesh"):
        before = fmt_mesh(zip(meta["mesh"]["axis_names"], meta["mesh"]["shape"], strict=True))
    return ReshardResult(
        step=int(saved_step),
        arrays=len(saved),
        source=ref.path,
        path=out.absolute() / str(saved_step),
        from_mesh=before,
        to_mesh=fmt_mesh(mesh.shape),
    )


__all__ = ["reshard_checkpoint", "reshard_target", "names_for_moments", "ReshardResult"]
