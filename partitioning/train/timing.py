"""Timing train steps side by side: each choice's step compiled (in threads), stepped on one real batch, in turns.

:func:`time_steps` is how a default that trades speed for memory (``model.remat: auto`` and the others,
:mod:`partitioning.train.trial`) learns which of its choices is fastest *here*, on the run's own devices:

1. every choice's train step is lowered (in turn: tracing is Python) and compiled in threads, all at
   once (XLA compiles without the GIL); a choice whose compiled peak exceeds ``memory`` is not run;
2. one state is made (``trainer.init``) and stepped on ``batch`` by each choice's step in turn, the
   order reversed every round, so a drift of the machine's load hits every choice alike; the state is
   donated as in a run and passed on (the choices of one default share the state's structure and
   layout: a remat policy, a micro-batch count or an attention kernel changes the program, not the
   state). Choices whose states differ (``scan_layers``) each get their own, one at a time;
3. a first untimed step each, then timed rounds until every choice has ``min_steps`` and the timed
   steps have used ``budget`` seconds per choice (or ``max_steps`` rounds); a choice slower than the
   best by more than half is dropped after ``min_steps``.

The state is thrown away: nothing here touches a run's own state, so what a run computes is the
same as with the winner named in its config. Time is the process's CPU time per local device on
the CPU (device-seconds: simulated devices share the cores, and a shared machine's wall clock says
as much about its neighbours as about the step), wall time on accelerators. With several processes,
process 0's timings decide every round (each process runs the same steps in the same order).

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> from partitioning.train.timing import time_steps
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> trainers = {p: pt.Trainer(GPT(vocab_size=64, embed=32, heads=2, mlp=64, layers=2, remat=p), optax.adamw(1e-3),
    ...                           mesh, "fsdp", batch_size=8, seq_len=16) for p in ("none", "full")}
    >>> batch = pt.data.TokenBatches(np.arange(4096) % 64, 8, 16, trainers["none"].batch_sharding).batch_at(0)
    >>> t = time_steps(trainers, batch, budget=0.1, min_steps=2)
    >>> sorted(t.seconds), t.clock, min(t.steps.values()) >= 2, t.fastest in ("none", "full")
    (['full', 'none'], 'cpu', True, True)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from partitioning.boxes import unbox
from partitioning.plan.compiled import memory_stats

DROP = 1.5  # a choice slower than the best by more than this factor is not timed further


@dataclasses.dataclass
class Timings:
    """What :func:`time_steps` measured: per choice the median step (``seconds``) and timed steps, the
    compiled per-device peak; the choices not run and why; the clock; the wall seconds spent."""

    seconds: dict[str, float]
    steps: dict[str, int]
    peak: dict[str, int]
    skipped: dict[str, str]
    clock: str  # "cpu": CPU seconds per local device | "wall"
    compile_s: float = 0.0  # wall seconds of the parallel compile
    spent_s: float = 0.0  # wall seconds of everything (compile, init, steps)
    compiled: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def fastest(self) -> str | None:
        return min(self.seconds, key=lambda k: self.seconds[k]) if self.seconds else None

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "steps": self.steps,
            "peak": self.peak,
            "skipped": self.skipped,
            "clock": self.clock,
            "compile_s": self.compile_s,
            "spent_s": self.spent_s,
        }


def agreed(values: np.ndarray) -> np.ndarray:
    """Process 0's ``values`` on every process (the same decisions everywhere); as they are with one process."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(values))


def _same_state(trainers: Mapping[str, Any]) -> bool:
    """The trainers' states have one structure, shapes, dtypes and shardings: one state serves them all."""
    first = None
    for t in trainers.values():
        sig = (
            jax.tree.structure(unbox(t.abstract_state)),
            [(a.shape, a.dtype) for a in jax.tree.leaves(unbox(t.abstract_state))],
            jax.tree.leaves(t.state_shardings),
        )
        if first is None:
            first = sig
        elif sig != first:
            return False
    return True


def _compile_all(trainers: Mapping[str, Any], memory: int | None) -> tuple[dict, dict, dict]:
    """(compiled steps, compiled peaks, skipped choices with the reason)."""
    lowered, skipped = {}, {}
    for name, t in trainers.items():
        try:
            lowered[name] = t.lower_train_step()
        except Exception as e:  # a choice that does not trace is not a choice
            skipped[name] = f"does not lower: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    compiled, peak = {}, {}
    with ThreadPoolExecutor(max_workers=max(1, len(lowered))) as pool:
        futures = {name: pool.submit(low.compile) for name, low in lowered.items()}
        for name, f in futures.items():
            try:
                compiled[name] = f.result()
            except Exception as e:
                skipped[name] = f"does not compile: {type(e).__name__}"
                continue
            stats = memory_stats(compiled[name])
            if stats is not None:
                peak[name] = stats["peak_estimate"]
                if memory is not None and stats["peak_estimate"] > memory:
                    skipped[name] = f"compiled peak {stats['peak_estimate']:,} bytes > the budget of {memory:,}"
                    del compiled[name]
    return compiled, peak, skipped


def _clock(trainer: Any, clock: str | None) -> tuple[str, Callable[[], float]]:
    if clock is None:
        clock = "cpu" if trainer.mesh.devices.flat[0].platform == "cpu" else "wall"
    if clock == "wall":
        return clock, time.perf_counter
    local = max(1, len(trainer.mesh.local_devices))
    return clock, lambda: time.process_time() / local


def time_steps(
    trainers: Mapping[str, Any],
    batch: Any,
    *,
    budget: float = 3.0,
    min_steps: int = 3,
    max_steps: int = 10,
    memory: int | None = None,
    seed: int = 0,
    clock: str | None = None,
) -> Timings:
    """Each of ``trainers``' train steps timed on ``batch`` (see the module docstring).

    ``budget``: seconds of timed steps per choice (at least ``min_steps`` each, at most ``max_steps``);
    ``memory``: per-device bytes a compiled step may use (None: any); ``clock``: ``"cpu"`` or ``"wall"``
    (default: ``cpu`` on CPU devices, else ``wall``). The compiled steps stay in each trainer's jit cache:
    a run with the winner's trainer starts without compiling again.
    """
    start = time.perf_counter()
    first = next(iter(trainers.values()))
    kind, now = _clock(first, clock)
    t0 = time.perf_counter()
    compiled, peak, skipped = _compile_all(trainers, memory)
    compile_s = time.perf_counter() - t0
    names = list(compiled)
    times: dict[str, list[float]] = {n: [] for n in names}
    shared = _same_state(trainers)
    if shared:
        _rounds(names, compiled, times, skipped, first, batch, seed, now, budget, min_steps, max_steps)
    else:
        for name in names:  # one state at a time: never two of them in memory
            _rounds([name], compiled, times, skipped, trainers[name], batch, seed, now, budget, min_steps, max_steps)
    seconds = {n: statistics.median(ts) for n, ts in times.items() if ts and n not in skipped}
    return Timings(
        seconds=seconds,
        steps={n: len(ts) for n, ts in times.items() if n in seconds},
        peak=peak,
        skipped=skipped,
        clock=kind,
        compile_s=compile_s,
        spent_s=time.perf_counter() - start,
        compiled={n: compiled[n] for n in seconds},
    )


def _rounds(
    names: list[str],
    compiled: Mapping[str, Any],
    times: dict[str, list[float]],
    skipped: dict[str, str],
    trainer: Any,
    batch: Any,
    seed: int,
    now: Callable[[], float],
    budget: float,
    min_steps: int,
    max_steps: int,
) -> None:
    """Steps ``names`` in turns on one state (made by ``trainer``), appending each timed step to ``times``."""
    state = [trainer.init(jax.random.key(seed))]

    def step(name: str) -> float | None:
        t = now()
        try:
            state[0], metrics = compiled[name](state[0], batch)
            jax.block_until_ready(metrics)
        except Exception as e:  # e.g. out of memory at run time: the state went with it
            skipped[name] = f"does not run: {type(e).__name__}"
            state[0] = trainer.init(jax.random.key(seed))
            return None
        return now() - t

    live = list(names)
    for name in list(live):  # the first run of a program allocates and warms up: not timed
        if step(name) is None:
            live.remove(name)
    # The budget is wall time: what the run waits for.
    deadline, rounds = time.perf_counter() + budget * len(names), 0
    while live and rounds < max_steps:
        order = live if rounds % 2 == 0 else live[::-1]
        mine = np.full(len(live), np.nan)
        for name in order:
            mine[live.index(name)] = -1.0 if (dt := step(name)) is None else dt
        rounds += 1
        for name, dt in zip(list(live), agreed(mine), strict=True):
            if dt < 0:
                skipped.setdefault(name, "does not run (process 0)")
                live.remove(name)
            else:
                times[name].append(float(dt))
        if rounds < min_steps or not live:
            continue
        best = min(statistics.median(times[n]) for n in live)
        live = [n for n in live if statistics.median(times[n]) <= DROP * best]
        if bool(agreed(np.array(time.perf_counter() >= deadline))):
            break
    state.clear()


__all__ = ["Timings", "time_steps", "agreed"]
