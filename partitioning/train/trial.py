"""Defaults decided by trial: a default's fitting choices timed on the run's devices, the fastest kept, cached.

Every default that trades speed for memory — ``model.remat: auto``, ``model.context_parallel: auto``,
``model.attention: auto``, ``train.grad_accum: auto``, the pipeline's micro-batches — is decided here,
the same way (:mod:`partitioning.config.defaults` says which choices each one has):

1. tune prices every choice for the run's layout (:class:`Choices`: the estimate of each that fits,
   and the one the estimate picks);
2. a verdict cached for the same key — model, shapes, layout, devices, jax version
   (:func:`verdict_key`) — decides at once: the next run starts without measuring;
3. else, when the run's devices are here and measuring pays for itself, the choices within
   :data:`MARGIN` of the best estimate are compiled and timed side by side
   (:func:`partitioning.train.timing.time_steps`: a few steps each on a real batch, within a
   budget of seconds per choice); the fastest wins and the verdict is cached
   (``$PARTITIONING_CACHE/defaults/``, see :func:`cache_dir`; delete a
   file to measure again);
4. else the estimate decides, and the line says so and why.

The one-line :meth:`Verdict.note` says which choice won, by how much, and whether it was measured,
read from the cache or estimated.

Example::

    >>> from partitioning.train.trial import Choices, decide
    >>> choices = Choices("remat", "policies", {"full": 0.10, "dots": 0.09}, pick="dots", line="dots: est. 90 ms")
    >>> mesh = pt.make_mesh({"data": -1})
    >>> decide(choices, what={"model": "example"}, mesh=mesh, measurable="no devices here").note()
    'remat: auto -> dots: dots: est. 90 ms; estimated, not measured: no devices here'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from partitioning.train.timing import Timings, agreed, time_steps

MARGIN = 1.5  # choices priced slower than the best by more than this are not timed
BUDGET = 3.0  # wall seconds of timed steps per choice
# A choice's compile, warm-up and timed steps cost some 50-100 steps of a small model's run on a loaded 2-core
# machine (the quickstart: 2 compiles in 34 s against 0.2 s a step): from this many steps per choice timed,
# measuring costs at most a tenth of the run (a cached verdict, nothing), and the quickstart is not measured.
STEPS_PER_CHOICE = 1000
# A measured lead smaller than this is the machine's noise: the estimate's pick stays.
NOISE = 0.02


@dataclasses.dataclass
class Choices:
    """A default's choices as tune prices them: the estimated step seconds of each that fits (None: not
    priced), the choice the estimate picks and its one-line reasoning, and the choices that do not fit."""

    name: str  # the option: remat, context_parallel, attention, grad_accum, microbatches
    unit: str  # what its choices are: policies, strategies, kernels, ...
    estimates: dict[str, float | None]
    pick: str
    line: str
    unfit: dict[str, str] = dataclasses.field(default_factory=dict)
    margin: float = MARGIN
    usual: str | None = None  # the choice that goes without a line when the estimate picks it (grad_accum 1)

    def candidates(self) -> list[str]:
        """The fitting choices worth timing: those priced within ``margin`` of the best (all when unpriced)."""
        priced = [s for s in self.estimates.values() if s is not None]
        best = min(priced, default=None)
        return [c for c, s in self.estimates.items() if s is None or best is None or s <= self.margin * best]


@dataclasses.dataclass
class Verdict:
    """How a default was decided (``how``: measured | cached | estimated) and what it was decided on."""

    choices: Choices
    choice: str
    how: str
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # measured, per choice
    timings: Timings | None = None  # measured now
    clock: str = "wall"
    why_not: str | None = None  # estimated: why it was not measured
    path: Path | None = None  # the cached verdict's file
    trainer: Any = None  # measured now: the winner's trainer, its step compiled

    def note(self) -> str:
        """One line: ``NAME: auto -> CHOICE: ...`` with the margin and where the verdict came from."""
        head = f"{self.choices.name}: auto -> {self.choice}: "
        if self.how == "estimated":
            return f"{head}{self.choices.line}; estimated, not measured: {self.why_not}"
        if self.choice not in self.seconds:  # a process other than 0: it has the choice, not the timings
            return f"{head}{self.how}, as process 0 decided"
        best = self.seconds[self.choice]
        fastest = min(self.seconds.values())
        lead = "the fastest" if best <= fastest else f"within {(best / fastest - 1) * 100:.1f}% of the fastest"
        others = ", ".join(
            f"{c} {_ms(s)} ({(s / best - 1) * 100:+.1f}%)"
            for c, s in sorted(self.seconds.items(), key=lambda kv: kv[1])
            if c != self.choice
        )
        clock = "CPU time per simulated device" if self.clock == "cpu" else "wall time"
        out = (
            f"{head}measured, {lead} of {len(self.seconds)} {self.choices.unit}: {_ms(best)} per step "
            f"({others}; {clock})"
        )
        if self.choice != self.choices.pick:
            out += f"; the estimate had picked {self.choices.pick}"
        elif best > fastest:
            out += f"; the estimate's pick, kept: a lead under {NOISE:.0%} is noise"
        t = self.timings
        if t is not None:
            steps = sorted(t.steps.values())
            count = f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"
            out += f"; {count} steps each in {t.spent_s:.1f} s (compile {t.compile_s:.1f} s, budget {BUDGET:g} s each)"
        if self.path is not None:
            out += f"; {'cached in' if self.how == 'measured' else 'from the cache'} {self.path}"
        return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def device_fingerprint(mesh: Any) -> dict[str, Any]:
    """What a timing depends on besides the program: the devices (kind, count, processes, this machine's
    processor and cores for CPU devices) and the jax / jaxlib versions."""
    device = mesh.devices.flat[0]
    out: dict[str, Any] = {
        "platform": device.platform,
        "kind": str(getattr(device, "device_kind", "")),
        "devices": int(mesh.devices.size),
        "processes": jax.process_count(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib(),
    }
    if device.platform == "cpu":
        out["cpu"] = _processor()
        out["cores"] = os.cpu_count()
    return out


def _jaxlib() -> str:
    try:
        import jaxlib

        return str(jaxlib.__version__)
    except (ImportError, AttributeError):
        return "?"


def _processor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def verdict_key(what: Mapping[str, Any], mesh: Any, choices: list[str]) -> dict[str, Any]:
    """The cache key of a verdict: ``what`` runs (model, shapes, layout: the caller's), the devices
    (:func:`device_fingerprint`) and the choices timed."""
    return {"run": dict(what), "devices": device_fingerprint(mesh), "choices": sorted(choices)}


def cache_dir() -> Path:
    """The cache folder, where :func:`partitioning.tune.measure.cache_dir` keeps the CPU profile (tune sits above
    train): ``$PARTITIONING_CACHE``, else ``$XDG_CACHE_HOME/partitioning``, else ``~/.cache/partitioning``."""
    if os.environ.get("PARTITIONING_CACHE"):
        return Path(os.environ["PARTITIONING_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "partitioning"


def _path(name: str, key: Mapping[str, Any], directory: str | Path | None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(directory if directory is not None else cache_dir()) / "defaults" / f"{name}-{digest}.json"


def read_verdict(name: str, key: Mapping[str, Any], directory: str | Path | None = None) -> dict[str, Any] | None:
    """The cached verdict for ``key`` (``{"choice", "seconds", "clock", ...}``), or None."""
    path = _path(name, key, directory)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != json.loads(json.dumps(key, default=str)):
        return None
    if data.get("choice") not in (data.get("seconds") or {}):
        return None
    return data


def write_verdict(name: str, key: Mapping[str, Any], data: Mapping[str, Any], directory: str | Path | None = None):
    """Caches a verdict (atomically; silently not when the folder cannot be written). Returns its path or None."""
    path = _path(name, key, directory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "when": time.time(), **data}, default=str, indent=1))
        tmp.replace(path)
        return path
    except OSError:
        return None


def _cached(choices: Choices, key: Mapping[str, Any], names: list[str], directory: Any) -> Verdict | None:
    """Process 0's cached verdict, on every process (None: no verdict, or not for these choices)."""
    data = read_verdict(choices.name, key, directory) if jax.process_index() == 0 else None
    index = names.index(data["choice"]) if data is not None and data["choice"] in names else -1
    index = int(agreed(np.array(index, np.int32)))
    if index < 0:
        return None
    if data is None:  # another process: the choice is all it needs (the note is printed by process 0)
        return Verdict(choices, names[index], "cached")
    seconds = {c: float(s) for c, s in data["seconds"].items()}
    return Verdict(
        choices,
        names[index],
        "cached",
        seconds,
        clock=data.get("clock", "wall"),
        path=_path(choices.name, key, directory),
    )


def decide(
    choices: Choices,
    *,
    what: Mapping[str, Any],
    mesh: Any,
    measurable: str | None,
    build: Callable[[str], Any] | None = None,
    batch: Callable[[], Any] | None = None,
    memory: int | None = None,
    budget: float = BUDGET,
    directory: str | Path | None = None,
    cache: bool = True,
) -> Verdict:
    """The verdict on ``choices`` (see the module docstring).

    ``what``: the run (model, shapes, layout) for the cache key, to which :func:`verdict_key` adds the
    devices of ``mesh`` and the choices; ``measurable``: None when the run's devices are here and
    measuring pays, else why not; ``build(choice)``: the choice's :class:`~partitioning.train.step.Trainer`;
    ``batch()``: one real global batch; ``memory``: per-device bytes a compiled choice may use;
    ``directory``: the cache (default :func:`cache_dir`); ``cache``: False, the
    estimate decides (no verdict is read or written).
    """
    names = choices.candidates()
    if len(names) < 2:
        alone = "the only choice that fits"
        if len(choices.estimates) > 1:
            alone = f"the others are priced over {choices.margin:g}x slower"
        return Verdict(choices, choices.pick, "estimated", why_not=alone)
    key = verdict_key(what, mesh, names)
    hit = _cached(choices, key, names, directory) if cache else None
    if hit is not None:
        return hit
    if measurable is not None or build is None or batch is None:
        return Verdict(choices, choices.pick, "estimated", why_not=measurable or "nothing to measure with")
    trainers = {c: build(c) for c in names}
    timings = time_steps(trainers, batch(), budget=budget, memory=memory)
    winner = timings.fastest
    if winner is None:
        why = "; ".join(f"{c} {r}" for c, r in timings.skipped.items()) or "nothing ran"
        return Verdict(choices, choices.pick, "estimated", why_not=f"no choice ran ({why})")
    # Process 0's numbers decided every round; its winner is everyone's.
    winner = names[int(agreed(np.array(names.index(winner), np.int32)))]
    kept = timings.seconds.get(choices.pick)
    if kept is not None and kept <= (1 + NOISE) * timings.seconds[winner]:
        winner = choices.pick  # within the noise of the fastest: the estimate's pick, not a coin toss
    path = None
    if jax.process_index() == 0 and len(timings.seconds) > 1:
        path = write_verdict(choices.name, key, {"choice": winner, **timings.to_json()}, directory)
    return Verdict(
        choices, winner, "measured", dict(timings.seconds), timings, timings.clock, path=path, trainer=trainers[winner]
    )


__all__ = [
    "Choices",
    "Verdict",
    "MARGIN",
    "BUDGET",
    "NOISE",
    "STEPS_PER_CHOICE",
    "decide",
    "verdict_key",
    "read_verdict",
    "write_verdict",
]
