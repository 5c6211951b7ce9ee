"""Divergence: a non-finite loss or gradient norm, found on device, acted on at the loop's sync points.

The step reports ``nonfinite`` (1.0 when its loss or gradient norm is NaN or
infinite) with its other metrics. With ``on_nonfinite="skip_step"`` the step
itself keeps the previous params, optimizer state and collections when the
flag is set (a select on device: :func:`keep_if_finite`), so the state stays
finite. With ``"stop"`` the loop stops at the next point where it reads
metrics anyway (a logging, eval or save step) and raises :class:`NonFiniteError`
naming the first non-finite step; a state that went non-finite is never
handed to a hook that saves it.

The flags of the steps between two sync points are tallied on device by
:class:`Tally` (one tiny asynchronous computation per step), so finding the
first bad step costs no extra wait for the device.

Example::

    >>> from partitioning.train.nonfinite import Tally, keep_if_finite, nonfinite_flag
    >>> losses = [2.5, 2.4, float("nan"), 2.3, float("inf")]    # steps 1 to 5, as their train steps return them
    >>> tally = Tally(start=0)
    >>> for loss in losses:
    ...     tally.add(nonfinite_flag(jnp.float32(loss), jnp.float32(0.5)))   # the step's metrics["nonfinite"]
    >>> tally.read()          # (non-finite steps, first of them or None)
    (2, 3)
    >>> new, old = {"w": jnp.full(2, jnp.nan)}, {"w": jnp.ones(2)}
    >>> keep_if_finite(nonfinite_flag(jnp.float32(jnp.nan), jnp.float32(0.5)), new, old)   # skip_step keeps the old
    {'w': Array([1., 1.], dtype=float32)}
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from partitioning.errors import PartitioningError

POLICIES = ("stop", "skip_step")
FLAG = "nonfinite"  # the step's metric: 1.0 when its loss or gradient norm is not finite
SKIPPED = "skipped_steps"  # the loop's host metric under skip_step: steps dropped so far
MAX_SKIPPED = 10  # skip_step: more consecutive non-finite steps than this stop the run (it diverges)


class NonFiniteError(PartitioningError):
    """Training produced a NaN or infinite loss or gradient norm (``on_nonfinite="stop"``).

    ``step`` is the first non-finite step, ``metrics`` the host metrics read
    when it was found (at a later step when the steps between were not logged).
    """

    def __init__(self, message: str, *, step: int, metrics: dict[str, float] | None = None, skipped: int = 0):
        super().__init__(message)
        self.step, self.metrics = step, dict(metrics or {})
        self.skipped = skipped  # > 0: skip_step went past max_skipped_steps (this many consecutive steps)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"on_nonfinite must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


def nonfinite_flag(loss: jax.Array, grad_norm: jax.Array) -> jax.Array:
    """1.0 when the loss or the gradient norm is NaN or infinite, else 0.0 (a traced scalar)."""
    return jnp.logical_not(jnp.isfinite(loss) & jnp.isfinite(grad_norm)).astype(jnp.float32)


def keep_if_finite(flag: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``flag`` is 0, else ``old``, leaf by leaf (inside the jitted step: fused, no copy)."""
    bad = flag > 0
    return jax.tree.map(lambda n, o: jnp.where(bad, o, n), new, old)


@jax.jit
def _first(flag: jax.Array) -> tuple[jax.Array, ...]:
    bad = (flag > 0).astype(jnp.int32)
    return bad, 1 - bad, bad, bad


@jax.jit
def _add(carry: tuple[jax.Array, ...], flag: jax.Array) -> tuple[jax.Array, ...]:
    count, good, run, longest = carry
    bad = (flag > 0).astype(jnp.int32)
    count = count + bad
    run = (run + 1) * bad  # consecutive non-finite steps ending at this one
    # Steps before the first bad one: it is step start + good + 1.
    return count, good + (count == 0).astype(jnp.int32), run, jnp.maximum(longest, run)


class Tally:
    """Counts non-finite steps on device and remembers the first; read only at sync points.

    Example::

        >>> from partitioning.train.nonfinite import Tally
        >>> tally = Tally(start=100)
        >>> for flag in [0.0, 0.0, 1.0, 0.0]:            # steps 101 to 104: each step's metrics["nonfinite"]
        ...     tally.add(jnp.float32(flag))             # after each step; never waits
        >>> tally.read()                                 # host ints; waits for the steps
        (1, 103)
    """

    def __init__(self, start: int):
        self.start = int(start)
        self._carry: tuple[jax.Array, ...] | None = None

    def add(self, flag: jax.Array) -> None:
        self._carry = _first(flag) if self._carry is None else _add(self._carry, flag)

    def read(self) -> tuple[int, int | None]:
        """(non-finite steps so far, the first of them or None)."""
        if self._carry is None:
            return 0, None
        from partitioning.train.state import host_scalar

        count, good = (int(host_scalar(x)) for x in self._carry[:2])
        return count, (self.start + good + 1 if count else None)

    def longest(self) -> int:
        """The longest run of consecutive non-finite steps so far (what ``max_skipped_steps`` bounds)."""
        if self._carry is None:
            return 0
        from partitioning.train.state import host_scalar

        return int(host_scalar(self._carry[3]))


def describe(first: int, at: int, metrics: dict[str, Any] | None) -> str:
    """``step 13 (loss nan, grad_norm nan at step 20)``: the first bad step and what the loop read."""
    m = metrics or {}
    shown = ", ".join(
        f"{k} {m[k]:.4g}" if isinstance(m[k], float) else f"{k} nan" for k in ("loss", "grad_norm") if k in m
    )
    if not shown:
        return f"step {first}"
    return f"step {first} ({shown}{'' if at == first else f' at step {at}'})"


__all__ = [
    "NonFiniteError",
    "Tally",
    "keep_if_finite",
    "nonfinite_flag",
    "POLICIES",
    "FLAG",
    "SKIPPED",
    "MAX_SKIPPED",
    "describe",
]
