"""FLOPs of compiled steps (partitioning.plan.flops): loops counted per trip, the 6·N·tokens check,
device peaks and MFU."""

import types

import jax
import jax.numpy as jnp
import optax
import pytest

from partitioning.models import GPT
from partitioning.plan.flops import loop_flops, mfu, peak_tflops, step_flops, transformer_flops
from partitioning.train import Trainer

VOCAB, EMBED, HEADS, MLP, LAYERS, BATCH, SEQ = 64, 64, 4, 256, 2, 8, 128


def _gpt_flops(mesh, rules, **kw):
    model = GPT(vocab_size=VOCAB, embed=EMBED, heads=HEADS, mlp=MLP, layers=LAYERS, **kw)
    trainer = Trainer(model, optax.adamw(1e-3), mesh, rules, batch_size=BATCH, seq_len=SEQ)
    return trainer, trainer.step_flops() * mesh.size


def test_a_scanned_loop_counts_every_iteration():
    w = jnp.ones((64, 64))

    def f(x):
        return jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=10)[0]

    compiled = jax.jit(f).lower(jnp.ones((64, 64))).compile()
    one_matmul = 2 * 64**3
    assert compiled.cost_analysis()["flops"] < 2 * one_matmul  # XLA counts the body once...
    assert loop_flops(compiled.as_text()) == (10 * one_matmul, one_matmul)
    assert step_flops(compiled) == pytest.approx(10 * one_matmul, rel=0.01)  # ...we count all 10


def test_gpt_step_flops_match_6_n_tokens_within_the_attention_term(mesh_of):
    tokens = BATCH * SEQ
    trainer, scanned = _gpt_flops(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    six_nt = transformer_flops(trainer.num_params, tokens)
    attention = 12 * LAYERS * SEQ * EMBED * tokens  # QK^T and AV, forward and backward
    embedding = 6 * VOCAB * EMBED * tokens  # a gather in the model, no matmul
    assert abs(scanned - six_nt) <= attention
    assert scanned >= six_nt - embedding + attention  # every matmul is there, loops included
    # The same model unrolled, on one device: the same work (cost analysis sees no loop there).
    _, unrolled = _gpt_flops(mesh_of({"data": 1, "fsdp": 1}, 1), "fsdp", scan_layers=False)
    assert scanned == pytest.approx(unrolled, rel=0.02)


def test_grad_accumulation_and_tensor_parallel_do_the_same_work(mesh_of):
    model = GPT(vocab_size=VOCAB, embed=EMBED, heads=HEADS, mlp=MLP, layers=LAYERS)
    plain = Trainer(model, optax.adamw(1e-3), mesh_of({"data": 1, "fsdp": 8}), "fsdp", batch_size=BATCH, seq_len=SEQ)
    accum = Trainer(
        model, optax.adamw(1e-3), mesh_of({"data": 2, "tensor": 4}), "tp", batch_size=BATCH, seq_len=SEQ, grad_accum=2
    )
    assert accum.step_flops() * 8 == pytest.approx(plain.step_flops() * 8, rel=0.03)


@pytest.mark.parametrize(
    "kind,platform,peak",
    [
        ("NVIDIA H100 80GB HBM3", "gpu", 989.0),
        ("NVIDIA H100 PCIe", "gpu", 756.0),
        ("NVIDIA A100-SXM4-40GB", "gpu", 312.0),
        ("TPU v5 lite", "tpu", 197.0),
        ("TPU v5p", "tpu", 459.0),
        ("TPU v4", "tpu", 275.0),
        ("TPU v6 lite", "tpu", 918.0),
        ("cpu", "cpu", None),
        ("Mystery 9000", "gpu", None),
    ],
)
def test_peak_table(kind, platform, peak):
    assert peak_tflops(types.SimpleNamespace(device_kind=kind, platform=platform)) == peak


def test_mfu():
    assert mfu(1e12, 0.01, 200.0) == pytest.approx(0.5)  # 100 TFLOP/s of 200
    assert mfu(1e12, 0.01, None) is None
    assert peak_tflops(jax.devices()[0]) is None  # tests run on CPUs
