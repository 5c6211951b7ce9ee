"""Checksums: a crc32c of every saved array slice, recorded at save, verified on demand.

Orbax and tensorstore check no array bytes (uncompressed zarr chunks carry no
checksum; orbax's zarr3 option checksums only the shard index). So each process
records, for every slice of an array it writes (its addressable shards with
``replica_id == 0``), the crc32c of the slice's bytes, in
``STEP/meta/checksums.<process>.json``.

Off the hot path: the save call only takes host views of the shards (on the CPU
the zero-copy views orbax takes too); the crc32c (the ``crc32c`` package,
hardware-accelerated, GIL released) runs in orbax's background commit thread,
beside the array writes, as part of the ``meta`` item's commit. A step is
complete only once its checksums are written.

:func:`verify_checksums` reads every recorded slice back through tensorstore
and names the array, the slice and the data file of any mismatch. ``ckpt
inspect`` runs it; a resume runs it with ``checkpoint.verify: true``.

Example::

    >>> import json, pathlib, tempfile
    >>> from partitioning.checkpoint.checksum import crc_of, verify_checksums
    >>> from partitioning.checkpoint.disk import resolve_checkpoint
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> w = jax.device_put(np.arange(64, dtype=np.float32), jax.NamedSharding(mesh, jax.P("fsdp")))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> step_dir = pt.save_checkpoint(run / "checkpoints", 6, {"w": w})
    >>> sums = step_dir / "meta" / "checksums.0.json"
    >>> recorded = json.loads(sums.read_text())
    >>> recorded["arrays"]["w"][1]                        # one record per device's slice
    {'index': [[8, 16]], 'crc32c': ...}
    >>> recorded["arrays"]["w"][1]["crc32c"] == crc_of(np.arange(8, 16, dtype=np.float32))
    True
    >>> verify_checksums(resolve_checkpoint(run))
    []
    >>> recorded["arrays"]["w"][1]["crc32c"] ^= 1        # the slice's bytes no longer match its record
    >>> _ = sums.write_text(json.dumps(recorded))
    >>> verify_checksums(resolve_checkpoint(run))
    ['array w: checksum mismatch in slice [8:16] (file .../checkpoints/6/state/d/...)']
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import crc32c
import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from partitioning.checkpoint.diagnose import ocdbt_problems
from partitioning.layout import path_str

CHECKSUM_FILE = "checksums.{}.json"
ALGORITHM = "crc32c"


def host_pieces(state: Any) -> list[tuple[str, list[list[int]], np.ndarray]]:
    """(path, slice as [[start, stop], ...], host array) of each slice this process writes.

    Host views, taken now: on the CPU ``np.asarray`` of a shard is a zero-copy view.
    """
    out = []
    for kp, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if not isinstance(leaf, jax.Array):
            continue  # numpy values and Python scalars: orbax stores them otherwise
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            continue  # stored as key data by orbax: not these bytes
        for shard in leaf.addressable_shards:
            if shard.replica_id != 0:
                continue
            index = [list(sl.indices(n)[:2]) for sl, n in zip(shard.index, leaf.shape, strict=True)]
            out.append((path_str(kp), index, np.asarray(shard.data)))
    return out


def crc_of(arr: np.ndarray, max_runs: int = 4096) -> int:
    """The crc32c of an array's bytes in C order; a strided view is checksummed run by run, without a copy
    (a view cut from a bigger buffer: its trailing contiguous block repeated ``runs`` times)."""
    arr = np.asarray(arr)
    if arr.flags.c_contiguous:
        return int(crc32c.crc32c(arr.data))
    lead = next(j for j in range(arr.ndim + 1) if arr[(0,) * j].flags.c_contiguous)
    if math.prod(arr.shape[:lead]) > max_runs:  # many short runs: one copy costs less than the calls
        return int(crc32c.crc32c(np.ascontiguousarray(arr).data))
    value = 0
    for idx in np.ndindex(*arr.shape[:lead]):
        value = crc32c.crc32c(arr[idx].data, value)
    return int(value)


def records(pieces: list[tuple[str, list[list[int]], np.ndarray]]) -> dict[str, list[dict[str, Any]]]:
    """``{path: [{"index": [[0, 8], [0, 32]], "crc32c": 123}, ...]}`` of host pieces."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path, index, arr in pieces:
        out.setdefault(path, []).append({"index": index, ALGORITHM: crc_of(arr)})
    return out


class MetaHandler(ocp.JsonCheckpointHandler):
    """The ``meta`` item's handler: orbax's JSON handler, plus this process's checksums in the commit thread."""

    async def async_save(self, directory: Any, item: Any = None, args: Any = None) -> list[Any] | None:
        futures: list[Any] = []
        if isinstance(args, MetaSave):
            pieces = host_pieces(args.state)
            path = Path(directory) / CHECKSUM_FILE.format(jax.process_index())

            async def write() -> None:
                # crc32c releases the GIL: the array writes go on beside it.
                data = await asyncio.to_thread(records, pieces)
                path.write_text(json.dumps({"algorithm": ALGORITHM, "arrays": data}))

            futures.append(ocp.future.CommitFutureAwaitingContractedSignals(write(), name="checksums"))
            args = ocp.args.JsonSave(args.item)
        return (await super().async_save(directory, item, args) or []) + futures


@ocp.args.register_with_handler(MetaHandler, for_save=True)
@dataclasses.dataclass
class MetaSave(ocp.args.CheckpointArgs):
    """The metadata JSON (``item``) and the state whose slices get checksums."""

    item: Any
    state: Any


@ocp.args.register_with_handler(MetaHandler, for_restore=True)
@dataclasses.dataclass
class MetaRestore(ocp.args.CheckpointArgs):
    """Reads the metadata JSON back (as ``ocp.args.JsonRestore`` does)."""

    item: Any = None


# -- verification --------------------------------------------------------------------------


def read_checksums(meta_dir: Path) -> dict[str, list[dict[str, Any]]] | None:
    """Every process's recorded checksums merged (None: the checkpoint has none, e.g. plain orbax)."""
    files = sorted(meta_dir.glob(CHECKSUM_FILE.format("*")))
    if not files:
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (ValueError, OSError):
            out.setdefault("", []).append({"damaged": str(f)})
            continue
        for path, recs in (data.get("arrays") or {}).items():
            out.setdefault(path, []).extend(recs)
    return out


def _store_spec(item: Path, name: str) -> dict[str, Any]:
    base = {"driver": "ocdbt", "base": {"driver": "file", "path": os.path.realpath(item) + "/"}, "path": name + "/"}
    return {"driver": "zarr3" if _has_key(item, f"{name}/zarr.json") else "zarr", "kvstore": base}


def _has_key(item: Path, key: str) -> bool:
    try:
        kv = ts.KvStore.open(
            {"driver": "ocdbt", "base": {"driver": "file", "path": os.path.realpath(item) + "/"}}
        ).result()
        return kv.read(key).result().state == "value"
    except Exception:
        return False


def files_of(item: Path, name: str) -> list[str]:
    """The files holding an array's chunks: OCDBT data files, or the B-tree node a small chunk is inlined in."""
    found: list[str] = []

    real = os.path.realpath(item)

    def file_of(location: str) -> str:
        _, base, rel = location.rsplit(":", 2)[0].split(":", 2)
        f = str(item / base / rel)
        # tensorstore gives the real path: say it under the path the user gave (relative stays relative)
        return str(item) + f[len(real) :] if f.startswith(real + os.sep) else f

    try:
        kv = ts.KvStore.open({"driver": "file", "path": os.path.realpath(item) + "/"}).result()
        versions = ts.ocdbt.dump(kv).result().get("versions") or []
        stack = [max(versions, key=lambda v: v.get("generation_number", 0))["root"]["location"]]
        while stack:
            node_loc = stack.pop()
            for entry in ts.ocdbt.dump(kv, node_loc).result().get("entries", []):
                child = entry.get("node")
                child = child.get("location") if isinstance(child, dict) else child
                if isinstance(child, str) and child.startswith("btreenode"):
                    stack.append(child)
                    continue
                key = entry.get("key", b"")
                key = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                if not key.startswith(name + "/") or key.endswith((".zarray", "zarr.json")):
                    continue
                value = entry.get("indirect_value")
                f = file_of(value) if isinstance(value, str) else file_of(node_loc)
                if f not in found:
                    found.append(f)
    except Exception:  # only for the message: a damaged tree is reported by verify() already
        pass
    return found


def verify_checksums(ref: Any, limit: int = 5) -> list[str]:
    """Reads back every recorded slice of a checkpoint; one problem per mismatch (empty: all match).

    ``ref`` is a :class:`~partitioning.checkpoint.disk.CheckpointRef`. A checkpoint
    without recorded checksums (plain orbax, older versions) has nothing to verify.
    """
    sums = read_checksums(ref.path / "meta")
    if not sums:
        return []
    problems = [f"damaged file {r['damaged']}" for r in sums.pop("", [])]
    missing = ocdbt_problems(ref.item)
    if missing:
        return (problems + missing)[:limit]
    return (problems + read_records(ref, sums, limit))[:limit]


def read_records(ref: Any, sums: dict[str, list[dict[str, Any]]], limit: int = 5) -> list[str]:
    """Reads these recorded slices back and compares their crc32c; one problem per mismatching array."""
    problems: list[str] = []
    for path, recs in sums.items():
        if len(problems) >= limit:
            break
        name = path.replace("/", ".")
        try:
            store = ts.open(_store_spec(ref.item, name), open=True, read=True).result()
            arrays = [store[tuple(slice(a, b) for a, b in r["index"])].read() for r in recs]
            bad = [r for r, fut in zip(recs, arrays, strict=True) if crc_of(fut.result()) != r[ALGORITHM]]
        except Exception as e:
            problems.append(f"array {path}: cannot read it back ({' '.join(str(e).split())[:160]})")
            continue
        for r in bad[:1]:
            where = ", ".join(f"{a}:{b}" for a, b in r["index"])
            files = files_of(ref.item, name)
            problems.append(
                f"array {path}: checksum mismatch in slice [{where}]"
                + (f" (file {files[0]})" if len(files) == 1 else f" (files {', '.join(files)})" if files else "")
            )
    return problems


__all__ = [
    "MetaHandler",
    "MetaSave",
    "host_pieces",
    "records",
    "read_checksums",
    "read_records",
    "verify_checksums",
    "CHECKSUM_FILE",
]
