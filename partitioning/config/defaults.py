"""Every ``auto`` default, resolved at run start: the fastest choice that fits, measured where it can be.

The defaults that trade speed for memory, in the order they are resolved (each priced with the ones
before it resolved):

- ``model.remat`` (:mod:`partitioning.config.remat`): the remat policies the model takes;
- ``model.context_parallel``: ``ring`` or ``all_gather`` when the rules split ``length`` over devices
  (:mod:`partitioning.parallel.context`);
- ``model.attention``: the einsums (``xla``) or cuDNN's kernel where it applies (a GPU, a 16-bit dtype);
- ``train.grad_accum``: the micro-batch counts the batch axes divide (1 unless it does not fit);
- ``train.microbatches``: the pipeline's micro-batches (``S, 2S, 4S, 8S``) with a ``stage`` axis.

An option the config leaves unset (or writes as ``auto``) is decided by
:func:`partitioning.train.trial.decide`: tune's estimate of every choice on this process's hardware
(:func:`~partitioning.tune.measure.local_profile`), a verdict cached for the same run and devices, or the
fitting choices timed on the run's devices — when ``train.measure_defaults`` allows (``null``: when the run
has at least 1,000 steps per choice timed, so measuring costs at most a tenth of it). Each decided option is one line
(``train`` and ``check`` print them). What a run computes does not depend on how: the choice is the
config's own option, as if written.

Example::

    >>> from partitioning.config.defaults import resolve_defaults
    >>> cfg = pt.load_config("configs/quickstart.yaml", ["rules=fsdp_cp", "mesh.shape={data: 1, fsdp: 2, context: 4}"])
    >>> resolved = resolve_defaults(cfg, pt.make_mesh({"data": 1, "fsdp": 2, "context": 4}))   # estimates only
    >>> resolved.cfg.model_options["context_parallel"] in ("ring", "all_gather"), resolved.notes()[1]
    (True, 'context_parallel: auto -> ...: est. ... per step (...), ...; estimated, not measured: a 200-step run ...')
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from partitioning.config.build import AUTO, grad_accum, microbatches, model_options_resolved, trainer_from_config
from partitioning.config.planning import tune_inputs
from partitioning.config.remat import remat_choices
from partitioning.config.schema import Config
from partitioning.data.batch import batch_specs
from partitioning.data.order import LoggedBatches
from partitioning.errors import PartitioningError
from partitioning.fmt import fmt_bytes
from partitioning.model.registry import constructor_options, model_class
from partitioning.parallel.pipeline import check_microbatches, pipeline_stages
from partitioning.plan.budget import device_memory
from partitioning.plan.plan import build_plan
from partitioning.train.trial import STEPS_PER_CHOICE, Choices, Verdict, decide
from partitioning.tune.hardware import hardware
from partitioning.tune.measure import local_profile
from partitioning.tune.price import price
from partitioning.tune.space import CONTEXT_STRATEGIES, PIPELINE_MICROBATCHES, Candidate, length_axes

NOT_HERE = "not timed here (check estimates; train times them)"
OFF = "train.measure_defaults is false"


@dataclasses.dataclass
class Priced:
    """What pricing a default's choices needs, made once: the hardware, its source, the memory budget, the mesh
    sizes and tune's inputs (traced on first use)."""

    hw: Any
    source: str
    budget: int
    sizes: dict[str, int]
    _inputs: Any = None

    def inputs(self, cfg: Config) -> Any:
        if self._inputs is None:
            self._inputs = tune_inputs(cfg)
        return self._inputs

    def results(self, cfg: Config, candidates: dict[str, Candidate]) -> dict[str, Any]:
        """Each candidate of the run's own layout priced (``{choice: Result}``)."""
        inputs = self.inputs(cfg)
        plan = build_plan(
            inputs.params,
            inputs.opt_state,
            self.sizes,
            cfg.rules,
            optimizer_rules=cfg.optimizer_rules,
            on_indivisible=cfg.on_indivisible,
            frozen=inputs.frozen,
        )
        kw = dict(optimizer_rules=cfg.optimizer_rules, plan=plan, records=inputs.records, frozen=inputs.frozen)
        return {
            k: price(inputs.params, inputs.opt_state, c, cfg.rules, inputs.workload, self.hw, self.budget, **kw)
            for k, c in candidates.items()
        }


def _candidate(cfg: Config, p: Priced, **change: Any) -> Candidate:
    """The run's own layout as tune's candidate (its decided options; an undecided one as the model's default)."""
    options = model_options_resolved(cfg)
    remat = options.get("remat")
    context = options.get("context_parallel") if split_axes(cfg, p.sizes) else None
    base = Candidate(
        tuple(p.sizes.items()),
        "run",
        None if remat is None else "none" if remat == AUTO else remat,
        grad_accum(cfg),
        microbatches=microbatches(cfg) or pipeline_stages(p.sizes),
        repeats=cfg.train.pipeline_repeats,
        context=None if context in (None, AUTO) else context,
    )
    return dataclasses.replace(base, **change)


def _priced_choices(
    name: str, unit: str, results: dict[str, Any], source: str, usual: str | None = None, by: float = 1.0
) -> Choices | None:
    """Choices from priced results: the fastest that fits (else the smallest peak), each estimate in the line;
    ``usual`` (when it fits) unless another is priced faster by more than ``by``."""
    priced = {k: r for k, r in results.items() if r.analytic is not None}
    if not priced:
        return None
    fitting = {k: r for k, r in priced.items() if r.fits}
    if fitting:
        pick, why = min(fitting, key=lambda k: fitting[k].step_time), "fastest that fits"
        if usual in fitting and usual != pick and fitting[usual].step_time <= by * fitting[pick].step_time:
            pick, why = usual, f"fits; none priced over {(by - 1) * 100:.0f}% faster"
    else:
        pick, why = min(priced, key=lambda k: priced[k].peak), "smallest peak (none fits)"
    r = priced[pick]
    others = ", ".join(f"{k} {_ms(o.step_time)}, peak {fmt_bytes(o.peak)}" for k, o in priced.items() if k != pick)
    line = f"est. {_ms(r.step_time)} per step ({why}; peak {fmt_bytes(r.peak)}), {others}; {source}"
    unfit = {k: r.reason or "not priced" for k, r in results.items() if k not in fitting}
    return Choices(name, unit, {k: o.step_time for k, o in fitting.items()}, pick, line, unfit)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3g} s"


# -- the defaults ----------------------------------------------------------------------------------------------


def takes(cfg: Config, option: str) -> bool:
    """The config's model has ``option`` (the reference GPT and every Hugging Face family take each of these)."""
    if cfg.model_hf is not None:
        return True
    if cfg.model_target:
        return False
    try:
        return option in constructor_options(model_class(cfg.model_name))
    except PartitioningError:
        return False


def split_axes(cfg: Config, sizes: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes of size > 1 the config's rules split ``length`` over."""
    return tuple(a for a in length_axes(cfg.rules) if sizes.get(a, 1) > 1)


def _context(cfg: Config, p: Priced) -> Choices | None:
    if not takes(cfg, "context_parallel") or cfg.model_options.get("context_parallel", AUTO) != AUTO:
        return None
    if not split_axes(cfg, p.sizes):
        return None
    cands = {s: _candidate(cfg, p, context=s) for s in CONTEXT_STRATEGIES}
    return _priced_choices("context_parallel", "strategies", p.results(cfg, cands), p.source)


def _attention(cfg: Config, p: Priced) -> Choices | None:
    if not takes(cfg, "attention") or cfg.model_options.get("attention", AUTO) != AUTO:
        return None
    # The models' own rule for auto (models/fused_attention.py, which config/ leaves to config/build.py to import).
    try:
        dtype = jnp.dtype(model_options_resolved(cfg).get("dtype") or "float32")
    except TypeError:
        return None  # not a dtype: the model's build says so in one line, at its key
    if jax.default_backend() != "gpu" or dtype not in (jnp.bfloat16, jnp.float16):
        return None  # cuDNN's kernel does not apply here: nothing to choose
    rule = "cudnn"
    line = "cuDNN's kernel where it applies (a GPU, a 16-bit dtype), not priced"
    return Choices("attention", "kernels", {"xla": None, "cudnn": None}, rule, line)


def _accumulation(cfg: Config, p: Priced) -> Choices | None:
    t = cfg.train
    if t.grad_accum != AUTO:
        return None
    counts = [g for g in (1, 2, 4, 8, 16, 32) if t.batch_size % g == 0 and _divides(cfg, p.sizes, t.batch_size // g)]
    if len(counts) < 2:
        return None
    results = p.results(cfg, {str(g): _candidate(cfg, p, grad_accum=g) for g in counts})
    # Accumulating costs every pass again: one pass stays unless a count is priced 10% faster, and only the
    # counts priced within 10% are worth a trial.
    choices = _priced_choices("grad_accum", "micro-batch counts", results, p.source, usual="1", by=1.1)
    if choices is None:
        return None
    choices.margin = 1.1
    choices.usual = "1"
    return choices


def _divides(cfg: Config, sizes: dict[str, int], rows: int) -> bool:
    from partitioning.config.build import batch_from_config

    try:
        batch_specs(batch_from_config(cfg), cfg.rules, sizes, micro_batch=rows)
    except PartitioningError:
        return False
    return True


def _pipeline(cfg: Config, p: Priced) -> Choices | None:
    t = cfg.train
    stages = pipeline_stages(p.sizes)
    if stages <= 1 or t.microbatches not in (None, AUTO):
        return None
    rows, ok = t.batch_size // grad_accum(cfg), []
    for m in (stages * k for k in PIPELINE_MICROBATCHES):
        try:
            check_microbatches(p.sizes, cfg.rules, m, rows, repeats=t.pipeline_repeats)
            ok.append(m)
        except PartitioningError:
            pass
    if len(ok) < 2:
        return None
    results = p.results(cfg, {str(m): _candidate(cfg, p, microbatches=m) for m in ok})
    return _priced_choices("microbatches", "micro-batch counts", results, p.source)


def _with_model(key: str) -> Callable[[Config, str], Config]:
    def apply(cfg: Config, value: str) -> Config:
        out = copy.copy(cfg)
        out.model_options = {**cfg.model_options, key: value}
        return out

    return apply


def _with_train(key: str) -> Callable[[Config, str], Config]:
    def apply(cfg: Config, value: str) -> Config:
        out = copy.copy(cfg)
        out.train = cfg.train.model_copy(update={key: int(value)})
        return out

    return apply


def _remat(cfg: Config, p: Priced) -> Choices | None:
    return remat_choices(cfg, p.sizes, p.hw, p.source, p.budget, p.inputs(cfg))


# (what it decides, its choices as priced, how a choice becomes the config's own)
DEFAULTS: tuple[tuple[str, Callable[[Config, Priced], Choices | None], Callable[[Config, str], Config]], ...] = (
    ("remat", _remat, _with_model("remat")),
    ("context_parallel", _context, _with_model("context_parallel")),
    ("attention", _attention, _with_model("attention")),
    ("grad_accum", _accumulation, _with_train("grad_accum")),
    ("microbatches", _pipeline, _with_train("microbatches")),
)


# -- resolving them -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Trial:
    """What timing the choices needs: one real global batch, the devices' memory budget (None: none known), and
    the trainers built so far by the options that make them (so that none is built twice)."""

    batch: Callable[[], Any]
    memory: int | None = None
    dataset: Any = None
    trainers: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Defaults:
    """The config with every ``auto`` default decided, each decision's :class:`~partitioning.train.trial.Verdict`,
    and the trainer of the decided config when one was built on the way (its step compiled)."""

    cfg: Config
    verdicts: list[Verdict]
    trainer: Any = None
    priced: Priced | None = None

    def notes(self) -> list[str]:
        """One line per decision (none for the usual choice, estimated: grad_accum 1)."""
        return [v.note() for v in self.verdicts if v.how != "estimated" or v.choice != v.choices.usual]

    @property
    def pending(self) -> bool:
        """Some default was estimated only because no trial was given: a trial would time it."""
        return any(v.how == "estimated" and v.why_not == NOT_HERE for v in self.verdicts)


def built_key(cfg: Config) -> str:
    """The options that make one trainer differ from another of the same config (for :attr:`Trial.trainers`)."""
    return json.dumps([cfg.model_options, cfg.train.grad_accum, cfg.train.microbatches], sort_keys=True, default=str)


def run_key(cfg: Config, sizes: dict[str, int]) -> dict[str, Any]:
    """What a verdict is about: the model and its options, the shapes, the layout, the step's own settings
    (not the run's length, logging or learning rates, which do not change a step's time)."""
    skip = {"steps", "log_every", "eval_every", "eval_batches", "tracker", "seed", "max_skipped_steps"}
    return {
        "model": cfg.model_name,
        "hf": str(cfg.model_hf) if cfg.model_hf is not None else None,
        "options": cfg.model_options,
        "mesh": sizes,
        "nodes": cfg.mesh.nodes,
        "rules": cfg.rules.to_config(),
        "optimizer_rules": cfg.optimizer_rules.to_config() if cfg.optimizer_rules is not None else None,
        "on_indivisible": cfg.on_indivisible,
        "train": {k: v for k, v in cfg.train.model_dump().items() if k not in skip and k != "measure_defaults"},
        "optimizer": [cfg.optimizer.name, cfg.optimizer.clip_norm is not None],
        "data": [cfg.data.format, cfg.data.packing, cfg.data.target is not None],
    }


def _measurable(cfg: Config, trial: Trial | None, count: int, unit: str) -> str | None:
    """None when the choices are timed; else why not (the same words with or without a trial, so ``check`` and
    ``train`` say the same of a short run)."""
    ask = cfg.train.measure_defaults
    if ask is False:
        return OFF
    if ask is None and cfg.train.steps < STEPS_PER_CHOICE * count:
        return (
            f"a {cfg.train.steps}-step run is too short to pay for timing {count} {unit} "
            f"(train.measure_defaults: true times them anyway)"
        )
    return NOT_HERE if trial is None else None


def _profile(cfg: Config, mesh: Any) -> Priced:
    hw, source = local_profile(mesh.size)
    if hw is None:
        hw, source = hardware("h100"), f"{source}: priced as an h100"
    budget = cfg.mesh.memory_bytes or device_memory() or hw.memory
    return Priced(hw, source, int(budget), {str(a): int(n) for a, n in mesh.shape.items()})


def resolve_defaults(cfg: Config, mesh: Any, trial: Trial | None = None, priced: Priced | None = None) -> Defaults:
    """Every ``auto`` default of ``cfg`` decided for ``mesh`` (see the module docstring); with ``trial``, the
    choices are timed where measuring pays. The config itself is left alone. ``priced``: an earlier call's
    (:attr:`Defaults.priced`): the hardware profile and the model's trace, not made again."""
    p = priced
    verdicts = []
    for _name, choices_of, apply in DEFAULTS:
        if p is None:
            p = _profile(cfg, mesh)
        try:
            choices = choices_of(cfg, p)
        except PartitioningError:
            choices = None  # the layout itself is wrong: the checks that follow say what to change
        if choices is None:
            continue
        measurable = _measurable(cfg, trial, len(choices.candidates()), choices.unit)

        def build(choice: str, cfg: Config = cfg, apply: Any = apply) -> Any:
            assert trial is not None
            c = apply(cfg, choice)
            key = built_key(c)
            if key not in trial.trainers:
                trial.trainers[key] = trainer_from_config(c, mesh, trial.dataset)
            return trial.trainers[key]

        v = decide(
            choices,
            what=run_key(cfg, p.sizes),
            mesh=mesh,
            measurable=measurable,
            build=build,
            batch=trial.batch if trial is not None else None,
            memory=trial.memory if trial is not None else None,
            cache=measurable != OFF,
        )
        verdicts.append(v)
        cfg = apply(cfg, v.choice)
    if cfg.train.grad_accum == AUTO:  # one count divides the batch: the recorded config says which
        cfg = _with_train("grad_accum")(cfg, "1")
    trainer = trial.trainers.get(built_key(cfg)) if trial is not None else None
    return Defaults(cfg, verdicts, trainer, p)


def time_defaults(
    cfg: Config, mesh: Any, decided: Defaults, trainer: Any, batches: Any, dataset: Any, memory: int | None
) -> Defaults:
    """:func:`resolve_defaults` of ``cfg`` again, timing what ``decided`` (its estimates) could not: ``trainer``
    (``decided.cfg``'s) is reused, the first batch of ``batches`` is the one timed (never one a run logs to
    its run dir), ``memory``: the devices' budget per device (None: none known)."""
    if isinstance(batches, LoggedBatches):
        batches = batches.batches
    trial = Trial(lambda: batches.batch_at(0), memory, dataset, {built_key(decided.cfg): trainer})
    return resolve_defaults(cfg, mesh, trial, decided.priced)


__all__ = ["resolve_defaults", "time_defaults", "Defaults", "Trial", "DEFAULTS", "run_key", "split_axes", "takes"]
