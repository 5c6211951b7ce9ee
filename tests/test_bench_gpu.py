"""The GPU benchmark's ``--cpu`` mode: every section runs end to end at tiny sizes and reports numbers."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "bench_gpu.py"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path_factory.mktemp("gpu")
    assert bench.main(["--cpu", "--out", str(out)]) == 0
    results = json.loads((out / "gpu.json").read_text())
    results["out"] = str(out)  # where the run wrote its files
    return results, (out / "gpu.txt").read_text()


def test_train_against_hand_written(report):
    results, text = report
    rows = results["sections"]["train"]["rows"]
    assert [r["seq_len"] for r in rows] == [64]
    for r in rows:
        assert r["toolkit_step_s"] > 0 and r["hand_written_step_s"] > 0
        assert r["ratio"] == pytest.approx(r["toolkit_step_s"] / r["hand_written_step_s"])
        assert r["remat"] in ("none", "dots", "dots_no_batch", "full")
        assert r["tune_estimate_step_s"] > 0  # tune's price of the policy the run picked
        assert r["mfu_toolkit"] is None  # no peak for a CPU
        # PaLM's convention: 6 N tokens + 12 L T H Q tokens.
        tokens = r["batch_size"] * r["seq_len"]
        assert r["model_tflops_per_step"] * 1e12 == pytest.approx(
            6 * r["params"] * tokens + 12 * 2 * r["seq_len"] * 4 * 16 * tokens
        )
    assert "train seq 64 x 8" in text


def test_attention_remat_fit_and_load_hf(report):
    results, text = report
    sec = results["sections"]
    assert sec["attention"]["implementations"] == ["xla"]  # cuDNN needs an NVIDIA GPU
    assert all(r["xla"]["step_s"] > 0 for r in sec["attention"]["rows"])
    fit = sec["remat_fit"]["rows"]
    assert [r["remat"] for r in fit] == ["full"]
    for r in fit:
        assert r["layers"] >= 1 and r["ran"] is True and r["predicted_peak_bytes"] <= r["budget_bytes"]
    h = sec["load_hf"]
    assert h["ratio"] > 0 and h["load_hf_gib_per_s"] > 0
    assert "load_hf" in text and "remat full" in text
    assert results["device"].startswith("cpu")


def test_offload_against_none(report):
    results, text = report
    variants = results["sections"]["offload"]["variants"]
    assert list(variants) == ["none", "optimizer", "optimizer_host_update", "remat_offload"]
    none = variants["none"]
    for name in ("optimizer", "optimizer_host_update"):
        v = variants[name]
        opt = v["host_bytes"]  # the optimizer state: what the offloaded variants hold on the host
        assert v["offload"] == ["optimizer"] and v["remat"] == none["remat"] and opt > 0
        assert none["device_peak_bytes"] - v["device_peak_bytes"] >= opt
        assert v["first_loss"] == none["first_loss"] and v["ratio_to_none"] > 0
        assert v["tune"]["step_s"] is None  # the CPU has no host link to price
    assert variants["optimizer_host_update"]["offload_update"] == "host"
    assert variants["remat_offload"]["remat"] == "offload" and variants["remat_offload"]["step_s"] > 0
    assert none["tune"]["step_s"] > 0 and none["host_bytes"] == 0
    assert "offload optimizer_host_update (" in text


def test_gemm_table_a_hardware_file_reads(report, tmp_path):
    from partitioning.tune.efficiency import GemmTable
    from partitioning.tune.hardware_file import load_hardware

    results, text = report
    gemm = results["sections"]["gemm"]
    assert gemm["dtype"] == "float32" and gemm["columns"] == ["m", "n", "k", "tflops"]
    assert len(gemm["points"]) == 27 and all(p[3] > 0 for p in gemm["points"])
    assert gemm["best_tflops"] == max(p[3] for p in gemm["points"]) and gemm["peak_tflops"] is None
    assert "gemm: 27 shapes (float32)" in text
    # The table it wrote: shares of the fastest shape (a CPU has no published peak), read by a hardware file.
    out = Path(results["out"]) / "gemm.json"
    table = GemmTable.from_json(json.loads(out.read_text()))
    assert max(table.share) == pytest.approx(1.0) and table.measured and "bench_gpu.py" in table.source
    hw = out.parent / "cpu.yaml"  # beside the table: the file names it relative to itself
    hw.write_text(
        f"{{name: here, peak_flops: {gemm['best_tflops'] * 1e12}, memory: 8GiB, memory_bandwidth: 1.0e10, "
        f"topology: nodes, node_size: 8, link_bandwidth: 1.0e9, network_bandwidth: 1.0e9, gemm: {out.name}}}"
    )
    assert load_hardware(hw).gemm == table
