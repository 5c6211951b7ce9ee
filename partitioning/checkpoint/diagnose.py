"""Damage diagnosis: an orbax / tensorstore failure -> one line naming the damaged file.

Walks an OCDBT database's B-tree (with tensorstore, reading no array data) and
checks that every file it references exists and is long enough, so a
truncated or missing file is named instead of a 200-line traceback.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
    >>> from partitioning.checkpoint.diagnose import verify
    >>> from partitioning.checkpoint.disk import resolve_checkpoint
    >>> verify(resolve_checkpoint(run))
    []
    >>> data = max((step_dir / "state" / "d").iterdir(), key=lambda f: f.stat().st_size)
    >>> _ = data.write_bytes(data.read_bytes()[:100])       # a copy cut short
    >>> verify(resolve_checkpoint(run))
    ['truncated file .../checkpoints/10/state/d/... (100 bytes, needs at least ...)']
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorstore as ts

from partitioning.errors import CheckpointError

_READ_ERR = re.compile(r'Error reading "([^"]+)" in OCDBT database at local file "([^"]+)"')
_MISSING_KEY = re.compile(r'"([^"]+)" in OCDBT database at local file "([^"]+)" does not exist')


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:200] + "…") if len(text) > 200 else text


def _causes(e: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _parse_location(loc: str) -> tuple[str, str, int, int]:
    """``value:ocdbt.process_0/:d/abc:1090:1116`` -> (base, relpath, offset, length)."""
    head, off, length = loc.rsplit(":", 2)
    _, base, rel = head.split(":", 2)
    return base, rel, int(off), int(length)


def _check_file(db: Path, loc: str) -> str | None:
    """What is wrong with the file a location points into, or None."""
    base, rel, off, length = _parse_location(loc)
    f = db / base / rel
    if not f.exists():
        return f"missing file {f}"
    size = f.stat().st_size
    if size < off + length:
        return f"truncated file {f} ({size} bytes, needs at least {off + length})"
    return None


def ocdbt_problems(db: Path, only_key: str | None = None, limit: int = 5) -> list[str]:
    """Walks an OCDBT database's B-tree and checks every data file it references exists
    and is long enough, without reading array data. Returns problems (empty: all good).
    """
    if not (db / "manifest.ocdbt").exists():
        return [f"missing file {db / 'manifest.ocdbt'}"]
    problems: list[str] = []
    try:
        # tensorstore refuses paths with `..`: open the absolute form (messages keep the user's).
        kv = ts.KvStore.open({"driver": "file", "path": os.path.realpath(db) + "/"}).result()
        manifest = ts.ocdbt.dump(kv).result()
    except Exception:
        return [f"damaged file {db / 'manifest.ocdbt'}"]
    versions = manifest.get("versions") or []
    if not versions:
        return problems
    root = max(versions, key=lambda v: v.get("generation_number", 0)).get("root", {}).get("location")

    def visit(node_loc: str) -> None:
        if len(problems) >= limit:
            return
        bad = _check_file(db, node_loc)
        if bad:
            problems.append(bad)
            return
        try:
            node = ts.ocdbt.dump(kv, node_loc).result()
        except Exception:
            base, rel, _, _ = _parse_location(node_loc)
            problems.append(f"damaged file {db / base / rel}")
            return
        for entry in node.get("entries", []):
            key = entry.get("key", b"")
            key = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            child = entry.get("node")
            if isinstance(child, dict):
                child = child.get("location")
            if isinstance(child, str) and child.startswith("btreenode"):
                visit(child)
                continue
            value = entry.get("indirect_value")
            if isinstance(value, str) and (only_key is None or key == only_key):
                bad = _check_file(db, value)
                if bad and bad not in problems:
                    problems.append(f"{bad} (holds {_held(key)})")
                    if len(problems) >= limit:
                        return

    if root:
        visit(root)
    return problems


def _held(key: str) -> str:
    """An OCDBT key (``params.w/0.1``: orbax's dotted array name, then the zarr chunk) as messages name arrays."""
    name, _, chunk = key.partition("/")
    where = f", chunk ({', '.join(chunk.split('.'))})" if chunk and chunk[0].isdigit() else ""
    return f"array {name.replace('.', '/')}{where}"


def verify(ref: Any) -> list[str]:
    """Every problem found in a checkpoint's files (empty list: it is readable)."""
    problems = []
    if not (ref.item / "_METADATA").exists():
        problems.append(f"missing file {ref.item / '_METADATA'}")
    if (ref.item / "manifest.ocdbt").exists() or any(ref.item.glob("ocdbt.process_*")):
        problems += ocdbt_problems(ref.item)
    return problems


def diagnose(ref: Any, error: BaseException) -> CheckpointError:
    """A one-line CheckpointError naming the checkpoint and the damaged file for an orbax failure."""
    for e in _causes(error):
        if isinstance(e, CheckpointError):
            return e
        text = str(e)
        m = _READ_ERR.search(text)
        if m:
            key, db = m.group(1), Path(m.group(2))
            found = ocdbt_problems(db, only_key=key) or ocdbt_problems(db)
            what = found[0] if found else f"unreadable data ({_first_line(e)})"
            array = key.split("/")[0].replace(".", "/")  # orbax names arrays a.b.c
            return CheckpointError(f"checkpoint {ref}: cannot read array {array}: {what}")
        m = _MISSING_KEY.search(text)
        if m:
            db = Path(m.group(2))
            found = ocdbt_problems(db)
            what = found[0] if found else f"array data {m.group(1)!r} not found"
            return CheckpointError(f"checkpoint {ref}: {what}")
        if isinstance(e, FileNotFoundError):
            name = e.filename or (text.rsplit(" ", 1)[-1].rstrip("."))
            return CheckpointError(f"checkpoint {ref}: missing file {name}")
    found = verify(ref)
    if found:
        return CheckpointError(f"checkpoint {ref}: {found[0]}")
    return CheckpointError(f"checkpoint {ref}: cannot restore: {_first_line(error)}")


__all__ = ["ocdbt_problems", "verify", "diagnose"]
