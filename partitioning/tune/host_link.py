"""The host link of the built-in hardware profiles: what offload (``train.offload``, ``remat: offload``) moves over.

Per device: ``host_bandwidth`` (bytes/s between host memory and the device, each way: the PCIe link, whose
datasheet figure counts both directions together), ``host_memory`` (the node's RAM over its devices) and
``host_memory_bandwidth`` (the device's share of the host's DRAM bandwidth: an optimizer update on the host
streams the state through it). Every figure cites its public source; a profile missing from :data:`HOST_LINK`
(or a figure missing from its entry: the TPUs publish no host-link figure) is not priced for offload, and a
hardware file can give them (:mod:`partitioning.tune.hardware_file`).

Example::

    >>> from partitioning.tune.host_link import host_link
    >>> host_link("h100", ())["host_bandwidth"] / 1e9        # PCIe Gen5 x16: 128 GB/s both ways together
    64.0
    >>> host_link("v4", ("x",))
    {}
"""

from __future__ import annotations

from typing import Any

GB, GIB = 10**9, 2**30

# DGX H100 / H200: each GPU on PCIe Gen5 x16 (the H100 / H200 datasheets: 128 GB/s, both directions together),
# 2 TB of system memory and 2x Xeon Platinum 8480C (8 channels of DDR5-4800 each, 38.4 GB/s a channel) for 8
# GPUs (the DGX pages; NVIDIA's MLPerf system description of an 8x H200 node lists the same host).
_DGX_H = {"host_bandwidth": 64e9, "host_memory": 2 * 10**12 // 8, "host_memory_bandwidth": 2 * 8 * 38.4e9 / 8}
_XEON_8480 = (
    "https://www.intel.com/content/www/us/en/products/sku/231746/"
    "intel-xeon-platinum-8480-processor-105m-cache-2-00-ghz/specifications.html"
)
_MLPERF_H200 = (
    "https://github.com/mlcommons/inference_results_v4.1/blob/main/closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json"
)

HOST_LINK: dict[str, dict[str, Any]] = {
    "h100": {**_DGX_H, "sources": ("https://www.nvidia.com/en-us/data-center/dgx-h100/", _XEON_8480)},
    "h200": {**_DGX_H, "sources": ("https://www.nvidia.com/en-us/data-center/dgx-h200/", _MLPERF_H200, _XEON_8480)},
    "a100-80g": {
        "host_bandwidth": 32e9,  # datasheet: PCIe Gen4 64 GB/s (both directions together)
        "host_memory": 10**12 // 8,  # DGX A100: 1 TB of system memory (2 TB optional) for 8 GPUs
        "host_memory_bandwidth": 2 * 8 * 25.6e9 / 8,  # 2x EPYC 7742: 8 channels of DDR4-3200 each, for 8 GPUs
        "sources": (
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/nvidia-dgx-a100-datasheet.pdf",
            "https://www.amd.com/en/products/processors/server/epyc/7002-series/amd-epyc-7742.html",
        ),
    },
    # Cloud TPU hosts: RAM per host over its chips (the v5e and v5p pages); no host-link figure is published.
    "v5e": {"host_memory": 512 * GIB // 8},
    "v5p": {"host_memory": 448 * GB // 4},
}


def host_link(name: str, sources: tuple[str, ...]) -> dict[str, Any]:
    """The host-link fields of profile ``name`` for ``dataclasses.replace``, its ``sources`` extended with
    theirs (``{}`` for a profile without figures)."""
    link = dict(HOST_LINK.get(name, {}))
    if not link:
        return {}
    return {**link, "sources": tuple(sources) + tuple(link.get("sources", ()))}


__all__ = ["HOST_LINK", "host_link"]
