"""A hardware profile from a YAML file: :class:`~partitioning.tune.hardware.Hardware`'s keys, every error at
``file:line``.

Example (``my_gpu.yaml``)::

    name: my-gpu
    peak_flops: 4.0e14
    memory: 48GiB
    memory_bandwidth: 1.0e12
    topology: nodes
    node_size: 4
    link_bandwidth: 2.0e11
    network_bandwidth: 2.5e10

The same profile as a one-line YAML mapping, loaded::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "my_gpu.yaml"
    >>> _ = path.write_text("{name: my-gpu, peak_flops: 4.0e14, memory: 48GiB, memory_bandwidth: 1.0e12, "
    ...                     "topology: nodes, node_size: 4, link_bandwidth: 2.0e11, network_bandwidth: 2.5e10}")
    >>> hw = pt.tune.load_hardware(path)
    >>> hw.name, hw.peak_flops, hw.memory
    ('my-gpu', 400000000000000.0, 51539607552)
    >>> _ = path.write_text("{name: my-gpu, peak_flops: 4.0e14, memory: 48 gigs, memory_bandwidth: 1.0e12, "
    ...                     "topology: nodes, node_size: 4, link_bandwidth: 2.0e11}")
    >>> pt.tune.load_hardware(path)
    Traceback (most recent call last):
    partitioning.errors.ConfigError: .../my_gpu.yaml: missing key 'network_bandwidth'
    .../my_gpu.yaml:1: memory: expected a size such as 80GiB or 16GB, got '48 gigs'
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from partitioning.errors import ConfigError, did_you_mean
from partitioning.fmt import parse_bytes  # the size parser the configs use
from partitioning.tune.efficiency import GemmTable
from partitioning.tune.hardware import KINDS, Hardware
from partitioning.yamlfile import read_yaml, where

# Link curves are the built-in profiles' (a file gives the peaks and the latency: link_bandwidth, ...).
_FIELDS = {f.name: f for f in dataclasses.fields(Hardware) if f.name != "links"}
_REQUIRED = ("peak_flops", "memory", "memory_bandwidth", "topology", "node_size", "link_bandwidth", "network_bandwidth")


def load_hardware(path: str | Path) -> Hardware:
    """A profile from a YAML file with :class:`Hardware`'s keys (sizes may be written ``80GiB``).

    Example (``my_gpu.yaml``)::

        name: my-gpu
        peak_flops: 4.0e14
        memory: 48GiB
        memory_bandwidth: 1.0e12
        topology: nodes          # or torus (then torus_dims: 2 or 3)
        node_size: 4
        link_bandwidth: 2.0e11   # bytes/s per device inside a node (per torus axis for a torus)
        network_bandwidth: 2.5e10
        gemm: gemm.json          # optional: a GEMM table (benchmarks/gpu/bench_gpu.py --only gemm writes one)

    ``gemm`` is a JSON file, relative to the YAML file: ``points`` of ``[m, n, k, tflops]`` with
    ``peak_flops`` (or ``[m, n, k, share]``), its ``source`` and ``date``
    (:class:`~partitioning.tune.efficiency.GemmTable`).
    """
    shown = str(path)
    data, lines = read_yaml(Path(path), "hardware file")
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: a hardware file is a mapping with keys {', '.join(_REQUIRED)}")
    errors = []
    for k in data:
        if k not in _FIELDS:
            errors.append(f"{where(shown, lines, (k,))}: unknown key{did_you_mean(k, list(_FIELDS))}")
    for k in _REQUIRED:
        if k not in data:
            errors.append(f"{shown}: missing key {k!r}")
    kw: dict[str, Any] = {"name": str(data.get("name", Path(path).stem))}
    for k, v in data.items():
        if k not in _FIELDS or k == "name":
            continue
        try:
            kw[k] = _gemm(Path(path).parent, v) if k == "gemm" else _value(k, v, parse_bytes)
        except (TypeError, ValueError, KeyError) as e:
            errors.append(f"{where(shown, lines, (k,))}: {e}")
    if errors:
        raise ConfigError("\n".join(errors))
    return Hardware(**kw)


def _value(key: str, v: Any, parse_bytes: Any) -> Any:
    if key == "topology":
        if v not in ("nodes", "torus"):
            raise ValueError(f"expected 'nodes' or 'torus', got {v!r}")
        return v
    if key in ("alloc_bandwidth", "host_bandwidth", "host_memory_bandwidth"):
        return None if v is None else _positive(v)
    if key in ("description",):
        return str(v)
    if key == "sources":
        return tuple(str(x) for x in (v if isinstance(v, list) else [v]))
    if key in ("overlap", "measured"):
        if not isinstance(v, bool):
            raise ValueError(f"expected true or false, got {v!r}")
        return v
    if key == "collective_bandwidth":
        if not isinstance(v, dict) or any(k not in KINDS for k in v):
            raise ValueError(f"expected a mapping of {', '.join(KINDS)} to bytes/s")
        return {k: _positive(x) for k, x in v.items()}
    if key == "contention":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"expected a share of a collective's time in [0, 1), got {v!r}")
        return float(v)
    if key == "efficiency":
        v = _positive(v)
        if v > 1:
            raise ValueError(f"expected a share of peak_flops in (0, 1], got {v!r}")
        return v
    if key == "host_memory" and v is None:
        return None
    if key in ("memory", "host_memory"):
        n = parse_bytes(v)
        if n < 1:
            raise ValueError("must be at least 1 byte")
        return n
    if key in ("node_size", "torus_dims"):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "torus_dims" else 1):
            raise ValueError(f"expected a positive integer, got {v!r}")
        return v
    return _positive(v)


def _gemm(folder: Path, v: Any) -> GemmTable | None:
    """The GEMM table of a JSON file named relative to the hardware file."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"expected the path of a GEMM table's JSON file, got {v!r}")
    f = folder / v
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {f} as JSON ({type(e).__name__})") from None
    try:
        return GemmTable.from_json(data)
    except KeyError as e:
        need = e.args[0]
        raise ValueError(f"{f}: a GEMM table needs {need!r} (points of [m, n, k, tflops] and peak_flops)") from None


def _positive(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"expected a positive number, got {v!r}")
    return float(v)


__all__ = ["load_hardware"]
