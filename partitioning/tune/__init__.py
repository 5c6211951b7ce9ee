"""Tune: the best layout for a model, a device count and a memory budget, with the reasons.

Modules:

- :mod:`~partitioning.tune.hardware` — hardware profiles (H100, H200, A100, TPU v4 / v5e / v5p) and the
  bandwidth of a collective over mesh axes.
- :mod:`~partitioning.tune.hardware_file` — a profile from a YAML file.
- :mod:`~partitioning.tune.efficiency` — GEMM efficiency from the shapes: a profile's measured (or modelled)
  table of ``(m, n, k)`` -> share of peak, interpolated in log-shape space.
- :mod:`~partitioning.tune.links` — collectives by message size and link level (NVLink, InfiniBand, ICI, DCN),
  latency included; where a collective group sits on nodes and torus dimensions.
- :mod:`~partitioning.tune.measure` — the ``cpu`` profile, measured on the spot in device-seconds (and cached);
  the profile of this process's devices.
- :mod:`~partitioning.tune.workload` — the model's shape from its logical names; FLOPs; the activation estimate.
- :mod:`~partitioning.tune.nodes` — the placements of a mesh's axes on a cluster's nodes (``mesh.nodes``).
- :mod:`~partitioning.tune.space` — the candidates: meshes x rule tables x ZeRO-1 x remat x micro-batches.
- :mod:`~partitioning.tune.compute` — the compute terms: each matmul at its shape's efficiency, attention by
  implementation (fused kernel or einsums), the memory-bound work; frozen weights without weight gradients.
- :mod:`~partitioning.tune.comm` — the analytic communication terms (FSDP, data, tensor, sequence, pipeline
  stages, experts): which collectives a layout runs, per phase and axis.
- :mod:`~partitioning.tune.cost` — the roofline: compute and per-axis communication per phase, overlapped or not.
- :mod:`~partitioning.tune.compiled` — the same roofline from a compiled step's ops and collectives.
- :mod:`~partitioning.tune.price` — one layout priced, no search: plan, memory, fit, analytic step time.
- :mod:`~partitioning.tune.host` — the host link: offloaded state and activations, their transfers and cost.
- :mod:`~partitioning.tune.host_link` — the built-in profiles' host links (PCIe, host RAM), with their sources.
- :mod:`~partitioning.tune.search` — price every candidate, reject with the reason, rank; fold in compiled views.
- :mod:`~partitioning.tune.remat` — ``model.remat: auto``: every remat policy priced for one layout, the fastest
  that fits.
- :mod:`~partitioning.tune.crossover` — the per-device batch below which a layout becomes communication-bound.
- :mod:`~partitioning.tune.plot` — the candidates' PNG: peak memory against estimated step time, the budget line.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> llama70b = GPT(vocab_size=128_256, embed=8192, heads=64, kv_heads=8, mlp=28672, layers=80)
    >>> params, opt_state = pt.abstract_train_state(llama70b, optax.adamw(1e-4), batch_size=256, seq_len=2048)
    >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 256, "tensor": 8}, "fsdp_tp")
    >>> w = pt.tune.workload(plan.params, batch_size=256, seq_len=2048, compute_dtype="bfloat16")
    >>> s = pt.tune.search(params, opt_state, {"fsdp_tp": pt.Rules.preset("fsdp_tp")}, 2048, w,
    ...                       pt.tune.hardware("v5p"), 95 * 2**30)
    >>> s.best.candidate.label, s.best.estimate.bottleneck
    (...)
"""

from partitioning.tune.compiled import compiled_estimate
from partitioning.tune.cost import Estimate
from partitioning.tune.crossover import crossover
from partitioning.tune.hardware import PROFILES, Hardware, hardware, profile_names
from partitioning.tune.hardware_file import load_hardware
from partitioning.tune.measure import measure_cpu
from partitioning.tune.nodes import placements
from partitioning.tune.plot import plot_search
from partitioning.tune.price import price
from partitioning.tune.search import Result, Search, search
from partitioning.tune.space import Candidate, candidates
from partitioning.tune.workload import Workload, workload

__all__ = [
    "Hardware",
    "PROFILES",
    "hardware",
    "load_hardware",
    "profile_names",
    "Workload",
    "workload",
    "Candidate",
    "candidates",
    "Estimate",
    "compiled_estimate",
    "Result",
    "Search",
    "search",
    "price",
    "crossover",
    "placements",
    "measure_cpu",
    "plot_search",
]
