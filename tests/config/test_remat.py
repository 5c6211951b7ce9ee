"""``model.remat: auto`` (the default): resolved at run start to the policy tune prices fastest, said in one line."""

import json

import jax
import pytest

import partitioning.config.remat
from partitioning.config.build import mesh_from_config, model_from_config, model_options_resolved
from partitioning.config.load import load_config
from partitioning.config.remat import is_auto, remat_policies, resolve_remat
from partitioning.tune.measure import _fingerprint, cpu_profile
from tests.tune.test_remat import CPU

CONFIG = """model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 2%s}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
train: {batch_size: 8, seq_len: 16}
"""


@pytest.fixture
def cached_cpu(tmp_path, monkeypatch):
    """A cached cpu profile for 8 devices in a fresh cache folder (nothing is measured)."""
    monkeypatch.setenv("PARTITIONING_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    data = {"fingerprint": _fingerprint(8), "profile": CPU.to_json()}
    (tmp_path / "cache" / "cpu-8.json").write_text(json.dumps(data))
    return tmp_path / "cache" / "cpu-8.json"


def _config(tmp_path, extra=""):
    (tmp_path / "run.yaml").write_text(CONFIG % extra)
    return load_config(str(tmp_path / "run.yaml"))


def test_auto_is_the_default_and_models_are_built_with_a_concrete_policy(tmp_path):
    cfg = _config(tmp_path)
    assert is_auto(cfg) and model_options_resolved(cfg)["remat"] == "auto"
    assert model_from_config(cfg).remat == "none"  # shapes only: the model's own default
    assert remat_policies(cfg) == ("none", "dots", "dots_no_batch", "offload", "full")
    assert is_auto(_config(tmp_path, ", remat: auto")) and model_from_config(cfg).remat == "none"
    assert not is_auto(_config(tmp_path, ", remat: full"))


def test_resolved_at_run_start_in_one_line(tmp_path, cached_cpu):
    cfg = _config(tmp_path)
    resolved, note = resolve_remat(cfg, mesh_from_config(cfg))
    policy = resolved.model_options["remat"]
    assert policy in ("dots", "dots_no_batch", "full")  # on the CPU profile, saving everything costs most
    assert cfg.model_options.get("remat") is None  # the config itself is left alone
    assert "\n" not in note and note.startswith(f"remat: auto -> {policy}: the fastest of 4 policies, est. ")
    # The CPU has no host link to price `offload` over: the other four are priced.
    assert (
        all(p in note for p in remat_policies(cfg) if p != "offload")
        and "offload" not in note
        and " of CPU time per simulated device per step (~" in note
    )
    assert note.endswith(f"; cpu profile cached in {cached_cpu}")
    assert model_from_config(resolved).remat == policy


def test_a_written_policy_is_used_as_it_is(tmp_path, cached_cpu):
    cfg = _config(tmp_path, ", remat: full")
    resolved, note = resolve_remat(cfg, mesh_from_config(cfg))
    assert resolved is cfg and note is None


def test_the_cpu_profile_is_measured_once_per_machine_and_device_count(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("partitioning.tune.measure.measure_cpu", lambda n: calls.append(n) or CPU)
    hw, source = cpu_profile(8, tmp_path)
    assert calls == [8] and source == f"cpu profile measured now, cached in {tmp_path / 'cpu-8.json'}"
    again, source = cpu_profile(8, tmp_path)
    assert calls == [8] and again == hw and source == f"cpu profile cached in {tmp_path / 'cpu-8.json'}"
    stale = json.loads((tmp_path / "cpu-8.json").read_text())
    stale["fingerprint"]["jax"] = "0.0.1"
    (tmp_path / "cpu-8.json").write_text(json.dumps(stale))
    cpu_profile(8, tmp_path)
    assert calls == [8, 8]


def test_same_losses_and_gradients_as_without_remat(tmp_path, cached_cpu):
    cfg = _config(tmp_path)
    resolved, _ = resolve_remat(cfg, mesh_from_config(cfg))
    chosen, none = model_from_config(resolved), model_from_config(_config(tmp_path, ", remat: none"))
    tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, 64)
    params = jax.jit(none.init)(jax.random.key(0), tokens)  # the same parameters: remat changes no shapes

    def both(p):
        return [jax.value_and_grad(lambda p, m=m: m.apply(p, tokens).mean())(p) for m in (chosen, none)]

    (loss, grads), (loss_none, grads_none) = jax.jit(both)(params)
    assert float(loss) == pytest.approx(float(loss_none), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_none), strict=True):
        assert jax.numpy.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_circular_pipeline_is_priced_with_its_repeats(tmp_path, cached_cpu, monkeypatch):
    """``train.pipeline_repeats`` reaches the pricing (it crashed the run's start with a TypeError once)."""
    (tmp_path / "run.yaml").write_text(
        "model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 4}\n"
        "mesh: {shape: {stage: 2, data: 4}, devices: 8}\nrules: pp\n"
        "train: {batch_size: 16, seq_len: 8, microbatches: 4, pipeline_repeats: 2}\n"
    )
    cfg = load_config(str(tmp_path / "run.yaml"))
    choices = []
    real = partitioning.config.remat.choose_remat
    monkeypatch.setattr(
        "partitioning.config.remat.choose_remat", lambda *a, **kw: choices.append(real(*a, **kw)) or choices[-1]
    )
    resolved, note = resolve_remat(cfg, mesh_from_config(cfg))
    assert note.startswith(f"remat: auto -> {resolved.model_options['remat']}: the fastest of 4 policies, est. ")
    [choice] = choices
    for r in choice.results:
        assert (r.candidate.stages, r.candidate.microbatches, r.candidate.repeats) == (2, 4, 2)
        # The circular schedule's bubble: (S-1)/(R M) of the stages' compute, half of GPipe's.
        compute = r.analytic.compute["fwd"] + r.analytic.compute["bwd"]
        assert r.analytic.other["pipeline bubble"] == pytest.approx(compute / 8)
