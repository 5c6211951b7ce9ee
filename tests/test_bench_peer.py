"""The MaxText peer benchmark's bookkeeping, without MaxText: a crash is recorded and the matrix goes on, and each
cell carries the machine's load average."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def peer(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its sibling `common`
    spec = importlib.util.spec_from_file_location("bench_peer", BENCH / "bench_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("common", None)


def _run(step: float, rss: int) -> dict:
    return {"step_s": [5.0] + [step] * 5, "compile_s": 5.0 - step, "first_step_s": 9.0, "rss_bytes": rss,
            "params": 1000, "remat": "full"}  # fmt: skip


def test_a_crash_is_recorded_and_the_other_runs_count(peer, monkeypatch):
    theirs = iter([RuntimeError("MaxText run failed (exit 1):\nSegfault"), _run(2.0, 200)])

    def maxtext(*args):
        r = next(theirs)
        if isinstance(r, Exception):
            raise r
        return r

    monkeypatch.setattr(peer, "run_ours", lambda *args: _run(1.0, 100))
    monkeypatch.setattr(peer, "run_maxtext", maxtext)
    cell = peer.pairing("full vs full", "S", "fsdp", "full", "full", 2, 6, None, None)
    assert cell["crashes"] == ["maxtext: MaxText run failed (exit 1):\nSegfault"]
    assert cell["step_time_ratio"] == pytest.approx(0.5) and cell["rss_ratio"] == pytest.approx(0.5)
    assert len(cell["load_average"]["before"]) == 3 and len(cell["load_average"]["after"]) == 3


def test_a_cell_whose_tool_always_crashes_keeps_its_crashes_and_no_ratios(peer, monkeypatch):
    def crash(*args):
        raise RuntimeError("MaxText run failed (exit -11)")

    monkeypatch.setattr(peer, "run_ours", lambda *args: _run(1.0, 100))
    monkeypatch.setattr(peer, "run_maxtext", crash)
    cell = peer.pairing("full vs full", "M", "fsdp_tp", "full", "full", 2, 6, None, None)
    assert cell["crashes"] == ["maxtext: MaxText run failed (exit -11)"] * 2
    assert cell["step_time_ratio"] is None and cell["rss_ratio"] is None
    assert (cell["shape"], cell["layout"]) == ("M", "fsdp_tp")
