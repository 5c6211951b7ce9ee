"""tune and offload: a layout that does not fit its device memory is priced again with its optimizer state in host
memory, the host link's transfers priced from the profile's host_bandwidth; remat offload's activations too."""

import optax
import pytest

import partitioning as pt
from partitioning.models import GPT
from partitioning.tune.price import price
from partitioning.tune.space import Candidate

GIB = 2**30


@pytest.fixture(scope="module")
def llama_1b():
    model = GPT(vocab_size=32000, embed=2048, heads=16, mlp=8192, layers=16, dtype="bfloat16")  # 1.2B
    params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=64, seq_len=2048)
    w = pt.tune.workload(pt.build_plan(params, opt_state, {"data": 8}, "dp").params, batch_size=64, seq_len=2048)
    return params, opt_state, w


def _price(llama_1b, hw="h100", **kw):
    params, opt_state, w = llama_1b
    c = Candidate((("data", 1), ("fsdp", 8)), "fsdp", **{"remat": "full", **kw})
    return price(params, opt_state, c, pt.Rules.preset("fsdp"), w, pt.tune.hardware(hw), 80 * GIB)


def test_offloaded_state_leaves_the_device_and_costs_the_host_link(llama_1b):
    base = _price(llama_1b)
    opt = base.state["optimizer"]
    dev = _price(llama_1b, offload=("optimizer",))
    host = _price(llama_1b, offload=("optimizer",), offload_update="host")
    # The passes no longer hold the optimizer state; the update does not need more than them here.
    assert base.peak - dev.peak == pytest.approx(opt) and host.peak == dev.peak
    assert dev.host == opt and host.host == opt + 2 * base.state["gradients"]  # + the gradients and params copied
    h100 = pt.tune.hardware("h100")
    link = [c for c in dev.analytic.comm if c.axes == ("host",)]
    assert [(c.phase, c.bytes, c.seconds) for c in link] == [("update", 2 * opt, opt / h100.host_bandwidth)]
    assert host.analytic.other["host update"] == pytest.approx(
        (3 * base.state["gradients"] + 2 * opt) / h100.host_memory_bandwidth
    )
    assert base.step_time < dev.step_time < host.step_time


def test_remat_offload_keeps_dots_no_batch_s_activations_on_the_host(llama_1b):
    full, dots, off = (_price(llama_1b, remat=r) for r in ("full", "dots_no_batch", "offload"))
    assert off.peak == full.peak  # each layer's input stays, as with full
    assert off.host == pytest.approx(dots.activations["layers"])  # what dots_no_batch keeps on the device
    sent = sum(c.bytes for c in off.analytic.comm if c.axes == ("host",))
    assert sent == pytest.approx(2 * off.host)  # out in the forward pass, back in the backward one


def test_a_profile_without_a_host_link_does_not_price_offload(llama_1b):
    r = _price(llama_1b, hw="v5p", offload=("optimizer",))
    assert r.reason == (
        "offload: the v5p profile has no host_bandwidth (the host link is not published for it; give it in a "
        "hardware file)"
    )


def test_search_offloads_a_layout_that_does_not_fit_otherwise(llama_1b):
    params, opt_state, w = llama_1b
    tables = {"fsdp": pt.Rules.preset("fsdp")}
    s = pt.tune.search(
        params, opt_state, tables, 8, w, pt.tune.hardware("h100"), budget=int(19.5 * GIB), remats=("full",),
        max_grad_accum=1,
    )  # fmt: skip
    best = s.best.candidate
    assert best.label == "fsdp {data: 1, fsdp: 8} remat full offload optimizer"
    assert "train.offload=[optimizer]" in best.overrides(tables["fsdp"], None)
    plain = next(r for r in s.rejected if r.candidate.label == "fsdp {data: 1, fsdp: 8} remat full")
    assert plain.reason == "memory: needs 20.41 GiB per device (estimate), more than the budget of 19.50 GiB"
    # With room for it, no layout is offloaded.
    roomy = pt.tune.search(params, opt_state, tables, 8, w, pt.tune.hardware("h100"), 80 * GIB, remats=("full",))
    assert all(not r.candidate.offload for r in roomy.results)
