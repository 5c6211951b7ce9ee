"""``partitioning ckpt ls|inspect|reshard|export-hf``: checkpoints from the command line.

    partitioning ckpt ls RUN_DIR
    partitioning ckpt inspect CKPT [--json]
    partitioning ckpt reshard CKPT --config NEW.yaml --out DIR [--set k=v] [--step N]   (e.g. configs/tp.yaml)
    partitioning ckpt export-hf RUN_DIR OUT_DIR [--step N] [--force] [--merge]   (see partitioning.cli.export_hf)

``CKPT`` is a run dir or checkpoints dir (latest complete step), a step dir, or
a directory written by plain orbax.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from rich.table import Table

from partitioning.checkpoint.checksum import verify_checksums
from partitioning.checkpoint.diagnose import verify
from partitioning.checkpoint.disk import (
    META_FILE,
    META_ITEM,
    checkpoints_dir,
    dir_bytes,
    flat_saved,
    list_steps,
    read_metadata,
    resolve_checkpoint,
    saved_tree,
    sharding_str,
    step_damage,
    step_flag,
)
from partitioning.checkpoint.frozen import frozen_path, frozen_ref
from partitioning.checkpoint.reshard import reshard_checkpoint
from partitioning.cli import export_hf
from partitioning.cli.args import leaf, load_with_devices
from partitioning.cli.render import console
from partitioning.config.build import RULES_KEY, abstract_model, at_key, mesh_from_config
from partitioning.config.run import jsonable
from partitioning.errors import CheckpointError, ShardingError
from partitioning.fmt import fmt_bytes, fmt_mesh, fmt_rules, fmt_shape
from partitioning.layout import tree_layouts
from partitioning.yamlfile import dump_yaml

HELP = "checkpoints: ls RUN_DIR | inspect CKPT | reshard CKPT --config NEW.yaml --out DIR | export-hf RUN_DIR OUT_DIR"
EXAMPLES = """examples:
  partitioning ckpt ls runs/quickstart
  partitioning ckpt reshard runs/quickstart --config configs/tp.yaml --out runs/tp/checkpoints
  partitioning ckpt export-hf runs/hf_tiny exported/hf_tiny"""


def _mesh_str(mesh: dict[str, Any] | None) -> str:
    return fmt_mesh(zip(mesh["axis_names"], mesh["shape"], strict=True)) if mesh else "?"


def cmd_ls(args: argparse.Namespace) -> int:
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
        metrics = ", ".join(
            f"{k} {v:.4g}" for k, v in sorted((meta.get("metrics") or {}).items()) if k in ("loss", "eval_loss")
        )
        status = (
            "complete"
            if s.complete
            else f"DAMAGED ({s.damage})"
            if s.damage
            else "INCOMPLETE (save unfinished or killed)"
        )
        table.add_row(str(s.step), status, fmt_bytes(s.nbytes), when, metrics or "-", s.path.name)
    console().print(table)
    done = [s.step for s in steps if s.complete]
    print(f"latest complete step: {done[-1] if done else 'none'}")
    return 0


# -- inspect ---------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    # A run with a small `keep` prunes steps while they are read: that step is gone, not damaged.
    for attempt in range(3):
        ref = resolve_checkpoint(args.ckpt, args.step)
        try:
            found = _read(ref, args)
        except Exception as e:
            if _pruned(ref):
                if args.step is None and ref.path != Path(args.ckpt) and attempt < 2:
                    continue  # the run's newer step is the latest now: inspect that one
                raise CheckpointError(
                    f"checkpoint {ref.path}: pruned during inspection (the run's checkpoint.keep removed it while "
                    f"it was read; not damage); inspect a step the run keeps"
                ) from None
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"checkpoint {ref.path}: cannot read it: {' '.join(str(e).split())[:200]}") from None
        return _show(ref, args, *found)
    raise AssertionError("unreachable")


def _pruned(ref: Any) -> bool:
    """The step directory went away (renamed into _pruned, then deleted) while it was read."""
    return ref.step is not None and not ref.path.exists()


def _read(ref: Any, args: argparse.Namespace) -> tuple[Any, Any, list[str]]:
    meta = read_metadata(ref)
    saved = flat_saved(saved_tree(ref))
    damage = step_damage(ref.path) if ref.path != ref.item else None
    problems = [damage] if damage else verify(ref)
    if not problems and not args.no_verify:
        problems = verify_checksums(ref)  # reads every array back
    split = frozen_ref(ref)
    if split is not None:  # the frozen params this step refers to are checked too
        fixed = frozen_path(ref, split)
        try:
            fref = resolve_checkpoint(fixed)
            found = verify(fref) or ([] if args.no_verify else verify_checksums(fref))
        except CheckpointError as e:
            found = [str(e)]
        problems = problems + [f"frozen params {fixed}: {p}" for p in found]
    if problems and _pruned(ref):
        raise CheckpointError("pruned")  # gone while read: not damage
    return meta, saved, problems


def _show(ref: Any, args: argparse.Namespace, meta: Any, saved: Any, problems: list[str]) -> int:
    split = frozen_ref(ref)
    arrays_meta = meta.get("arrays") or {}
    size = dir_bytes(ref.path)
    if args.json:
        out = {
            "path": str(ref.path),
            "step": meta.get("step", ref.step),
            "bytes": size,
            "problems": problems,
            "metadata": {k: v for k, v in meta.items() if k != "arrays"},
            "arrays": {
                p: {
                    "shape": list(map(int, md.shape)),
                    "dtype": str(md.dtype),
                    "sharding": sharding_str(md),
                    "names": arrays_meta.get(p, {}).get("names"),
                }
                for p, md in saved.items()
            },
        }
        print(json.dumps(out, indent=1))
        if problems:  # the JSON says what; the exit status says it is damaged
            sys.stdout.flush()
            raise CheckpointError(f"checkpoint {ref.path}: {problems[0]}")
        return 0
    n_bytes = sum(math.prod(int(s) for s in md.shape) * _itemsize(md.dtype) for md in saved.values())
    print(
        f"checkpoint {ref.path}: step {meta.get('step', ref.step)}, {len(saved)} arrays, "
        f"{fmt_bytes(n_bytes)} of values, {fmt_bytes(size)} on disk; "
        f"files: {'OK' if not problems else 'DAMAGED: ' + '; '.join(problems)}"
    )
    if meta:
        v = meta.get("versions", {})
        print(
            f"saved {meta.get('time', '?')} by partitioning {v.get('partitioning', '?')} "
            f"(jax {v.get('jax', '?')}, orbax {v.get('orbax-checkpoint', '?')}); model {meta.get('model', '?')}; "
            f"mesh {_mesh_str(meta.get('mesh'))} ({(meta.get('mesh') or {}).get('devices', '?')} devices); "
            f"{meta.get('process_count', 1)} process(es)"
        )
        print(f"rules: {fmt_rules(meta.get('rules'))}")
        if meta.get("optimizer_rules"):
            print(f"optimizer rules: {fmt_rules(meta['optimizer_rules'])}")
        if meta.get("metrics"):
            print("metrics: " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(meta["metrics"].items())))
        if meta.get("resharded_from"):
            print(f"resharded from: {meta['resharded_from']}")
        if split is not None:
            print(
                f"frozen params: {len(split.get('paths', []))} arrays in {frozen_path(ref, split)} (written once "
                f"per run; this step holds the trainable params and their optimizer state)"
            )
    else:
        print("no toolkit metadata: written by plain orbax (layout only)")
    table = Table(title="arrays")
    for col in ("path", "shape", "dtype", "logical names", "saved sharding"):
        table.add_column(col, overflow="fold")
    for p, md in saved.items():
        names = arrays_meta.get(p, {}).get("names")
        table.add_row(
            p,
            fmt_shape(md.shape),
            str(md.dtype),
            "(" + ", ".join(str(n) for n in names) + ")" if names is not None else "-",
            sharding_str(md),
        )
    console().print(table)
    if meta.get("config") and args.config:
        print("config:")
        print(dump_yaml(meta["config"]).rstrip())
    if problems:
        sys.stdout.flush()
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(f"checkpoint {ref.path}: {problems[0]}{more}")
    return 0


def _itemsize(dtype: Any) -> int:
    return jnp.dtype(dtype).itemsize


# -- reshard --------------------------------------------------------------------------------------


def cmd_reshard(args: argparse.Namespace) -> int:
    cfg = load_with_devices(args)  # devices for the *new* layout, before any jax computation
    mesh = mesh_from_config(cfg)  # its errors at mesh.shape's file:line
    _, variables = abstract_model(cfg)
    # An indivisible parameter is named by its path, as `partitioning check` names it for this config.
    r = _reshard(args, cfg, mesh, variables)
    print(
        f"resharded step {r.step}: {r.arrays} arrays from mesh {r.from_mesh} to {r.to_mesh} "
        f"({cfg.rules_label()}) -> {Path(args.out) / str(r.step)}"  # the --out given, as typed
    )
    return 0


def _reshard(args: argparse.Namespace, cfg: Any, mesh: Any, variables: Any) -> Any:
    try:  # every array that does not divide, at the config's rules, as `check` says it
        tree_layouts(
            {"params": variables["params"]},
            mesh,
            cfg.rules,
            on_indivisible=cfg.on_indivisible,
            warn_replicated=False,
            annotations=cfg.annotations,
        )
        return _reshard_to(args, cfg, mesh, variables)
    except ShardingError as e:
        raise at_key(cfg, e, RULES_KEY) from None


def _reshard_to(args: argparse.Namespace, cfg: Any, mesh: Any, variables: Any) -> Any:
    return reshard_checkpoint(
        args.ckpt,
        args.out,
        mesh,
        cfg.rules,
        optimizer_rules=cfg.optimizer_rules,
        on_indivisible=cfg.on_indivisible,
        step=args.step,
        abstract_params=variables["params"],
        config=jsonable(cfg.raw),
        model_name=cfg.model_name,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="ckpt_cmd", metavar="{ls,inspect,reshard,export-hf}")
    ls = leaf(sub, "ls", "list a run's checkpoints: steps, sizes, times, metrics, and which saves completed")
    ls.add_argument("run_dir", help="a run dir (RUN_DIR/checkpoints) or a checkpoints dir")
    ins = leaf(sub, "inspect", "a checkpoint's arrays with shapes, dtypes, saved shardings, and its metadata")
    ins.add_argument("ckpt", help="run dir (latest step), checkpoints dir, step dir, or plain orbax dir")
    ins.add_argument("--step", type=int, default=None, help="a step other than the latest")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--config", action="store_true", help="also print the saved run config")
    ins.add_argument(
        "--no-verify", action="store_true", help="skip reading every array back against its recorded checksum"
    )
    rs = leaf(sub, "reshard", "rewrite a checkpoint for another mesh / rule table (offline)")
    rs.add_argument("ckpt", help="run dir (latest step), checkpoints dir, step dir, or plain orbax dir")
    rs.add_argument("--config", required=True, help="run config with the new mesh and rules")
    rs.add_argument("--out", required=True, help="checkpoints dir to write (DIR/STEP/...)")
    rs.add_argument("--step", type=int, default=None, help="a step other than the latest")
    rs.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    rs.add_argument("--devices", type=int, default=None, help="number of devices (simulated on the CPU)")
    export_hf.add_parser(sub)


def run(args: argparse.Namespace) -> int:
    if args.ckpt_cmd is None:
        return args.print_help()
    commands = {"ls": cmd_ls, "inspect": cmd_inspect, "reshard": cmd_reshard, "export-hf": export_hf.cmd_export_hf}
    with step_flag("--step"):  # a damaged step's advice names the flag these commands take
        return commands[args.ckpt_cmd](args)
