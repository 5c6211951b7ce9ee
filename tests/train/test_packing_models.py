"""A packed row gives every example the logits (and loss) it gets alone: the reference GPT (RoPE), the
Hugging Face Llama (RoPE, GQA) and GPT-2 (learned positions) fixtures, on an fsdp mesh."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.data.instruct import Examples
from partitioning.data.packing import PackedBatches, PackedRows
from partitioning.models import GPT

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
SEQ = 32


def examples(vocab: int) -> Examples:
    rng = np.random.default_rng(0)
    lengths = [(7, 11, 9)[i % 3] for i in range(48)]
    offsets = np.cumsum([0, *lengths]).astype(np.int64)
    tokens = rng.integers(3, vocab, offsets[-1]).astype(np.int32)
    return Examples(tokens, np.ones(len(tokens), np.uint8), offsets, "random")


def loss(logits, labels) -> float:
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean())


def check_packed_equals_alone(model, variables, mesh, rules, truly_alone: bool = False):
    """Each example of a packed batch vs the same example alone in a padded row (same compiled step); with
    ``truly_alone`` also vs the example run by itself, without segment ids (the 7-token ones)."""
    ex = examples(model.vocab_size)
    batches = PackedBatches(ex, 8, SEQ, seed=0)
    batch = batches.batch_at(0)
    with pt.sharding_context(mesh, rules):
        apply = jax.jit(model.apply)

        def run(b, segments=True):
            kw = {"segment_ids": b["segment_ids"], "positions": b["positions"]} if segments else {}
            return np.asarray(apply(variables, b["inputs"], **kw))

        packed = run(batch)
        found = [(row, seg, i) for row, ids in enumerate(batches.examples_at(0)) for seg, i in enumerate(ids, 1)]
        assert len(found) >= 20  # about three examples per row
        ids = np.array([i for _, _, i in found])
        singles = PackedRows(ex, ids, np.arange(len(ids) + 1), SEQ, slice(0, SEQ))
        own: dict[int, np.ndarray] = {}
        for start in range(0, len(ids), 8):
            chunk = np.arange(start, start + 8) % len(ids)
            out = run(singles(chunk))
            for j, k in enumerate(chunk):
                own[int(ids[k])] = out[j]
        alone = jax.jit(model.apply) if truly_alone else None
        for row, seg, i in found:
            cols = np.flatnonzero(batch["segment_ids"][row] == seg)
            mine = own[i][: len(cols)]
            np.testing.assert_allclose(packed[row, cols], mine, atol=2e-5, rtol=0)
            labels = batch["targets"][row, cols]
            assert abs(loss(packed[row, cols], labels) - loss(mine, labels)) < 1e-5
            if alone is not None and len(cols) == 6:  # a 7-token example, run by itself: no padding, no segments
                tokens = ex.example(i)[0][None]
                np.testing.assert_allclose(np.asarray(alone(variables, tokens))[0, :-1], mine, atol=2e-5, rtol=0)
        # One segment for the whole row (positions 0..T-1): the examples see each other and the logits change.
        whole = {
            **batch,
            "segment_ids": np.ones_like(batch["segment_ids"]),
            "positions": np.tile(np.arange(SEQ), (8, 1)),
        }
        mixed = run(whole)
    second = np.flatnonzero(batch["segment_ids"][0] == 2)
    assert np.abs(mixed[0, second] - packed[0, second]).max() > 1e-3


@pytest.fixture(scope="module")
def mesh():
    return pt.make_mesh({"data": 1, "fsdp": 8})


def test_reference_gpt(mesh):
    model = GPT(vocab_size=64, embed=32, heads=4, kv_heads=2, mlp=64, layers=2)
    # Random weights of the init's shapes, without compiling the init.
    shapes = pt.unbox(jax.eval_shape(model.init, jax.random.key(0), np.zeros((8, SEQ), np.int32)))
    rng = np.random.default_rng(1)
    variables = jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(s.dtype), shapes)
    check_packed_equals_alone(model, variables, mesh, "fsdp", truly_alone=True)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_hf_decoders(mesh, name):
    model, variables = pt.hf.load_hf(HF / name, mesh, "fsdp")
    check_packed_equals_alone(model, variables, mesh, "fsdp")


def test_decode_mode_refuses_packed_rows():
    model = GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=1, decode=True)
    with pytest.raises(pt.ConfigError, match=r"packed rows\) are for training, not decode mode"):
        model.init(jax.random.key(0), np.zeros((1, 4), np.int32), segment_ids=np.ones((1, 4), np.int32))


def test_packed_rows_pipeline_over_stages():
    """segment_ids / positions are per-example block arguments: the GPipe schedule micro-batches them."""
    from partitioning.parallel.pipeline import microbatching

    model = GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2)
    batch = PackedBatches(examples(64), 8, SEQ, seed=0).batch_at(0)
    shapes = pt.unbox(jax.eval_shape(model.init, jax.random.key(0), batch["inputs"]))
    rng = np.random.default_rng(2)
    variables = jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(s.dtype), shapes)
    kw = {"segment_ids": batch["segment_ids"], "positions": batch["positions"]}
    ref = np.asarray(jax.jit(model.apply)(variables, batch["inputs"], **kw))
    with pt.sharding_context(pt.make_mesh({"stage": 2, "data": 4}), "pp"), microbatching(2):
        piped = np.asarray(jax.jit(model.apply)(variables, batch["inputs"], **kw))
    np.testing.assert_allclose(piped, ref, atol=2e-5, rtol=0)
