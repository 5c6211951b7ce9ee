"""A step's batch (partitioning.data.batch): specs from names, placing host batches, RNG keys."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.data.batch import batch_size_of, batch_specs, lm_batch, place, stream_keys


def test_specs_default_to_the_batch_axes_and_follow_names():
    rules = pt.Rules.preset("seq")
    mesh = {"data": 1, "fsdp": 4, "tensor": 2}
    batch = {"inputs": jax.ShapeDtypeStruct((8, 32), np.int32), "image": jax.ShapeDtypeStruct((8, 4, 4, 3), np.float32)}
    specs = batch_specs(batch, rules, mesh)
    assert specs == {"inputs": P(("data", "fsdp"), None), "image": P(("data", "fsdp"), None, None, None)}
    named = batch_specs(batch, rules, mesh, {"inputs": ("batch", "length"), "image": None})
    assert named["inputs"] == P(("data", "fsdp"), "tensor")
    with pytest.raises(
        pt.ShardingError, match=r"batch_size 6 is not divisible by the batch mesh axes \('data', 'fsdp'\)"
    ):
        batch_specs({"x": jax.ShapeDtypeStruct((6, 2), np.int32)}, rules, mesh, what="batch_size 6")


def test_leaves_must_share_the_batch_dimension():
    assert batch_size_of(lm_batch(8, 16)) == 8
    with pytest.raises(pt.ShardingError, match=r"one shared leading \(batch\) dimension, got sizes \[4, 8\]"):
        batch_size_of({"a": np.zeros((8, 2)), "b": np.zeros((4,))})


def test_place_builds_the_global_batch_from_this_processs_rows():
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    sharding = {"x": NamedSharding(mesh, P("fsdp", None))}
    host = {"x": np.arange(32, dtype=np.int32).reshape(16, 2)}
    placed = place(host, sharding)
    assert placed["x"].sharding == sharding["x"]
    assert np.array_equal(np.asarray(placed["x"]), host["x"])


def test_stream_keys_depend_only_on_seed_step_micro_and_name():
    a = stream_keys(0, 5, ("dropout", "noise"))
    b = stream_keys(0, 5, ("dropout", "noise"))
    assert all(np.array_equal(jax.random.key_data(a[k]), jax.random.key_data(b[k])) for k in a)
    c = stream_keys(0, 6, ("dropout",))
    d = stream_keys(0, 5, ("dropout",), micro=1)
    for other in (c, d):
        assert not np.array_equal(jax.random.key_data(a["dropout"]), jax.random.key_data(other["dropout"]))
    assert not np.array_equal(jax.random.key_data(a["dropout"]), jax.random.key_data(a["noise"]))
