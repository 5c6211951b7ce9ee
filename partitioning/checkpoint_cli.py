"""``partitioning ckpt ls|inspect|reshard`` and checkpointing for ``partitioning train``.

    partitioning ckpt ls RUN_DIR
    partitioning ckpt inspect CKPT [--json]
    partitioning ckpt reshard CKPT --config NEW.yaml --out DIR [--set k=v] [--step N]

``CKPT`` is a run dir or checkpoints dir (latest complete step), a step dir, or
a directory written by plain orbax. Importing this module also registers the
``train`` hook (save every ``checkpoint.every`` steps, keep ``checkpoint.keep``,
resume from the latest checkpoint, save on Ctrl-C / SIGTERM) and the
``--resume`` / ``--no-resume`` flags of ``train``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from partitioning import cli


def quiet_orbax() -> None:
    """Bad input must print one line: silence orbax's absl warnings and stray asyncio noise."""
    logging.getLogger("absl").setLevel(logging.ERROR)
    previous = sys.unraisablehook

    def hook(u: Any) -> None:
        # Reads still in flight when orbax gave up on a damaged file finish on a closed loop.
        if isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value):
            return
        if "coroutine" in repr(u.object) and "orbax" in repr(getattr(u.object, "cr_code", "")):
            return
        previous(u)

    sys.unraisablehook = hook


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _mesh_str(mesh: dict[str, Any] | None) -> str:
    if not mesh:
        return "?"
    return "{" + ", ".join(f"{n}: {s}" for n, s in zip(mesh["axis_names"], mesh["shape"])) + "}"


def _rules_str(rules: list[Any] | None) -> str:
    if not rules:
        return "?"
    return ", ".join(f"{n}->{'/'.join(a) if isinstance(a, list) else a}" for n, a in rules)


def _console():
    from rich.console import Console

    return Console(width=200, highlight=False, soft_wrap=True)


# -- ls ---------------------------------------------------------------------------------------

def cmd_ls(args: argparse.Namespace) -> int:
    from rich.table import Table

    from partitioning.checkpoint_meta import META_ITEM, META_FILE, checkpoints_dir, list_steps

    steps = list_steps(args.run_dir)
    d = checkpoints_dir(args.run_dir)
    if not steps:
        print(f"{d}: no checkpoints")
        return 0
    table = Table(title=f"checkpoints in {d}")
    for col in ("step", "status", "size", "saved at", "metrics", "directory"):
        table.add_column(col, justify="right" if col in ("step", "size") else "left")
    for s in steps:
        meta: dict[str, Any] = {}
        f = s.path / META_ITEM / META_FILE
        if s.complete and f.exists():
            with contextlib.suppress(ValueError, OSError):
                meta = json.loads(f.read_text())
        when = meta.get("time") or time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(s.mtime))
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted((meta.get("metrics") or {}).items())
                            if k in ("loss", "eval_loss"))
        status = "complete" if s.complete else "INCOMPLETE (save unfinished or killed)"
        table.add_row(str(s.step), status, human_bytes(s.nbytes), when, metrics or "-", s.path.name)
    _console().print(table)
    done = [s.step for s in steps if s.complete]
    print(f"latest complete step: {done[-1] if done else 'none'}")
    return 0


# -- inspect ------------------------------------------------------------------------------------

def cmd_inspect(args: argparse.Namespace) -> int:
    from rich.table import Table

    from partitioning.checkpoint_meta import (
        describe_shape, dir_bytes, flat_saved, read_metadata, resolve_checkpoint, saved_tree, sharding_str, verify,
    )

    ref = resolve_checkpoint(args.ckpt, args.step)
    meta = read_metadata(ref)
    saved = flat_saved(saved_tree(ref))
    problems = verify(ref)
    arrays_meta = meta.get("arrays") or {}
    size = dir_bytes(ref.path)
    if args.json:
        out = {
            "path": str(ref.path), "step": meta.get("step", ref.step), "bytes": size, "problems": problems,
            "metadata": {k: v for k, v in meta.items() if k != "arrays"},
            "arrays": {p: {"shape": list(map(int, md.shape)), "dtype": str(md.dtype),
                           "sharding": sharding_str(md), "names": arrays_meta.get(p, {}).get("names")}
                       for p, md in saved.items()},
        }
        print(json.dumps(out, indent=1))
        return 0
    n_bytes = sum(int(_prod(md.shape)) * _itemsize(md.dtype) for md in saved.values())
    print(f"checkpoint {ref.path}: step {meta.get('step', ref.step)}, {len(saved)} arrays, "
          f"{human_bytes(n_bytes)} of values, {human_bytes(size)} on disk; "
          f"files: {'OK' if not problems else 'DAMAGED: ' + '; '.join(problems)}")
    if meta:
        v = meta.get("versions", {})
        print(f"saved {meta.get('time', '?')} by partitioning {v.get('partitioning', '?')} "
              f"(jax {v.get('jax', '?')}, orbax {v.get('orbax-checkpoint', '?')}); model {meta.get('model', '?')}; "
              f"mesh {_mesh_str(meta.get('mesh'))} ({(meta.get('mesh') or {}).get('devices', '?')} devices); "
              f"{meta.get('process_count', 1)} process(es)")
        print(f"rules: {_rules_str(meta.get('rules'))}")
        if meta.get("optimizer_rules"):
            print(f"optimizer rules: {_rules_str(meta['optimizer_rules'])}")
        if meta.get("metrics"):
            print("metrics: " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(meta["metrics"].items())))
        if meta.get("resharded_from"):
            print(f"resharded from: {meta['resharded_from']}")
    else:
        print("no toolkit metadata: written by plain orbax (layout only)")
    table = Table(title="arrays")
    for col in ("path", "shape", "dtype", "logical names", "saved sharding"):
        table.add_column(col, overflow="fold")
    for p, md in saved.items():
        names = arrays_meta.get(p, {}).get("names")
        table.add_row(p, describe_shape(md.shape), str(md.dtype),
                      "(" + ", ".join(str(n) for n in names) + ")" if names is not None else "-", sharding_str(md))
    _console().print(table)
    if meta.get("config") and args.config:
        import yaml

        print("config:")
        print(yaml.safe_dump(meta["config"], sort_keys=False).rstrip())
    if problems:
        from partitioning.errors import CheckpointError

        sys.stdout.flush()
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(f"checkpoint {ref.path}: {problems[0]}{more}")
    return 0


def _prod(shape: Any) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _itemsize(dtype: Any) -> int:
    import numpy as np

    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        import jax.numpy as jnp

        return jnp.dtype(dtype).itemsize


# -- reshard --------------------------------------------------------------------------------------

def reshard_target(saved: dict[str, Any], names: dict[str, Any], mesh: Any, rules: Any, optimizer_rules: Any,
                   on_indivisible: str, tree: Any) -> Any:
    """A restore target shaped like the saved tree, laid out by the new mesh and rules.

    Each array's logical names come from the checkpoint's metadata (or the new
    config's model for params); the optimizer state follows ``optimizer_rules``.
    Arrays without names are replicated.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from partitioning.checkpoint_meta import _is_md_leaf
    from partitioning.rules import as_rules
    from partitioning.shardings import path_str

    rules = as_rules(rules)
    opt_rules = as_rules(optimizer_rules) if optimizer_rules is not None else rules
    specs = {}
    # Parameters first, so an indivisible dimension is reported as at init.
    for p in sorted(saved, key=lambda p: not p.startswith("params")):
        shape = tuple(int(s) for s in saved[p].shape)
        n = names.get(p)
        specs[p] = PartitionSpec()
        if n is not None and len(n) == len(shape):
            table = opt_rules if p.startswith("opt_state") else rules
            specs[p] = table.resolve(tuple(tuple(x) if isinstance(x, list) else x for x in n), shape, mesh,
                                     on_indivisible=on_indivisible, path=p)

    def one(kp: Any, md: Any) -> jax.ShapeDtypeStruct:
        shape = tuple(int(s) for s in md.shape)
        return jax.ShapeDtypeStruct(shape, md.dtype, sharding=NamedSharding(mesh, specs[path_str(kp)]))

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_md_leaf)


def cmd_reshard(args: argparse.Namespace) -> int:
    cfg = cli.load(args)  # devices for the *new* layout, before any jax computation
    import jax

    from partitioning.checkpoint import CheckpointManager, _check_fits, _names_by_path, restore_checkpoint
    from partitioning.checkpoint_meta import (
        flat_saved, read_metadata, resolve_checkpoint, saved_tree,
    )
    from partitioning.errors import CheckpointError

    ref = resolve_checkpoint(args.ckpt, args.step)
    meta = read_metadata(ref)
    tree = saved_tree(ref)
    saved = flat_saved(tree)
    mesh = cli.mesh_for(cfg)
    cfg.rules.validate(mesh)
    names = {p: a["names"] for p, a in (meta.get("arrays") or {}).items() if a.get("names") is not None}
    if any(p.startswith("params/") for p in saved):
        # The new config must describe the same model: same parameter paths and shapes.
        _, variables = cli.abstract_model(cfg)
        params = jax.tree.map(lambda x: x.value if hasattr(x, "names") else x, variables["params"],
                              is_leaf=lambda x: hasattr(x, "names") and hasattr(x, "value"))
        _check_fits(ref, {p: md for p, md in saved.items() if p.startswith("params/")}, {"params": params}, False)
        for p, n in _names_by_path({"params": variables["params"]}).items():
            names.setdefault(p, n)
    _names_for_moments(saved, names)
    target = reshard_target(saved, names, mesh, cfg.rules, cfg.optimizer_rules, cfg.on_indivisible, tree)
    state = restore_checkpoint(ref.path, target)
    step = meta.get("step", ref.step)
    if step is None:  # plain orbax: the state's own step counter, if it has one
        step = int(state["step"].addressable_data(0)) if isinstance(state, dict) and "step" in state else 0
    out = Path(args.out)
    if (out / str(step)).exists():
        raise CheckpointError(f"{out / str(step)} already exists; choose another --out")
    extra = {"resharded_from": str(ref.path)}
    if cfg.optimizer_rules is not None:
        extra["optimizer_rules"] = cfg.optimizer_rules.to_list()
    if meta.get("metrics"):
        extra["metrics"] = meta["metrics"]
    with CheckpointManager(out, async_=False, keep=0, rules=cfg.rules, config=_jsonable(cfg.raw),
                           model_name=cfg.model_name, names=names, extra=extra) as mngr:
        mngr.save(int(step), state, force=True)
    before = _mesh_str(meta.get("mesh")) if meta.get("mesh") else _saved_mesh_str(saved)
    after = "{" + ", ".join(f"{k}: {v}" for k, v in mesh.shape.items()) + "}"
    print(f"resharded step {step}: {len(saved)} arrays from mesh {before} to {after} "
          f"(rules from {cfg.path}) -> {out.absolute() / str(step)}")
    return 0


def _names_for_moments(saved: dict[str, Any], names: dict[str, Any]) -> None:
    """Optimizer moments without recorded names take their parameter's (``opt_state/0/mu/<param>``).

    Checkpoints written by plain orbax carry no logical names; optax moments
    mirror the params tree, so a path ending in a parameter's path with the
    parameter's shape is laid out like that parameter.
    """
    params = {p[len("params/"):]: p for p in names if p.startswith("params/")}
    for p, md in saved.items():
        if p in names or not p.startswith("opt_state/"):
            continue
        parts = p.split("/")
        for i in range(1, len(parts)):
            q = params.get("/".join(parts[i:]))
            if q is not None and q in saved and tuple(saved[q].shape) == tuple(md.shape):
                names[p] = names[q]
                break


def _saved_mesh_str(saved: dict[str, Any]) -> str:
    from partitioning.checkpoint_meta import sharding_str

    for md in saved.values():
        text = sharding_str(md)
        if " on {" in text:
            return text.split(" on ", 1)[1]
    return "(unknown)"


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


# -- registration -----------------------------------------------------------------------------------

def _ckpt_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="ckpt_cmd", required=True)
    ls = sub.add_parser("ls", help="steps, sizes, times, and which saves completed")
    ls.add_argument("run_dir", help="a run dir (RUN_DIR/checkpoints) or a checkpoints dir")
    ins = sub.add_parser("inspect", help="arrays with shapes, dtypes, saved shardings, and the metadata")
    ins.add_argument("ckpt", help="run dir (latest step), checkpoints dir, step dir, or plain orbax dir")
    ins.add_argument("--step", type=int, default=None, help="a step other than the latest")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--config", action="store_true", help="also print the saved run config")
    rs = sub.add_parser("reshard", help="rewrite a checkpoint for another mesh / rule table (offline)")
    rs.add_argument("ckpt", help="run dir (latest step), checkpoints dir, step dir, or plain orbax dir")
    rs.add_argument("--config", required=True, help="run config with the new mesh and rules")
    rs.add_argument("--out", required=True, help="checkpoints dir to write (DIR/STEP/...)")
    rs.add_argument("--step", type=int, default=None, help="a step other than the latest")
    rs.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    rs.add_argument("--devices", type=int, default=None, help="number of devices (simulated on the CPU)")


@cli.command("ckpt", _ckpt_args)
def cmd_ckpt(args: argparse.Namespace) -> int:
    """Checkpoints: ls RUN_DIR | inspect CKPT | reshard CKPT --config NEW.yaml --out DIR."""
    quiet_orbax()
    return {"ls": cmd_ls, "inspect": cmd_inspect, "reshard": cmd_reshard}[args.ckpt_cmd](args)


# -- train integration ---------------------------------------------------------------------------------

def checkpoint_hook(cfg: Any, trainer: Any, run_dir: Path, resume: bool | None = None, log: Any = None):
    """The :class:`CheckpointHook` for a run config's ``checkpoint:`` section.

    ``resume``: None resumes when a checkpoint exists, True requires one, False
    starts over (existing checkpoints are moved aside, never deleted).
    """
    import jax

    from partitioning.checkpoint import CheckpointHook, CheckpointManager, abstract_target
    from partitioning.checkpoint_meta import list_steps
    from partitioning.errors import CheckpointError

    c = cfg.checkpoint
    directory = Path(c.dir) if c.dir else Path(run_dir) / "checkpoints"
    say = log or ((lambda m: print(m, flush=True)) if jax.process_index() == 0 else (lambda m: None))
    if resume is False and directory.exists() and any(directory.iterdir()):
        aside = directory.with_name(f"{directory.name}.prev-{time.strftime('%Y%m%d-%H%M%S')}")
        if jax.process_index() == 0:
            directory.rename(aside)
        say(f"checkpoint: --no-resume: moved existing checkpoints to {aside}")
    if resume is True and not any(s.complete for s in (list_steps(directory) if directory.is_dir() else [])):
        raise CheckpointError(f"--resume: no complete checkpoint in {directory}")
    extra = {"optimizer_rules": cfg.optimizer_rules.to_list()} if cfg.optimizer_rules is not None else None
    mngr = CheckpointManager(directory, every=c.every, keep=c.keep, keep_best=c.keep_best, async_=c.async_,
                             rules=cfg.rules, config=_jsonable(cfg.raw), model_name=cfg.model_name,
                             abstract=trainer.abstract_state, extra=extra)
    target = abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    return CheckpointHook(mngr, target=target, resume=resume is not False, log=say)
