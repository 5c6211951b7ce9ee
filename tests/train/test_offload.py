"""Host offload (partitioning.train.offload): the same training with the optimizer state and params in host memory.

One tiny float32 GPT trained three steps per layout (module-scoped: each compiles once): the losses equal the
run without offload exactly, the state keeps its rule-table specs in ``pinned_host`` memory, and the compiled
step's device memory drops by the optimizer state (XLA's CPU backend counts host buffers as arguments; the
entry layout marks them, :mod:`partitioning.plan.memory_kinds`).
"""

import re

import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.models import GPT
from partitioning.plan.compiled import memory_stats
from partitioning.train import Trainer
from partitioning.train.offload import Offload

STEPS = 3
LAYOUTS = {
    "none": ((), "device"),
    "optimizer": (("optimizer",), "device"),
    "optimizer_host": (("optimizer",), "host"),
    "both": (("optimizer", "params"), "device"),
}


def _trainer(offload=(), update="device", **kw):
    model = GPT(**{"embed": 32, "heads": 4, "mlp": 64, "layers": 2, **kw})
    return Trainer(
        model,
        optax.adamw(1e-2),
        pt.make_mesh({"data": 1, "fsdp": 8}),
        "fsdp",
        batch_size=8,
        seq_len=16,
        offload=offload,
        offload_update=update,
    )


@pytest.fixture(scope="module")
def runs(tokens):
    """name -> (trainer, final state, losses, eval loss) for each of LAYOUTS."""
    out = {}
    for name, (offload, update) in LAYOUTS.items():
        tr = _trainer(offload, update)
        batches = pt.data.TokenBatches(tokens, 8, 16, tr.batch_sharding)
        state, losses = tr.init(jax.random.key(0)), []
        for i in range(STEPS):
            state, m = tr.train_step(state, batches.batch_at(i))
            losses.append(float(m["loss"]))
        out[name] = (tr, state, losses, float(tr.evaluate_state(state, batches.batch_at(0))["loss"]))
    return out


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "none"])
def test_the_same_losses_with_and_without_offload(runs, name):
    _, _, base, base_eval = runs["none"]
    _, _, losses, eval_loss = runs[name]
    assert losses == base and eval_loss == base_eval  # float32, the same program up to where state lives
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_state_keeps_its_specs_in_the_memory_offload_names(runs, name):
    tr, state, _, _ = runs[name]
    base = runs["none"][1]
    offload = LAYOUTS[name][0]
    for part, field in (("params", state.params), ("optimizer", state.opt_state)):
        want = "pinned_host" if part in offload else "device"
        ref = base.params if part == "params" else base.opt_state
        for x, y in zip(jax.tree.leaves(field), jax.tree.leaves(ref), strict=True):
            assert x.sharding.memory_kind == want and x.sharding.spec == y.sharding.spec
            assert np.array_equal(np.asarray(x), np.asarray(y))
    assert int(state.step) == STEPS and state.step.sharding.memory_kind == "device"


def test_compiled_device_memory_drops_by_the_optimizer_state(runs):
    stats = {n: memory_stats(runs[n][0].lower_train_step().compile()) for n in ("none", "optimizer", "both")}
    tr = runs["none"][0]
    opt = sum(leaf.per_device_bytes for leaf in tr.state_layouts() if leaf.path.startswith("opt_state/"))
    params = sum(leaf.per_device_bytes for leaf in tr.state_layouts() if leaf.path.startswith("params/"))
    assert stats["none"]["host"] == 0
    assert stats["none"]["peak_estimate"] - stats["optimizer"]["peak_estimate"] >= opt
    # The donated state goes in and out of host memory in place: its bytes, once.
    assert stats["optimizer"]["host_argument"] == stats["optimizer"]["host_alias"] == stats["optimizer"]["host"] == opt
    assert stats["both"]["host"] == opt + params


def test_the_step_moves_only_what_is_offloaded(runs):
    """The step's program: the optimizer state arrives and leaves in host memory and is used on the device only
    after the gradients (no operation mixes memory kinds: JAX refuses those while tracing)."""
    tr = runs["optimizer"][0]
    with pt.sharding_context(tr.mesh, tr.rules):
        lowered = tr.lower_train_step()
    text = lowered.as_text()
    assert text.count('mhlo.memory_kind = "pinned_host"') >= 2 * len(jax.tree.leaves(tr.state_shardings.opt_state))


def test_remat_offload_keeps_the_saved_projections_in_host_memory(tokens):
    """``remat: offload`` saves what ``dots_no_batch`` saves, in host memory: the scan's stacked residuals
    are typed ``<host>`` (the projections' outputs: the mlp's, the queries' and the residual stream's), and
    the losses are dots_no_batch's."""
    shapes, losses = {}, {}
    for remat in ("dots_no_batch", "offload"):
        tr = _trainer(remat=remat)
        with pt.sharding_context(tr.mesh, tr.rules):
            jaxpr = str(jax.make_jaxpr(tr._step_fn)(*tr.abstract_inputs()))
        shapes[remat] = set(re.findall(r"f32<host>\[2,[\d,]*\]", jaxpr))  # stacked over the 2 layers
        batches = pt.data.TokenBatches(tokens, 8, 16, tr.batch_sharding)
        state, out = tr.init(jax.random.key(0)), []
        for i in range(2):
            state, m = tr.train_step(state, batches.batch_at(i))
            out.append(float(m["loss"]))
        losses[remat] = out
    assert shapes["dots_no_batch"] == set()
    assert shapes["offload"] == {"f32<host>[2,8,16,64]", "f32<host>[2,8,16,4,8]", "f32<host>[2,8,16,32]"}
    assert losses["offload"] == losses["dots_no_batch"]


def test_bad_values_are_one_line():
    with pytest.raises(pt.ConfigError) as e:
        _trainer(("optimiser",))
    assert str(e.value) == (
        "offload: 'optimiser' cannot be offloaded; choose from optimizer, params; did you mean 'optimizer'?"
    )
    with pytest.raises(pt.ConfigError) as e:
        _trainer(("optimizer",), "cpu")
    assert str(e.value) == "offload_update: 'cpu' is not where an update can run; choose device or host"
    assert Offload.of("params").names == ("params",)


def test_an_update_the_host_cannot_run_is_refused_when_built():
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))  # the clip's norm makes a device array
    model = GPT(embed=32, heads=4, mlp=64, layers=2)
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    with pytest.raises(pt.ConfigError) as e:
        Trainer(model, tx, mesh, "fsdp", batch_size=8, seq_len=16, offload=("optimizer",), offload_update="host")
    assert str(e.value) == (
        "offload_update: host: this optimizer's update makes arrays JAX places in device memory (a gradient clip by "
        "global norm does: optimizer.clip_norm), which the host's arrays cannot meet; update on the device "
        "(offload_update: device) or drop the clip"
    )
    Trainer(model, tx, mesh, "fsdp", batch_size=8, seq_len=16, offload=("optimizer",))  # on the device: fine


def test_devices_without_host_memory_are_refused(monkeypatch):
    monkeypatch.setattr("partitioning.train.offload.host_memory_kinds", lambda device=None: ["device"])
    with pytest.raises(pt.ConfigError) as e:
        _trainer(("optimizer",))
    assert str(e.value) == (
        "offload: the cpu devices have no pinned_host memory (their memories: device); "
        "remove offload (optimizer) to train on them"
    )


def _scale_trainer(policy, offload, update):
    import flax.linen as nn

    class Scale(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", pt.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],))
            return x * w

    return Trainer(
        Scale(),
        optax.adam(0.1),
        pt.make_mesh({"data": 1, "fsdp": 8}),
        "fsdp",
        batch={"inputs": np.zeros((8, 8), np.float32), "targets": np.zeros((8, 8), np.float32)},
        task=lambda out, batch: ((out - batch["targets"]) ** 2).mean(),
        on_nonfinite=policy,
        offload=offload,
        offload_update=update,
    )


@pytest.mark.parametrize("update", ["device", "host"])
def test_a_skipped_step_keeps_the_offloaded_state(update):
    """``skip_step`` selects the old state where the update runs (on the host with ``offload_update: host``)."""
    tr = _scale_trainer("skip_step", ("optimizer", "params"), update)
    state = tr.init(jax.random.key(0))
    x = np.full((8, 8), 0.5, np.float32)
    state, _ = tr.train_step(state, tr.place({"inputs": x, "targets": np.zeros_like(x)}))
    before = [np.asarray(v) for v in jax.tree.leaves((state.params, state.opt_state))]
    x[0, 0] = np.nan
    state, m = tr.train_step(state, tr.place({"inputs": x, "targets": np.zeros_like(x)}))
    after = [np.asarray(v) for v in jax.tree.leaves((state.params, state.opt_state))]
    assert float(m["nonfinite"]) == 1.0 and all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert state.params["w"].sharding.memory_kind == "pinned_host"


def test_remat_offload_in_a_hugging_face_family():
    """A pretrained family (Llama's, from its config.json) takes ``remat: offload`` like the reference GPT."""
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    out = {}
    for remat in ("dots_no_batch", "offload"):
        model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", mesh, "fsdp", remat=remat)
        tr = Trainer(model, optax.adamw(1e-3), mesh, "fsdp", batch_size=8, seq_len=16)
        with pt.sharding_context(mesh, tr.rules):
            jaxpr = str(jax.make_jaxpr(tr._step_fn)(*tr.abstract_inputs()))
        batch = pt.data.TokenBatches(np.arange(8192) % 100, 8, 16, tr.batch_sharding).batch_at(0)
        _, m = tr.train_step(tr.init_from(variables["params"]), batch)
        out[remat] = (float(m["loss"]), "<host>" in jaxpr)
    assert out["offload"] == (out["dots_no_batch"][0], True) and out["dots_no_batch"][1] is False
