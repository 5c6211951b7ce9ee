"""Writing safetensors from sharded parameters, one file tensor gathered at a time.

Each file tensor (one layer of one parameter; GPT-2's ``c_attn`` from the q,
k and v of its layer) is assembled on the host from the shards of the
parameter that hold it: without a copy of the device buffers on the CPU,
otherwise by slicing the layer on its device first. When the parameters span
several processes, the layer is sliced on the devices and all-gathered, and
process 0 writes: host memory stays about one tensor, whatever the model's
size. Files are written under temporary names and renamed when all are
complete, so a failed save leaves the directory as it was.

Example::

    >>> import pathlib, tempfile
    >>> from flax import traverse_util
    >>> from partitioning.hf.name_map import expand
    >>> from partitioning.hf.write import save_tensors
    >>> from partitioning.models.hf.families import FAMILIES
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp")
    >>> abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
    >>> names = traverse_util.flatten_dict(pt.logical_names(abstract))
    >>> maps, order = expand(FAMILIES["llama"].tensors, lambda opt: getattr(model, opt), 2, True, names)
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> config = pathlib.Path("tests/fixtures/hf/llama/config.json").read_text()
    >>> flat = traverse_util.flatten_dict(variables["params"])
    >>> save_tensors(maps, order, flat, out, max_shard_size=60_000, extra_files={"config.json": config})
    ['model-00001-of-00003.safetensors', 'model-00002-of-00003.safetensors', 'model-00003-of-00003.safetensors']
    >>> sorted(f.name for f in out.iterdir())[-2:]
    ['model-00003-of-00003.safetensors', 'model.safetensors.index.json']
    >>> _, again = pt.hf.load_hf(out)
    >>> bool((np.asarray(again["params"]["blocks"]["attn"]["q"]) == variables["params"]["blocks"]["attn"]["q"]).all())
    True
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import jax
import numpy as np
from jax.experimental import multihost_utils

from partitioning.hf.files import INDEX, file_names, plan_shards, write_safetensors
from partitioning.hf.name_map import ParamMap, layer_shape
from partitioning.outdir import folders_undone_on_failure

_OURS = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$")


@functools.cache
def _take(axes: tuple[int, ...]):
    def take(a, ix):
        index = [slice(None)] * a.ndim
        for axis, i in zip(axes, ix, strict=True):
            index[axis] = i
        return a[tuple(index)]

    return jax.jit(take)


Index = tuple[tuple[int, int], ...]  # (axis, index) pairs: one layer / one expert of a parameter


def _index(layer: int | Index | None) -> Index:
    return () if layer is None else ((0, layer),) if isinstance(layer, int) else tuple(layer)


def host_value(x: Any, layer: int | Index | None = None) -> np.ndarray:
    """``x`` (or ``x[layer]``, or ``x`` at ``((axis, index), ...)``) as one host array, holding no more than that."""
    at = dict(_index(layer))
    pick = tuple(at.get(j, slice(None)) for j in range(np.ndim(x)))
    if not isinstance(x, jax.Array):
        return np.asarray(x)[pick]
    if not x.is_fully_addressable:
        part = _take(tuple(at))(x, tuple(at.values())) if at else x
        return np.asarray(multihost_utils.process_allgather(part, tiled=True))
    shape = tuple(n for j, n in enumerate(x.shape) if j not in at)
    out = np.empty(shape, x.dtype)
    cpu = all(d.platform == "cpu" for d in cast(set[jax.Device], x.sharding.device_set))
    seen = set()
    for shard in x.addressable_shards:
        box = tuple(s.indices(n)[:2] for s, n in zip(shard.index, x.shape, strict=True))
        if box in seen or not all(box[a][0] <= i < box[a][1] for a, i in at.items()):
            continue
        seen.add(box)
        dst = tuple(slice(*r) for j, r in enumerate(box) if j not in at)
        local = tuple(at[j] - box[j][0] if j in at else slice(None) for j in range(len(box)))
        if not at:
            out[dst] = np.asarray(shard.data)
        elif cpu:
            out[dst] = np.asarray(shard.data)[local]  # a view, no copy
        else:
            out[dst] = np.asarray(shard.data[local])
    return out


def contributions(maps: Sequence[ParamMap]) -> dict[str, list[tuple[ParamMap, Index | None]]]:
    """File tensor name -> the (parameter, (axis, index) pairs: layer / expert) it is made of, by part."""
    out: dict[str, list[tuple[ParamMap, Index | None]]] = defaultdict(list)
    for m in maps:
        for i, name in enumerate(m.hf):
            ix = np.unravel_index(i, m.counts) if m.index_axes else ()
            out[name].append((m, tuple(zip(m.index_axes, map(int, ix), strict=True)) or None))
    for parts in out.values():
        parts.sort(key=lambda mp: mp[0].part or 0)
    return out


def save_tensors(
    maps: Sequence[ParamMap],
    order: Sequence[str],
    params: Mapping[tuple[str, ...], Any],
    out_dir: Path,
    *,
    max_shard_size: int,
    dtype: Any = None,
    extra_files: Mapping[str, str] | None = None,
    file_name: str | None = None,
) -> list[str]:
    """Writes the file tensors (``order``) of ``params`` (flat: path -> array) to ``out_dir``; the file names.

    ``extra_files`` (name -> text, e.g. ``config.json``) are written with the same all-or-nothing rename;
    ``file_name`` names a single file (``adapter_model.safetensors``) instead of ``model.safetensors``.
    """
    parts = contributions(maps)
    entries = {}
    for name in order:
        m, _ = parts[name][0]
        shape = layer_shape(m, tuple(params[m.path].shape))
        entries[name] = (name, np.dtype(dtype or params[m.path].dtype), m.file_shape(shape))
    sizes = [(n, int(np.prod(e[2])) * e[1].itemsize) for n, e in entries.items()]
    shards = plan_shards(sizes, max_shard_size)
    names = [file_name] if file_name is not None and len(shards) == 1 else file_names(len(shards))

    def arrays(tensors: list[str]) -> Iterator[np.ndarray]:
        for t in tensors:
            (m, _), *_ = parts[t]
            values = [host_value(params[p.path], at) for p, at in parts[t]]
            if m.split:  # parts of unequal sizes: each its own rows, one after the other
                yield np.concatenate([p.pattern.to_file([v]) for (p, _), v in zip(parts[t], values, strict=True)])
            else:
                yield m.pattern.to_file(values)

    writer = jax.process_index() == 0
    files = dict(extra_files or {})
    if len(shards) > 1:
        weight_map = {t: f for f, tensors in zip(names, shards, strict=True) for t in tensors}
        total = sum(n for _, n in sizes)
        files[INDEX] = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    with folders_undone_on_failure(out_dir, enabled=writer):  # a failed save leaves no folder it made
        tmp: dict[str, Path] = {}
        done = False
        try:
            if writer:
                out_dir.mkdir(parents=True, exist_ok=True)
            for fname, tensors in zip(names, shards, strict=True):
                if writer:
                    tmp[fname] = out_dir / f".{fname}.partial"
                    write_safetensors(tmp[fname], [entries[t] for t in tensors], arrays(tensors))
                else:
                    for _ in arrays(tensors):  # the gathers are collectives: every process takes part
                        pass
            if writer:
                for fname, text in files.items():
                    tmp[fname] = out_dir / f".{fname}.partial"
                    tmp[fname].write_text(text)
                for f in out_dir.iterdir():
                    if _OURS.match(f.name) and f.name not in tmp:
                        f.unlink()  # another save's shards: they would shadow or mix with these
                for fname, path in tmp.items():
                    os.replace(path, out_dir / fname)
            done = True
        finally:
            if not done:
                for path in tmp.values():
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("partitioning.hf.save_hf")
    return names


__all__ = ["save_tensors", "host_value", "contributions"]
