"""Whether a run is the continuation of the checkpoint in its run dir, or another experiment that must say so.

A run resumes from the latest checkpoint of its ``run_dir`` by default. That
is right when the config is the one that wrote the checkpoint, with more
``train.steps``; it is wrong — and used to pass silently — when the config is
another experiment pointed at the same run dir (another model or optimizer,
e.g. ``--set optimizer.lr=0.001``) or when the checkpoint already holds every
step asked for. Checked by the pre-flight, so ``check`` and ``train`` agree and
nothing is written:

- **another model or optimizer** than the checkpoint's (every option resolved,
  defaults included; ``remat`` aside, it only trades memory for compute): an
  error unless ``--resume`` asks to continue the checkpoint with this config;
- **nothing to train** (``train.steps`` at or below the saved step): an error,
  whatever ``--resume`` says: raise ``train.steps``, start over, or use
  another ``run_dir``;
- **another layout** (rules, mesh) or other data: a genuine continuation
  (checkpoints restore onto any layout); one line says what changed.

Each checkpoint records the resolved config it was trained with
(:func:`run_record`, the metadata key ``resolved_config``).

Example::

    >>> from partitioning.config.resume import RECORD_KEY, compare_run, run_record
    >>> sizes = {"data": 1, "fsdp": 8, "tensor": 1}
    >>> meta = {RECORD_KEY: run_record(pt.load_config("configs/quickstart.yaml"), sizes)}   # saved at step 200
    >>> compare_run(pt.load_config("configs/quickstart.yaml"), meta, step=200, resume=None, sizes=sizes)[0]
    'configs/quickstart.yaml:40: train.steps: the checkpoint in runs/quickstart is already at step 200 (train.steps \
is 200): nothing to train. To continue it raise train.steps (--set train.steps=400); otherwise give this ...'
    >>> cfg = pt.load_config("configs/quickstart.yaml", ["optimizer.lr=0.001", "train.steps=400"])
    >>> problem, note = compare_run(cfg, meta, step=200, resume=None, sizes=sizes)
    >>> problem
    'runs/quickstart: the checkpoint at step 200 was trained with another optimizer (lr 0.003 -> 0.001), so this run \
is another experiment: give this run its own run_dir (--set run_dir=runs/NAME), or start over with --no-resume ...'
    >>> compare_run(cfg, meta, step=200, resume=True, sizes=sizes)   # --resume: continue it with the new lr
    (None, 'resume: step 200 continues with another config: optimizer: lr 0.003 -> 0.001')
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from partitioning.config.build import model_options_resolved
from partitioning.config.schema import Config
from partitioning.fmt import fmt_mesh

RECORD_KEY = "resolved_config"
# Model options that change how a step is computed, not what it computes.
COMPUTE_ONLY = {"remat"}


def run_record(cfg: Config, sizes: Mapping[str, int]) -> dict[str, Any]:
    """The resolved config a checkpoint records (JSON data): what :func:`compare_run` compares against."""
    import json

    return json.loads(json.dumps(cfg.resolved(dict(sizes), model_options_resolved(cfg)), default=str))


def _diff(saved: Any, now: Any, skip: Collection[str] = frozenset()) -> list[str]:
    """``key old -> new`` for each differing key of two flat-ish mappings (nested values compared whole)."""
    if not isinstance(saved, Mapping) or not isinstance(now, Mapping):
        return [] if saved == now else [f"{saved!r} -> {now!r}"]
    keys = [k for k in dict.fromkeys([*saved, *now]) if k not in skip]
    return [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]


def _fmt_rules(value: Any) -> str:
    # A table is recorded as its pairs, or {extra: pairs, batch_axes, follows} (Rules.to_config).
    if isinstance(value, Mapping) and isinstance(value.get("extra"), list):
        return f"{len(value['extra'])} rules"
    return f"{len(value)} rules" if isinstance(value, list) else str(value)


def compare_run(
    cfg: Config, meta: Mapping[str, Any], step: int, resume: bool | None, sizes: Mapping[str, int]
) -> tuple[str | None, str | None]:
    """(the problem that stops this run, or None; a line saying what changed, or None).

    ``meta``: the checkpoint's metadata; ``step``: its step; ``resume``: the
    ``--resume`` flag (None: resume if there is a checkpoint); ``sizes``: this
    run's mesh.
    """
    run_dir = cfg.run_dir
    fresh = (
        f"give this run its own run_dir (--set run_dir=runs/NAME), or start over with --no-resume (the old run "
        f"moves to {run_dir}/previous/)"
    )
    saved = meta.get(RECORD_KEY)
    if not isinstance(saved, Mapping):
        saved = {}  # a checkpoint from before the record (or plain orbax): only its shapes and steps are checked
    now = run_record(cfg, sizes)
    changed = {
        "model": _diff(saved["model"], now["model"], COMPUTE_ONLY) if "model" in saved else [],
        "optimizer": _diff(saved["optimizer"], now["optimizer"]) if "optimizer" in saved else [],
    }
    what = [k for k, v in changed.items() if v]
    if what and resume is not True:
        detail = "; ".join(", ".join(changed[k]) if len(what) == 1 else f"{k}: {', '.join(changed[k])}" for k in what)
        return (
            f"{run_dir}: the checkpoint at step {step} was trained with another {' and '.join(what)} ({detail}), "
            f"so this run is another experiment: {fresh}; or --resume to continue the checkpoint with this config",
            None,
        )
    if cfg.train.steps <= step:  # the same experiment (or --resume), with nothing left to do
        return (
            f"{cfg.where('train', 'steps')}: the checkpoint in {run_dir} is already at step {step} (train.steps is "
            f"{cfg.train.steps}): nothing to train. To continue it raise train.steps "
            f"(--set train.steps={max(2 * step, step + 1)}); otherwise {fresh}",
            None,
        )
    notes = [f"{k}: {', '.join(changed[k])}" for k in what]
    layout = []
    if "rules" in saved and saved["rules"] != now["rules"]:
        layout.append(f"rules {_fmt_rules(saved.get('rules'))} -> {_fmt_rules(now['rules'])}")
    old_mesh = (saved.get("mesh") or {}).get("shape")
    if old_mesh != now["mesh"]["shape"] and isinstance(old_mesh, Mapping):
        layout.append(f"mesh {fmt_mesh(old_mesh)} -> {fmt_mesh(now['mesh']['shape'])}")
    if layout:
        notes.append(f"layout: {', '.join(layout)} (the checkpoint is resharded as it is read)")
    if not notes:
        return None, None
    return None, f"resume: step {step} continues with another config: " + "; ".join(notes)


__all__ = ["run_record", "compare_run", "RECORD_KEY"]
