"""The training loop: steps, periodic eval, hooks, progress (a bar or plain lines), clean stops.

Steps are dispatched back to back; metrics come to the host only on logging
steps (the first, every ``log_every``-th and the last), so the device never
waits for Python in between. On a terminal the progress is a bar; when the
output goes to a file or a pipe (or with ``progress="lines"``) it is one plain
line per logged step, so logs hold no ``\r`` frames. Ctrl-C (SIGINT) and SIGTERM stop the loop after
the current step (with several processes: at the next logging step, all
together); hooks then see ``on_exit(state, "interrupted")`` or
``"preempted"``. A second Ctrl-C raises ``KeyboardInterrupt`` at once.

A hook is any object with some of::

    on_start(state) -> state          # e.g. restore from a checkpoint
    on_step_end(step, state, metrics) # metrics: host floats on logging steps, else None
    on_exit(state, reason)            # "done" | "interrupted" | "preempted" | "nonfinite" | "failed"
    wants_state(step) -> bool         # this hook will save the state at this step (a checkpoint)

A NaN or infinite loss or gradient norm (the step's ``nonfinite`` metric) is
found at the next logging, eval or saving step, without waiting for the device
in between (:mod:`partitioning.train.nonfinite`). With the trainer's
``on_nonfinite="stop"`` the loop then stops: hooks with ``wants_state`` (those
that save) never see that state, the others see ``on_exit(state, "nonfinite")``,
and :class:`NonFiniteError` names the first bad step. With ``"skip_step"`` the
trainer dropped those updates and the logged metric ``skipped_steps`` counts them.
A hook raising a :class:`PartitioningError` stops the loop; the other hooks see
``on_exit(state, "failed")`` before the error goes on.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> logger = pt.train.JsonlLogger(None)   # see partitioning.train.hooks
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, hooks=[logger], progress=False)
    >>> int(state.step), logger.reason
    (4, 'done')
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm  # not tqdm.auto: its notebook bar needs ipywidgets

from partitioning.errors import PartitioningError
from partitioning.train.metrics import evaluate, host_metrics, without_empty_loss
from partitioning.train.nonfinite import FLAG, MAX_SKIPPED, SKIPPED, NonFiniteError, Tally, describe
from partitioning.train.state import host_scalar


def _batch_source(batches: Any) -> Callable[[int], Any]:
    """``step -> batch`` from an object with ``batch_at``, a callable, or an iterable."""
    if hasattr(batches, "batch_at"):
        return batches.batch_at
    if callable(batches):
        return batches
    it = iter(batches)
    return lambda step: next(it)


class _StopFlag:
    """SIGINT / SIGTERM set a reason instead of killing the step in flight."""

    def __init__(self):
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame):
        if signum == signal.SIGINT and self.reason == "interrupted":
            raise KeyboardInterrupt  # second Ctrl-C: the user really means it
        self.reason = "preempted" if signum == signal.SIGTERM else "interrupted"

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals only reach the main thread; nothing to install
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        try:
            yield self
        finally:
            for signum, old in self._old.items():
                signal.signal(signum, old)


_REASON_CODES = {None: 0, "interrupted": 1, "preempted": 2}


def _agreed_stop(local: str | None) -> str | None:
    """The stop reason all processes agree on (the strongest any of them saw).

    Signals reach processes at different moments; if one stopped while the
    others stepped on, they would wait forever in the next step's collectives.
    So with several processes a stop takes effect only at a logging step, where
    they exchange what they saw (a tiny host all-gather) and stop together.
    """
    if jax.process_count() == 1:
        return local
    codes = multihost_utils.process_allgather(np.int32(_REASON_CODES[local]))
    strongest = int(np.max(codes))
    return {v: k for k, v in _REASON_CODES.items()}[strongest]


def _progress(total: int, initial: int, enabled: bool):
    return tqdm(
        total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True, mininterval=0.5, leave=True
    )


def _on_terminal() -> bool:
    """The bar draws on stderr; results go to stdout: both must be terminals for a bar to make sense."""
    return all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr))


def _num(v: float, digits: int = 4) -> str:
    return "nan" if v is None or not math.isfinite(v) else f"{v:.{digits}g}"


def format_line(metrics: dict[str, Any], steps: int) -> str:
    """One plain log line of logged metrics.

    Example::

        >>> from partitioning.train.loop import format_line
        >>> format_line({"step": 10, "loss": 3.21, "lr": 3e-3, "tokens_per_s": 12345.0,
        ...              "tflops_per_device": 0.52, "step_time_s": 0.08}, 200)
        'step 10/200  loss 3.21  lr 0.003  12,345 tok/s  0.52 TFLOP/s/device  0.08 s/step'
    """
    parts = [f"step {int(metrics['step'])}/{steps}"]
    for k in ("loss", "eval_loss"):
        if k in metrics:
            parts.append(f"{k} {_num(metrics[k])}")
        elif metrics.get(f"{'eval_' if k != 'loss' else ''}loss_tokens") == 0:
            parts.append(f"{k} -")  # no token to count: no loss (never a loss of 0)
    parts += [
        f"{k} {_num(v)}"
        for k, v in metrics.items()
        if k not in {"step", "loss", "eval_loss", "tokens_per_s", "step_time_s", "tflops_per_device", "mfu"}
        and isinstance(v, (int, float))
    ]
    if "tokens_per_s" in metrics and math.isfinite(metrics["tokens_per_s"]):
        parts.append(f"{metrics['tokens_per_s']:,.0f} tok/s")
    if "tflops_per_device" in metrics:
        parts.append(f"{_num(metrics['tflops_per_device'], 3)} TFLOP/s/device")
    if metrics.get("mfu") is not None:
        parts.append(f"MFU {metrics['mfu']:.1%}")
    if "step_time_s" in metrics:
        parts.append(f"{_num(metrics['step_time_s'], 3)} s/step")
    return "  ".join(parts)


def step_flops_of(trainer: Any) -> float | None:
    """FLOPs per device of one train step, if ``trainer`` can say (:meth:`Trainer.step_flops`)."""
    fn = getattr(trainer, "step_flops", None)
    return fn() if callable(fn) else None


def fit(
    trainer: Any,
    state: Any,
    train_batches: Any,
    *,
    steps: int,
    eval_batches: Callable[[], Iterable[Any]] | Sequence[Any] | None = None,
    eval_every: int = 0,
    log_every: int = 10,
    hooks: Sequence[Any] = (),
    progress: bool | str = True,
    flops_per_step: float | None = None,
    peak_tflops: float | None = None,
    max_skipped: int | None = None,
) -> Any:
    """Trains until ``state.step == steps`` (or a stop signal); returns the final state.

    Args:
      train_batches: ``batch_at(step)`` object (e.g. :class:`TokenBatches`), a
        ``step -> batch`` callable, or an iterable. With the first two a state
        restored at step ``k`` continues with the batch of step ``k``.
      eval_batches: a callable returning an iterable of batches (or a list);
        evaluated every ``eval_every`` steps, at the first and at the last step.
      log_every: metrics are pulled to the host every this many steps (and on
        the first and last), then passed to the hooks and the progress bar.
      progress: ``True``: a bar on a terminal, else one line per logged step
        (process 0, to stdout); ``"lines"``: always lines; ``False``: silent.
      flops_per_step: FLOPs per device of one step (default: ``trainer.step_flops()``,
        which compiles the step before the loop: the compiled step's cost analysis).
      peak_tflops: the device's peak TFLOP/s for ``mfu`` (default: the
        :data:`~partitioning.plan.flops.PEAK_TFLOPS` table; none on CPUs).
      max_skipped: under ``on_nonfinite="skip_step"``, more consecutive non-finite
        (skipped) steps than this stop the run with :class:`NonFiniteError` (its
        ``skipped`` says how many): skipping every step is no training. Default 10.

    Logged metrics: the step's own (``loss``, ``grad_norm``, ``lr``, ...), plus
    ``step``, ``tokens_per_s`` and ``step_time_s`` (averages since the previous
    log), ``tflops_per_device`` (when the FLOPs are known), ``mfu`` (when the
    peak is known too) and ``eval_*`` when evaluated.

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
        >>> evals = pt.data.TokenBatches(np.arange(1024) % 256, 8, 16, trainer.batch_sharding, split="eval")
        >>> logger = pt.train.JsonlLogger(None)
        >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, eval_every=2,
        ...                eval_batches=lambda: [evals.batch_at(i) for i in range(2)], hooks=[logger], progress=False)
        >>> ["eval_loss" in r for r in logger.records]   # evaluated at the first, every 2nd and the last step
        [True, True, True]
    """
    for h in hooks:
        if hasattr(h, "on_start"):
            state = h.on_start(state) or state
    start = int(host_scalar(state.step))
    get_batch = _batch_source(train_batches)
    tokens_per_step = trainer.batch_size * (trainer.seq_len or 1)
    is_main = jax.process_index() == 0
    single = jax.process_count() == 1
    if flops_per_step is None and start < steps:
        flops_per_step = step_flops_of(trainer)
    if peak_tflops is None:
        from partitioning.plan.flops import peak_tflops as device_peak

        peak_tflops = device_peak(jax.devices()[0])
    flag = _StopFlag()
    lines = is_main and (progress == "lines" or (progress is True and not _on_terminal()))
    bar = _progress(steps, min(start, steps), progress is True and is_main and not lines)
    last_t, last_step = time.perf_counter(), start
    step = start
    reason = "done"
    policy = getattr(trainer, "on_nonfinite", None)
    tally = Tally(start)
    diverged: tuple[int, int, dict[str, float] | None] | None = None  # (first bad step, found at, metrics)
    if max_skipped is None:
        max_skipped = getattr(trainer, "max_skipped_steps", MAX_SKIPPED)
    skipped_out = 0  # the consecutive skipped steps past max_skipped (skip_step): the run stops
    try:
        with flag.installed():
            while step < steps:
                state, metrics = trainer.train_step(state, get_batch(step))
                step += 1
                if FLAG in metrics:
                    tally.add(metrics[FLAG])  # on device, asynchronous: read only at the sync points below
                logging = step == start + 1 or step % max(log_every, 1) == 0 or step == steps
                evaluating = eval_batches is not None and (
                    step == start + 1 or step == steps or (eval_every and step % eval_every == 0)
                )
                # A hook about to save the state makes this step a sync point: a non-finite state is never saved.
                saving = any(h.wants_state(step) for h in hooks if hasattr(h, "wants_state"))
                # One process alone acts on its signal at once; several agree at logging steps.
                stop = flag.reason if single else (_agreed_stop(flag.reason) if logging or evaluating else None)
                bad, first = tally.read() if policy and (logging or evaluating or saving or stop) else (0, None)
                if policy == "skip_step" and bad and max_skipped is not None and tally.longest() > max_skipped:
                    # Skipping every step is no training: past the bound the run is diverged, as under "stop".
                    skipped_out = tally.longest()
                if (policy == "stop" and bad) or skipped_out:
                    evaluating = False  # a diverged state's eval says nothing
                host = None
                if logging or evaluating or stop or (bad and policy == "stop") or skipped_out:
                    host = without_empty_loss(host_metrics(metrics))  # waits for the step: the only sync point
                    host.pop(FLAG, None)
                    if policy == "skip_step":
                        host[SKIPPED] = float(bad)
                    now = time.perf_counter()
                    dt = (now - last_t) / max(step - last_step, 1)
                    host.update(step=step, step_time_s=dt, tokens_per_s=tokens_per_step / dt if dt > 0 else math.inf)
                    if flops_per_step and dt > 0:
                        host["tflops_per_device"] = flops_per_step / dt / 1e12
                        if peak_tflops:
                            host["mfu"] = host["tflops_per_device"] / peak_tflops
                    last_t, last_step = now, step
                    if evaluating and eval_batches is not None:
                        batches = eval_batches() if callable(eval_batches) else eval_batches
                        host.update(evaluate(trainer, state, batches))
                        last_t = time.perf_counter()  # eval time is not step time
                    loss = f"{host['loss']:.3f}" if "loss" in host else "-"
                    post = {"loss": loss, "tok/s": f"{host['tokens_per_s']:,.0f}"}
                    if "eval_loss" in host:
                        post["eval"] = f"{host['eval_loss']:.3f}"
                    if "tflops_per_device" in host:
                        post["TFLOP/s/dev"] = f"{host['tflops_per_device']:.3g}"
                    if "mfu" in host:
                        post["MFU"] = f"{host['mfu']:.1%}"
                    bar.set_postfix(post, refresh=False)
                    if lines:
                        print(format_line(host, steps), flush=True)
                bar.update(1)
                if (policy == "stop" and bad) or skipped_out:
                    # The state is not finite: hooks that save it (wants_state) are not called with it.
                    for h in hooks:
                        if hasattr(h, "on_step_end") and not hasattr(h, "wants_state"):
                            h.on_step_end(step, state, host)
                    diverged, reason = (first or step, step, host), "nonfinite"
                    break
                for h in hooks:
                    if hasattr(h, "on_step_end"):
                        h.on_step_end(step, state, host)
                if single:
                    stop = flag.reason  # a signal during the hooks counts for this step too
                if stop:
                    # Stopping saves the state on the way out: never a non-finite one.
                    bad, first = tally.read() if policy == "stop" else (0, None)
                    if bad:
                        diverged, reason = (first or step, step, host), "nonfinite"
                        break
                    reason = stop
                    break
    except PartitioningError:
        # A hook refused to go on (e.g. a checkpoint that cannot be written): the others still close.
        bar.close()
        for h in hooks:
            if hasattr(h, "on_exit"):
                with contextlib.suppress(Exception):
                    h.on_exit(state, "failed")
        raise
    finally:
        bar.close()
    for h in hooks:
        if hasattr(h, "on_exit"):
            h.on_exit(state, reason)
    if diverged is not None and skipped_out:
        first, at, host = diverged
        raise NonFiniteError(
            f"{describe(first, at, host)}: {skipped_out} consecutive steps had a non-finite loss or gradient norm "
            f"and were skipped (more than max_skipped_steps {max_skipped}): the run diverges; stopped",
            step=first,
            metrics=host,
            skipped=skipped_out,
        )
    if diverged is not None:
        first, at, host = diverged
        raise NonFiniteError(
            f"{describe(first, at, host)}: the loss or gradient norm is not finite; stopped without saving "
            f"(on_nonfinite=stop)",
            step=first,
            metrics=host,
        )
    return state


__all__ = ["fit", "evaluate", "host_metrics", "format_line"]
