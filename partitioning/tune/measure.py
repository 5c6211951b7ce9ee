"""The ``cpu`` profile, measured on the spot over the simulated devices this process has.

Simulated CPU devices share the machine's cores, and a shared machine's wall
clock says as much about the neighbours as about the program. So time is
measured in **device-seconds**: the process's CPU time (user + system, all
threads) divided by the number of devices, i.e. the wall time each device
would take with a core of its own. Step times measured the same way
(:func:`device_seconds`) compare with what this profile predicts.

Measured, with every device busy at once:

- ``peak_flops``: a float32 matmul per device (``m x m`` by ``m x m``), and a
  GEMM table (:func:`gemm_sweep`: every ``(m, n, k)`` of a small grid, its
  share of the fastest), which prices each matmul at its shape;
- ``memory_bandwidth``: an elementwise ``x * a + b`` over a large array (read + write);
- per collective kind (all-gather, reduce-scatter, all-reduce) a latency and a
  bandwidth, fitted to ``t = latency + f bytes / W`` at two buffer sizes
  (``f`` as in :func:`partitioning.tune.hardware.collective_time`).

- ``alloc_bandwidth``: a step writing a fresh 64 MiB output per device, beyond
  the same step writing into its donated input. XLA's CPU runtime maps a step's temporary buffers anew for
  every step and the kernel faults in and zeroes each page: a step with 70 MB
  of temporaries per device spends about as long in the kernel as in its
  elementwise ops.

Collectives on the CPU are memory copies on the same cores that compute, so
the profile does not overlap them with compute.

:func:`local_profile` is the profile of the devices this process runs on, for
choices made at run start (``model.remat: auto``): an accelerator's built-in
profile by its ``device_kind`` (:func:`device_profile`); for the CPU the
measured one, kept in a cache file (:func:`cpu_profile`: one measurement per
machine, device count and jax version; delete the file to measure again).

Example::

    >>> import time
    >>> from partitioning.tune.measure import device_seconds
    >>> mesh = pt.make_mesh({"data": -1})
    >>> x = jax.device_put(jnp.ones((8 * 256, 256)), jax.NamedSharding(mesh, jax.P("data")))
    >>> f = jax.jit(lambda x: x * 1.5 + 1.0)
    >>> cpu = time.process_time()
    >>> t = device_seconds(lambda: f(x), devices=8)     # CPU seconds of one call, per device
    >>> 0 < t < time.process_time() - cpu
    True

:func:`measure_cpu` runs such timings for each quantity (see its example).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from partitioning.tune.efficiency import GemmTable
from partitioning.tune.hardware import PROFILES, Hardware


def device_seconds(fn: Callable[[], Any], devices: int, repeats: int = 3, min_seconds: float = 0.05) -> float:
    """CPU seconds of one call divided by ``devices``: the median of ``repeats`` timings, each of
    enough calls to last ``min_seconds`` of CPU time (after a warm-up call)."""
    jax.block_until_ready(fn())
    t0 = time.process_time()
    jax.block_until_ready(fn())
    calls = max(1, min(1000, int(min_seconds / max(time.process_time() - t0, 1e-6))))
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            jax.block_until_ready(fn())
        out.append((time.process_time() - t0) / calls / devices)
    return max(statistics.median(out), 1e-9)


def fault_bandwidth(mesh: Any, nbytes: int = 1 << 26, repeats: int = 3) -> float:
    """Bytes per device-second of a step writing fresh memory (a new output buffer) beyond
    writing memory it already has (the same op with its input donated)."""
    n = mesh.devices.size
    split = NamedSharding(mesh, P("d"))
    k = nbytes // 4
    x = jax.device_put(jnp.ones((n * k,), jnp.float32), split)
    fresh = jax.jit(lambda v: v * 1.5 + 1.0, out_shardings=split)
    inplace = jax.jit(lambda v: v * 1.5 + 1.0, out_shardings=split, donate_argnums=0)
    y = [jax.device_put(jnp.ones((n * k,), jnp.float32), split)]

    def donated():
        y[0] = inplace(y[0])
        return y[0]

    t_fresh = device_seconds(lambda: fresh(x), n, repeats)
    t_inplace = device_seconds(donated, n, repeats)
    return nbytes / max(t_fresh - t_inplace, 1e-9)


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def gemm_sweep(
    mesh: Any, sizes: tuple[int, ...] = (32, 128, 512), min_seconds: float = 0.02
) -> tuple[float, GemmTable]:
    """``(the fastest FLOP/s, the table of every shape's share of it)``: a float32 ``(m, k) x (k, n)`` matmul per
    device for each ``m, n, k`` of ``sizes``, every device busy at once, in device-seconds.

    Example::

        >>> from partitioning.tune.measure import gemm_sweep
        >>> peak, table = gemm_sweep(pt.make_mesh({"d": -1}), sizes=(16, 64))
        >>> peak > 0, max(table.share), 0 < table.efficiency(16, 16, 16) < 1
        (True, 1.0, True)
    """
    n = mesh.devices.size
    split = NamedSharding(mesh, P(mesh.axis_names[0]))
    rates = {}
    for m in sizes:
        for k in sizes:
            a = jax.device_put(jnp.ones((n * m, k), jnp.float32), split)
            for cols in sizes:
                b = jax.device_put(jnp.ones((n * k, cols), jnp.float32), split)
                f = jax.jit(
                    lambda a, b, m=m, k=k, cols=cols: jnp.einsum(
                        "nij,njk->nik", a.reshape(n, m, k), b.reshape(n, k, cols)
                    ),
                    out_shardings=split,
                )
                t = device_seconds(functools.partial(f, a, b), n, repeats=1, min_seconds=min_seconds)
                rates[(m, cols, k)] = 2.0 * m * cols * k / t
    peak = max(rates.values())
    points = [(m, c, k, r / peak) for (m, c, k), r in rates.items()]
    src = f"measured on the spot: partitioning.tune.measure.gemm_sweep, float32, {n} devices"
    return peak, GemmTable.from_points(points, source=src, date=time.strftime("%Y-%m-%d"))


def measure_cpu(
    devices: int | None = None,
    *,
    matmul: int = 512,
    stream: int = 1 << 22,
    sizes: tuple[int, int] = (1 << 10, 1 << 18),
    repeats: int = 3,
) -> Hardware:
    """The ``cpu`` :class:`Hardware` of this process's first ``devices`` CPU devices (see the module docstring).

    Example::

        >>> hw = pt.tune.measure_cpu(8)       # a few seconds
        >>> hw.peak_flops > 0, hw.memory_bandwidth > 0, sorted(hw.collective_bandwidth)
        (True, True, ['all-gather', 'all-reduce', 'reduce-scatter'])
    """
    # Several processes: this one's own devices (the others' would make each process time its own number of
    # collectives that all must join).
    pool = jax.local_devices() if jax.process_count() > 1 else jax.devices()
    devs = pool[: devices or len(pool)]
    n = len(devs)
    mesh = jax.make_mesh((n,), ("d",), devices=devs)
    split = NamedSharding(mesh, P("d"))
    reps = 4

    a = jax.device_put(jnp.ones((n * matmul, matmul), jnp.float32), split)
    b = jax.device_put(jnp.ones((n * matmul, matmul), jnp.float32), split)

    def mm(a, b):
        x = a.reshape(n, matmul, matmul)
        y = b.reshape(n, matmul, matmul)
        for _ in range(reps):
            x = jnp.einsum("nij,njk->nik", x, y) * (1.0 / matmul)
        return x

    mm_jit = jax.jit(mm, out_shardings=NamedSharding(mesh, P("d")))
    flops = 2 * matmul**3 * reps / device_seconds(lambda: mm_jit(a, b), n, repeats)
    fastest, gemm = gemm_sweep(mesh)
    if fastest > flops:  # the table is a share of the fastest matmul measured
        flops = fastest
    else:
        gemm = dataclasses.replace(gemm, share=tuple(x * fastest / flops for x in gemm.share))

    x = jax.device_put(jnp.ones((n * stream,), jnp.float32), split)
    sx = jax.jit(lambda x: x * 1.5 + 1.0, out_shardings=split)
    bandwidth = 2 * 4 * stream / device_seconds(lambda: sx(x), n, repeats)

    coll: dict[str, float] = {}
    latency: list[float] = []
    bodies = {
        "all-gather": (lambda v: jax.lax.all_gather(v, "d", tiled=True), lambda k: 4 * k * n, 1.0),
        "reduce-scatter": (lambda v: jax.lax.psum_scatter(jnp.tile(v, n), "d", tiled=True), lambda k: 4 * k * n, 1.0),
        "all-reduce": (lambda v: jax.lax.psum(v, "d"), lambda k: 4 * k, 2.0),
    }
    for kind, (body, full, factor) in bodies.items():
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        t = []
        for k in sizes:
            v = jax.device_put(jnp.ones((n * k,), jnp.float32), split)
            t.append(device_seconds(functools.partial(f, v), n, repeats))
        moved = [factor * full(k) for k in sizes]
        w = (moved[1] - moved[0]) / max(t[1] - t[0], 1e-9)
        coll[kind] = w
        latency.append(max(0.0, t[0] - moved[0] / w))
    return Hardware(
        name="cpu",
        description=f"this machine: {n} simulated CPU devices on {os.cpu_count()} cores, "
        f"measured in device-seconds (process CPU time / devices)",
        peak_flops=flops,
        memory=_host_memory() // max(1, n),
        memory_bandwidth=bandwidth,
        topology="nodes",
        node_size=max(n, 1),
        link_bandwidth=coll["all-gather"],
        network_bandwidth=coll["all-gather"],
        latency=statistics.median(latency),
        overlap=False,
        collective_bandwidth=coll,
        alloc_bandwidth=fault_bandwidth(mesh),
        measured=True,
        gemm=gemm,
        sources=("measured on the spot: partitioning.tune.measure",),
    )


# jax's ``device_kind`` (lower case) -> built-in profile: the first substring that matches wins.
DEVICE_KINDS = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100-80g"),
    ("tpu v5 lite", "v5e"),
    ("tpu v5e", "v5e"),
    ("tpu v5p", "v5p"),
    ("tpu v5", "v5p"),
    ("tpu v4", "v4"),
)


def device_profile(device: Any) -> Hardware | None:
    """The built-in profile of a jax device by its ``device_kind`` (None: a CPU, or a kind without one).

    Example::

        >>> import types
        >>> from partitioning.tune.measure import device_profile
        >>> device_profile(jax.devices()[0]) is None          # a CPU: measured, not built in
        True
        >>> device_profile(types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")).name
        'v5e'
    """
    if getattr(device, "platform", "") == "cpu":
        return None
    kind = str(getattr(device, "device_kind", "")).lower()
    return next((PROFILES[name] for key, name in DEVICE_KINDS if key in kind), None)


def cache_dir() -> Path:
    """Where measured profiles are kept: ``$PARTITIONING_CACHE``, else ``$XDG_CACHE_HOME/partitioning``,
    else ``~/.cache/partitioning``."""
    if os.environ.get("PARTITIONING_CACHE"):
        return Path(os.environ["PARTITIONING_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "partitioning"


def _fingerprint(devices: int) -> dict[str, Any]:
    """What a measured profile depends on: the processor, its cores, the device count, jax."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    # format 2: the profile carries its GEMM table (measured by gemm_sweep); an older cache is measured again.
    return {"cpu": cpu, "cores": os.cpu_count(), "devices": devices, "jax": jax.__version__, "format": 2}


def cpu_profile(devices: int, directory: str | Path | None = None) -> tuple[Hardware, str]:
    """``(profile, where it came from)``: the cached measurement of :func:`measure_cpu` for this machine and
    ``devices``, measured and cached first if there is none (or the machine, device count or jax differ).

    Example::

        >>> from partitioning.tune.measure import cache_dir, cpu_profile
        >>> hw, source = cpu_profile(8)           # the first time on this machine: measured (a few seconds)
        >>> hw.name, hw.measured, source.replace(str(cache_dir()), "CACHE")
        ('cpu', True, 'cpu profile ...cached in CACHE/cpu-8.json')
        >>> cpu_profile(8)[1].replace(str(cache_dir()), "CACHE")    # from then on: read back
        'cpu profile cached in CACHE/cpu-8.json'
    """
    if jax.process_count() > 1:
        return _agreed(devices, directory)
    return _cached_or_measured(devices, directory)


def _cached_or_measured(devices: int, directory: str | Path | None) -> tuple[Hardware, str]:
    path = Path(directory) if directory is not None else cache_dir()
    path = path / f"cpu-{devices}.json"
    key = _fingerprint(devices)
    try:
        data = json.loads(path.read_text())
        if data.get("fingerprint") == key:
            return hardware_from_json(data["profile"]), f"cpu profile cached in {path}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    hw = measure_cpu(devices)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"fingerprint": key, "measured": time.time(), "profile": hw.to_json()}))
        tmp.replace(path)
        return hw, f"cpu profile measured now, cached in {path}"
    except OSError:
        return hw, "cpu profile measured now (not cached: the cache folder is not writable)"


def _agreed(devices: int, directory: str | Path | None) -> tuple[Hardware, str]:
    """Several processes: process 0's profile (cached, or measured on its own devices) for every process, so
    that each makes the choices the others make (a remat policy: one program for all)."""
    from jax.experimental import multihost_utils

    blob, source = b"", ""
    if jax.process_index() == 0:
        hw, source = _cached_or_measured(devices, directory)
        blob = json.dumps(hw.to_json()).encode()
    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(blob))))
    mine = np.frombuffer(blob, np.uint8) if blob else np.zeros(size, np.uint8)
    data = json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(mine), np.uint8)).decode())
    return hardware_from_json(data), source or "cpu profile of process 0 (every process uses the same)"


_FIELDS = {f.name for f in dataclasses.fields(Hardware)} - {"links"}


def hardware_from_json(data: dict[str, Any]) -> Hardware:
    """A measured profile back from :meth:`Hardware.to_json` (its GEMM table included; a measured profile has no
    link curves)."""
    data = dict(data)
    data["collective_bandwidth"] = dict(data.get("collective_bandwidth") or {})
    data["sources"] = tuple(data.get("sources") or ())
    data["gemm"] = GemmTable.from_json(data["gemm"]) if data.get("gemm") else None
    return Hardware(**{k: v for k, v in data.items() if k in _FIELDS})


def local_profile(devices: int | None = None) -> tuple[Hardware | None, str]:
    """``(profile, where it came from)`` of the devices this process runs on: an accelerator's built-in
    profile (None when its kind has none), or the CPU's measured one (:func:`cpu_profile`).

    Example::

        >>> from partitioning.tune.measure import local_profile
        >>> hw, source = local_profile(8)        # on a CPU: the cpu profile, measured once per machine
        >>> hw.name, source
        ('cpu', 'cpu profile ...cached in .../cpu-8.json')
    """
    device = jax.devices()[0]
    n = int(devices or jax.device_count())
    if device.platform == "cpu":
        return cpu_profile(n)
    hw = device_profile(device)
    kind = getattr(device, "device_kind", device.platform)
    return hw, (f"the {hw.name} profile ({kind})" if hw else f"no profile for {kind!r}")


__all__ = [
    "measure_cpu",
    "gemm_sweep",
    "device_seconds",
    "device_profile",
    "cpu_profile",
    "local_profile",
    "cache_dir",
    "hardware_from_json",
]
