"""Restore-time integrity: a checkpoint is checked while it is read, by default.

Before any array is read, the step's parts must all be there (:func:`~partitioning.checkpoint.disk.step_damage`:
``state/_METADATA``, ``meta/metadata``, every process's ``meta/checksums.<p>.json``) and every data file the
OCDBT tree references must exist and be long enough (:func:`~partitioning.checkpoint.diagnose.verify`).
While the arrays are read (:mod:`partitioning.checkpoint.reader`), each recorded slice that lies inside a
slice being read is checksummed from the bytes just read -- no second read. Onto a layout whose slices cut
across the recorded ones, the reader reads the recorded slices instead (each once), checksums them and cuts
the new slices from them. Only slices not read as stored bytes (a dtype cast while reading, a PRNG key,
orbax's own reader) are read back once more afterwards
(:func:`partitioning.checkpoint.checksum.verify_checksums`' reads), only for the arrays restored.

Example::

    >>> import json, pathlib, tempfile
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> w = jax.device_put(np.arange(64, dtype=np.float32), jax.NamedSharding(mesh, jax.P("fsdp")))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> step_dir = pt.save_checkpoint(run / "checkpoints", 6, {"w": w})
    >>> (step_dir / "meta" / "checksums.0.json").unlink()      # integrity data gone: that is damage
    >>> pt.restore_checkpoint(run, {"w": w.sharding})
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: checkpoint step 6 (.../checkpoints/6) is damaged: missing file \
.../checkpoints/6/meta/checksums.0.json (the step's checksums); not restored; no earlier good step: ...
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from partitioning.checkpoint.checksum import ALGORITHM, crc_of, files_of, read_checksums, read_records
from partitioning.checkpoint.diagnose import verify
from partitioning.checkpoint.disk import CheckpointRef, StepInfo, damaged_error, list_steps, step_damage
from partitioning.errors import CheckpointError


def _steps_beside(ref: CheckpointRef) -> list[StepInfo]:
    if ref.step is None or ref.path == ref.item:
        return []
    try:
        return list_steps(ref.path.parent)
    except CheckpointError:
        return []


def refuse(ref: CheckpointRef, problem: str | Exception) -> CheckpointError:
    """A damaged checkpoint as one line: the step, the file, and the earlier good step. ``problem`` may be the
    error reading the step raised (its ``checkpoint <ref>:`` prefix is dropped)."""
    if isinstance(problem, Exception):
        problem = str(problem).removeprefix(f"checkpoint {ref}: ")
    if ref.step is not None:
        steps = _steps_beside(ref)
        return damaged_error(StepInfo(ref.step, ref.path, False, 0, 0.0, problem), steps)
    return CheckpointError(f"checkpoint {ref} is damaged: {problem}; not restored")


def check_parts(ref: CheckpointRef, base: bool = True) -> None:
    """Every part of a step and every data file it references is there (no array data read); with ``base``,
    the frozen params it refers to too (:mod:`partitioning.checkpoint.base`)."""
    problem = step_damage(ref.path, base) if ref.path != ref.item else None
    problems = [problem] if problem else verify(ref)
    if problems:
        raise refuse(ref, problems[0])


class ReadCheck:
    """The recorded checksums of a checkpoint, matched against the bytes the reader reads.

    The reader calls :meth:`read` for each slice it read; records inside it are checksummed from those
    bytes. :meth:`finish` reads back the records of restored arrays no read covered, and raises the first
    mismatch as one line naming the array, the slice and the step.
    """

    def __init__(self, ref: CheckpointRef, records: dict[str, list[dict[str, Any]]], dtypes: dict[str, Any]):
        self.ref = ref
        self.dtypes = {path.replace("/", "."): np.dtype(dt) for path, dt in dtypes.items()}
        # orbax names an array's store by its path with dots (params.wi_0)
        self.records = {path.replace("/", "."): (path, recs) for path, recs in records.items()}
        self.done: set[tuple[str, int]] = set()
        self.restored: set[str] = set()
        self.bad: list[str] = []
        self._lock = threading.Lock()

    def same_dtype(self, name: str, dtype: Any) -> bool:
        """The bytes read for ``name`` are the stored ones (not cast on the way)."""
        try:
            return self.dtypes.get(name) == np.dtype(dtype)
        except TypeError:
            return False

    def wants(self, name: str) -> None:
        """An array being restored (its records must all be checked by the end)."""
        self.restored.add(name)

    def stored_slices(self, name: str) -> list[tuple]:
        """The slices recorded at save for ``name`` (every process's), as ``((start, stop), ...)``."""
        _, recs = self.records.get(name, (name, []))
        return [tuple((int(a), int(b)) for a, b in r["index"]) for r in recs]

    def covered(self, name: str, keys: Iterable[tuple]) -> None:
        """Records inside any of these slices (every process's) are checked by whoever reads them."""
        _, recs = self.records.get(name, (name, []))
        keys = list(keys)
        for i, r in enumerate(recs):
            if any(_inside(r["index"], key) for key in keys):
                self.done.add((name, i))

    def read(self, name: str, key: tuple, buf: np.ndarray) -> None:
        """Checksums the records inside slice ``key`` from ``buf``, the bytes just read for it."""
        path, recs = self.records.get(name, (name, []))
        for r in recs:
            if not _inside(r["index"], key):
                continue
            sub = buf[tuple(slice(a - k0, b - k0) for (a, b), (k0, _) in zip(r["index"], key, strict=True))]
            if crc_of(sub) != r[ALGORITHM]:
                with self._lock:
                    self.bad.append(_mismatch(self.ref, path, r))

    def finish(self) -> None:
        """Reads back what no read covered (restored arrays only); raises the first mismatch."""
        if not self.bad:
            leftover: dict[str, list[dict[str, Any]]] = {}
            me, n = jax.process_index(), jax.process_count()
            k = 0
            for name in sorted(self.restored):
                path, recs = self.records.get(name, (name, []))
                for i, r in enumerate(recs):
                    if (name, i) in self.done:
                        continue
                    if k % n == me:  # each left-over slice read back by one process
                        leftover.setdefault(path, []).append(r)
                    k += 1
            if leftover:
                self.bad += read_records(self.ref, leftover)
        if self.bad:
            more = f" (and {len(self.bad) - 1} more)" if len(self.bad) > 1 else ""
            raise refuse(self.ref, self.bad[0] + more)


def _inside(index: list[list[int]], key: tuple) -> bool:
    return len(index) == len(key) and all(k0 <= a and b <= k1 for (a, b), (k0, k1) in zip(index, key, strict=True))


def _mismatch(ref: CheckpointRef, path: str, r: dict[str, Any]) -> str:
    where = ", ".join(f"{a}:{b}" for a, b in r["index"])
    files = files_of(ref.item, path.replace("/", "."))
    found = f" (file {files[0]})" if len(files) == 1 else f" (files {', '.join(files)})" if files else ""
    return f"array {path}: checksum mismatch in slice [{where}]{found}"


def read_check(ref: CheckpointRef, dtypes: dict[str, Any]) -> ReadCheck | None:
    """The check for a restore of ``ref`` (None: a plain orbax checkpoint records no checksums)."""
    sums = read_checksums(ref.path / "meta")
    if sums is None:
        return None
    damaged = sums.pop("", [])
    if damaged:
        raise refuse(ref, f"damaged file {damaged[0]['damaged']}")
    return ReadCheck(ref, sums, dtypes)


__all__ = ["ReadCheck", "check_parts", "read_check", "refuse"]
