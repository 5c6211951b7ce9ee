"""Config -> the objects of a run: its batches, its checkpoint hook, its trackers.

Built on :mod:`partitioning.config.build` (model, mesh, trainer); like it,
every error is re-raised at the config key it comes from.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
    ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
    >>> from partitioning.config.build import mesh_from_config, trainer_from_config
    >>> from partitioning.config.run import data_from_config
    >>> cfg = pt.load_config(path)
    >>> trainer = trainer_from_config(cfg, mesh_from_config(cfg))
    >>> corpus, train, evals = data_from_config(cfg, trainer)
    >>> train.batch_at(0)["inputs"].shape
    (8, 16)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax

from partitioning.checkpoint.hook import CheckpointHook, prepare_directory
from partitioning.checkpoint.manager import CheckpointManager
from partitioning.checkpoint.restore import abstract_target
from partitioning.config.build import dataset_from_config
from partitioning.config.hf import hf_record, tokenizer_from_config
from partitioning.config.resume import RECORD_KEY, run_record
from partitioning.config.schema import Config
from partitioning.config.targets import TARGET
from partitioning.data.corpus import Corpus
from partitioning.data.tokenize import load_tokenizer
from partitioning.errors import ConfigError, DataError
from partitioning.train.hooks import JsonlLogger
from partitioning.train.step import Trainer
from partitioning.train.trackers import TensorBoardLogger, WandbLogger


def _model_vocab(model: Any) -> Any:
    module = getattr(model, "module", model)
    if getattr(module, "vocab_size", None) is not None:
        return module.vocab_size
    factory = getattr(model, "factory", None)
    return getattr(factory, "kwargs", {}).get("vocab_size")


def _check_vocab(cfg: Config, trainer: Trainer, corpus: Corpus) -> None:
    """Every token below the model's vocab_size (text: vocab_size >= 256), before anything compiles."""
    vocab = _model_vocab(trainer.model)
    if vocab is None:
        return
    here = cfg.where("model", "hf" if cfg.model_hf is not None else "vocab_size")
    if corpus.vocab is not None:
        if vocab < corpus.vocab and corpus.tokenizer is not None:
            raise ConfigError(
                f"{here}: the model's vocab_size is {vocab}, but the tokenizer {corpus.tokenizer.path} has "
                f"{corpus.vocab:,} tokens; name the model's own tokenizer with data.tokenizer"
            )
        if vocab < corpus.vocab:
            raise ConfigError(f"{here}: the data is bytes, so vocab_size must be >= {corpus.vocab}, got {vocab}")
        return
    for split, key in (("train", "path"), ("eval", "eval_path" if cfg.data.eval_path else "path")):
        bad = corpus.tokens(split).out_of_range(int(vocab))
        if bad is not None:
            token, name, index = bad
            raise DataError(
                f"{cfg.where('data', key)}: {name}: token {token} at index {index:,} is outside the "
                f"model's vocabulary [0, {vocab}) ({here})"
            )


def check_loss_tokens(cfg: Config, dataset: Any, evaluating: bool) -> str | None:
    """Instruction data whose loss would count no token is refused (one line at ``train.seq_len``, or at the
    data for rows without an answer); returns the warning when truncation cuts more than
    ``data.max_truncated_answers`` of the answer tokens (None: it does not)."""
    if not hasattr(dataset, "loss_tokens"):
        return None
    n, mode = cfg.train.seq_len, cfg.data.truncation or "right"
    warning = None
    for split in ("train", "eval") if evaluating else ("train",):
        report = dataset.loss_tokens(split, n)
        where = dataset.eval_source if split == "eval" and dataset.eval_source else dataset.source
        key = ("data", "eval_path") if split == "eval" and cfg.data.eval_path else ("data", "path")
        if report.answers == 0:
            raise DataError(
                f"{cfg.where(*key)}: {where} ({split}): none of its {report.examples:,} examples has a token for the "
                "loss to count: no row has an assistant turn or a completion (the loss counts only the answers; "
                "ShareGPT's human / gpt roles are user / assistant; data.train_on_prompt: true counts every token)"
            )
        other = "left or right" if mode == "drop" else "left or drop"
        fixes = f"raise train.seq_len, or set data.truncation: {other}"
        if report.kept == 0:
            above = f" above {report.longest_prompt:,}" if report.longest_prompt >= n else ""
            if mode == "drop" and report.shortest > n + 1:  # an example is kept at seq_len >= its tokens - 1
                above = f" to {report.shortest - 1:,} or more"
            # Only the truncations that would leave the loss a token: drop keeps none when every example is long.
            works = [m for m in ("left", "drop", "right") if m != mode and dataset.loss_tokens(split, n, m).kept > 0]
            raise DataError(
                f"{cfg.where('train', 'seq_len')}: {where} ({split}): the loss would count no token: "
                f"{report.describe(n)}; raise train.seq_len{above}"
                + (f", or set data.truncation: {' or '.join(works)}" if works else "")
            )
        if split == "train" and report.share_cut > cfg.data.max_truncated_answers:
            warning = (
                f"data: {where} ({split}): {report.describe(n)}, more than data.max_truncated_answers "
                f"{cfg.data.max_truncated_answers:g} (truncation: {mode}); {fixes}"
            )
    return warning


def _batches_at_key(cfg: Config, split: str, make: Any) -> Any:
    try:
        return make()
    except DataError as e:
        d = cfg.data
        if d.target is not None:
            raise DataError(f"{cfg.where('data')}: {e}") from None
        key = (
            ("data", "eval_path")
            if split == "eval" and d.eval_path
            else ("data", "path")
            if d.path
            else ("train", "batch_size")
        )
        raise DataError(f"{cfg.where(*key)}: {e}") from None


def data_from_config(cfg: Config, trainer: Trainer, dataset: Any = None) -> tuple[Any, Any, Any]:
    """(dataset, train batches, eval-batches callable or None) for a config's ``data:`` section.

    Every data problem (too few tokens for a batch, a token outside the
    model's vocabulary) is one error at the config key it comes from.
    """
    t = cfg.train
    dataset = dataset if dataset is not None else dataset_from_config(cfg)
    warning = None
    if isinstance(dataset, Corpus):
        _check_vocab(cfg, trainer, dataset)
        warning = check_loss_tokens(cfg, dataset, t.eval_batches > 0)
        train = _batches_at_key(
            cfg,
            "train",
            lambda: dataset.batches("train", t.batch_size, t.seq_len, trainer.batch_sharding, seed=cfg.data.seed),
        )
        ev = (
            _batches_at_key(
                cfg, "eval", lambda: dataset.batches("eval", t.batch_size, t.seq_len, trainer.batch_sharding, seed=0)
            )
            if t.eval_batches > 0
            else None
        )
    else:
        train = _batches_at_key(
            cfg, "train", lambda: dataset.batches("train", t.batch_size, trainer.batch_shardings, seed=cfg.data.seed)
        )
        # A fixed eval order, independent of the train seed, keeps eval losses comparable.
        ev = (
            _batches_at_key(cfg, "eval", lambda: dataset.batches("eval", t.batch_size, trainer.batch_shardings, seed=0))
            if t.eval_batches > 0
            else None
        )
    if warning is not None:
        train.warning = warning  # said by `check` and `train` alike (partitioning.config.preflight)
    if cfg.data.log_batches:
        from partitioning.data.order import LoggedBatches

        train = LoggedBatches(train, Path(cfg.run_dir) / f"batches.{jax.process_index()}.jsonl")
    if ev is None:
        return dataset, train, None
    return dataset, train, lambda: (ev.batch_at(i) for i in range(t.eval_batches))


def data_position(cfg: Config) -> dict[str, Any]:
    """What a checkpoint records of the data: the batch of step ``k`` is a pure function of these and ``k``,
    so the step saved with the checkpoint is the data's position."""
    d, t = cfg.data, cfg.train
    where = (
        {TARGET: d.target.get(TARGET)}
        if d.target is not None
        else {"source": d.source, "path": d.path, "eval_path": d.eval_path, "dtype": d.dtype}
    )
    out = {"position": "step", **where, "seed": d.seed, "batch_size": t.batch_size, "seq_len": t.seq_len}
    if d.target is None and d.format != "text":  # instruction rows: how they are cut and packed
        packing = True if d.packing is None else d.packing
        out.update(format=d.format, train_on_prompt=d.train_on_prompt, packing=packing, chat_template=d.chat_template)
        if d.truncation not in (None, "right"):  # another way of cutting: other batches (right: as before it existed)
            out["truncation"] = d.truncation
    tokenizer = tokenizer_from_config(cfg)
    if tokenizer is not None:  # text is these tokens: another tokenizer, other batches
        out["tokenizer"] = load_tokenizer(tokenizer).digest[:16]
    return out


def data_resume_note(cfg: Config, saved: dict[str, Any] | None) -> str | None:
    """A line saying how this run's data differs from the checkpoint's (None: the same batches follow)."""
    if not saved:
        return None
    now = data_position(cfg)
    changed = [
        f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(now) | set(saved)) if saved.get(k) != now.get(k)
    ]
    if not changed:
        return None
    return (
        f"data: changed since the checkpoint ({'; '.join(changed)}): the steps from here on see other "
        f"batches than the saved run would have"
    )


def jsonable(x: Any) -> Any:
    """Plain JSON data (what a checkpoint's metadata can hold) for a config mapping."""
    return json.loads(json.dumps(x, default=str))


def checkpoint_hook_from_config(
    cfg: Config, trainer: Trainer, run_dir: Path, resume: bool | None = None, log: Any = None, step: int | None = None
) -> CheckpointHook:
    """The :class:`CheckpointHook` for a run config's ``checkpoint:`` section.

    ``resume``: None resumes when a checkpoint exists, True requires one, False
    starts over (existing checkpoints are moved aside, never deleted). ``step``
    resumes from that step instead of the latest (``--resume-from``).
    """
    c = cfg.checkpoint
    directory = prepare_directory(Path(c.dir) if c.dir else Path(run_dir) / "checkpoints", resume, log)
    extra: dict[str, Any] = {"data": data_position(cfg), RECORD_KEY: run_record(cfg, dict(trainer.mesh.shape))}
    if cfg.optimizer_rules is not None:
        extra["optimizer_rules"] = cfg.optimizer_rules.to_list()
    if cfg.model_hf is not None:  # what `ckpt export-hf` needs to write the run back out
        extra["hf"] = hf_record(cfg)
    mngr = CheckpointManager(
        directory,
        every=c.every,
        keep=c.keep,
        keep_best=c.keep_best,
        async_=c.async_,
        rules=cfg.rules,
        config=jsonable(cfg.raw),
        model_name=cfg.model_name,
        abstract=trainer.abstract_state,
        extra=extra,
        frozen=trainer.frozen,
    )
    target = abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    # checkpoint.verify: the parts by the pre-flight, the bytes (crc32c) as the restore reads them.
    return CheckpointHook(
        mngr, target=target, resume=resume is not False, log=log, on_error=c.on_error, verify=c.verify, step=step
    )


def trackers_from_config(cfg: Config, run_dir: Path, config: Any = None) -> tuple[JsonlLogger, list[Any]]:
    """(the metrics logger, the other trackers' hooks) for ``train.tracker``.

    The :class:`JsonlLogger` always keeps the records (the loss plot and the
    summary read them); it writes ``RUN_DIR/metrics.jsonl`` only with ``jsonl``.
    ``config`` (the resolved config) goes to wandb.
    """
    kinds = cfg.train.tracker
    logger = JsonlLogger(Path(run_dir) / "metrics.jsonl" if "jsonl" in kinds else None)
    hooks: list[Any] = []
    if "tensorboard" in kinds:
        hooks.append(TensorBoardLogger(Path(run_dir) / "tensorboard"))
    if "wandb" in kinds:
        hooks.append(WandbLogger(run_dir, config=config))
    return logger, hooks


__all__ = [
    "check_loss_tokens",
    "data_from_config",
    "data_position",
    "data_resume_note",
    "checkpoint_hook_from_config",
    "trackers_from_config",
    "jsonable",
]
