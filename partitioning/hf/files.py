"""Hugging Face checkpoint files: ``config.json``, safetensors headers (validated), sharded indexes, writing.

The safetensors format is an 8-byte little-endian header length, a JSON
header ``{name: {dtype, shape, data_offsets}}`` (plus ``__metadata__``) and
the row-major tensor bytes. Headers are parsed here, without the
``safetensors`` package, and checked against the file size, so a truncated
download is one :class:`~partitioning.CheckpointError` naming the file and
the tensor before any read. Pickled PyTorch weights (``pytorch_model.bin``,
``*.pt``) are never opened: loading them can run code.

Example::

    >>> import pathlib, shutil, tempfile
    >>> from partitioning.hf.files import discover
    >>> tensors = discover("tests/fixtures/hf/llama_sharded")   # 4 files and model.safetensors.index.json
    >>> len(tensors), tensors["model.norm.weight"].file.name, tensors["model.norm.weight"].shape
    (21, 'model-00004-of-00004.safetensors', (32,))
    >>> copy = pathlib.Path(tempfile.mkdtemp()) / "llama"
    >>> _ = shutil.copytree("tests/fixtures/hf/llama", copy)
    >>> f = copy / "model.safetensors"
    >>> _ = f.write_bytes(f.read_bytes()[:-100])       # a download cut short
    >>> discover(copy)
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: .../llama/model.safetensors: truncated: tensor 'model.norm.weight' ends at \
byte 158424 but the file has 158324 bytes
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from partitioning.errors import CheckpointError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
DTYPE_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_MAX_HEADER = 100 * 2**20  # safetensors' own limit


@dataclass(frozen=True)
class Stored:
    """One tensor in a safetensors file: where its bytes are (``start``: absolute offset)."""

    name: str
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int


def read_config(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """``(checkpoint dir, config.json dict)`` for a checkpoint directory or its ``config.json``."""
    p = Path(path)
    cfg_path = p if p.name == "config.json" or p.is_file() else p / "config.json"
    if not cfg_path.is_file():
        where = f"{p} does not exist" if not p.exists() else f"{p} has no config.json"
        raise CheckpointError(f"{where}: a Hugging Face checkpoint is a directory with config.json and *.safetensors")
    return cfg_path.parent, read_json_object(cfg_path)


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON file holding one object (``config.json``, ``adapter_config.json``); anything else is one line."""
    try:
        cfg = json.loads(file.read_bytes())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}:{e.lineno}: not valid JSON: {e.msg}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{file}: not a JSON file (not UTF-8 text)") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def read_header(file: Path) -> dict[str, Stored]:
    """The tensors of one safetensors file, every offset checked against the file's size."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if n < 2 or n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{file}: not a safetensors file (truncated or damaged header)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{file}: not a safetensors file (its header is not JSON)") from None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{file}: damaged header entry for tensor {name!r}") from None
        if dtype not in DTYPES:
            raise CheckpointError(
                f"{file}: tensor {name!r} has dtype {dtype}; weights must be one of {', '.join(DTYPES)}"
            )
        np_dtype = np.dtype(DTYPES[dtype])
        if end - begin != math.prod(shape) * np_dtype.itemsize or begin < 0:
            raise CheckpointError(f"{file}: tensor {name!r} has {end - begin} bytes for shape {list(shape)} {dtype}")
        if 8 + n + end > size:
            raise CheckpointError(
                f"{file}: truncated: tensor {name!r} ends at byte {8 + n + end} but the file has {size} bytes"
            )
        out[name] = Stored(name, file, np_dtype, shape, 8 + n + begin)
    return out


def discover(directory: str | os.PathLike) -> dict[str, Stored]:
    """Every tensor of a checkpoint: a sharded ``model.safetensors.index.json`` or one ``model.safetensors``."""
    d = Path(directory)
    index = d / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{index}: not a safetensors index (no weight_map)") from None
        tensors: dict[str, Stored] = {}
        for fname in sorted(set(weight_map.values())):
            if not (d / fname).is_file():
                first = next(k for k, v in weight_map.items() if v == fname)
                raise CheckpointError(f"{index}: shard {fname} (tensor {first!r}) is missing from {d}")
            tensors.update(read_header(d / fname))
        for name, fname in weight_map.items():
            if name not in tensors:
                raise CheckpointError(f"{index}: tensor {name!r} is not in its shard {fname}")
        return tensors
    if (d / SINGLE).is_file():
        return read_header(d / SINGLE)
    pickles = sorted(p.name for pat in PICKLES for p in d.glob(pat))
    if pickles:
        raise CheckpointError(
            f"{d} has PyTorch pickle weights ({pickles[0]}) but no safetensors; convert them to safetensors "
            "(transformers: from_pretrained(...).save_pretrained(out)) - pickles are never loaded (they can run code)"
        )
    raise CheckpointError(f"{d} has no {SINGLE} or {INDEX}")


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(size: int | str) -> int:
    """``"5GB"`` -> 5 * 10**9 (transformers' units: KB/MB/GB are powers of 10, KiB/MiB/GiB of 2).

    Example::

        >>> from partitioning.hf.files import parse_size
        >>> parse_size("500MB"), parse_size("1GiB"), parse_size(1000)
        (500000000, 1073741824, 1000)
    """
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(size).upper())
    if not m or m.group(2) not in _UNITS:
        raise CheckpointError(f"max_shard_size {size!r} is not a size such as '5GB', '500MB' or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def plan_shards(sizes: list[tuple[str, int]], limit: int) -> list[list[str]]:
    """Tensor names per file, as transformers splits them: in order, a new file when the next tensor would
    pass ``limit``; a tensor larger than ``limit`` alone in its file."""
    shards: list[list[str]] = []
    current: list[str] = []
    used = 0
    for name, n in sizes:
        if n > limit:
            shards.append([name])
            continue
        if current and used + n > limit:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += n
    if current or not shards:
        shards.append(current)
    return shards


def file_names(count: int) -> list[str]:
    return [SINGLE] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_safetensors(path: Path, entries: list[tuple[str, np.dtype, tuple[int, ...]]], arrays: Any) -> None:
    """Writes one file: the header from ``entries`` (name, dtype, shape), then each array ``arrays`` yields,
    in order, one at a time (``{"format": "pt"}`` metadata: transformers requires it)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in entries:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": DTYPE_NAMES[np.dtype(dtype)],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for (name, dtype, shape), arr in zip(entries, arrays, strict=True):
            arr = np.ascontiguousarray(arr, dtype=dtype)
            assert arr.shape == tuple(shape), (name, arr.shape, shape)
            f.write(arr.reshape(-1).view(np.uint8).data)


__all__ = [
    "Stored",
    "read_config",
    "read_json_object",
    "read_header",
    "discover",
    "parse_size",
    "plan_shards",
    "file_names",
    "write_safetensors",
    "INDEX",
    "SINGLE",
    "DTYPES",
]
