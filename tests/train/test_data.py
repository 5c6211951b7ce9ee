"""Embedded corpus, split by file, resumable seeded batches, global arrays from process-local rows."""

import sysconfig
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.data.corpus import TokenBatches, load_corpus, stdlib_files
from partitioning.errors import DataError


def test_stdlib_corpus_is_real_python_split_by_file():
    c = load_corpus()
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    assert len(files) > 200
    assert not any("site-packages" in f.parts or "test" in f.relative_to(root).parts[:-1] for f in files)
    assert set(c.train_files).isdisjoint(c.eval_files)
    assert len(c.train_files) + len(c.eval_files) == len(files)
    assert len(c.eval_files) == int(np.ceil(len(files) * 0.05))
    assert len(c.train) > 2_000_000 and len(c.eval) > 10_000
    assert b"def " in c.train[:200_000].tobytes() and c.train.dtype == np.uint8
    # the eval stream is exactly the eval files, in sorted order
    eval_bytes = b"".join((root / f).read_bytes() for f in c.eval_files)
    assert c.eval.tobytes() == eval_bytes
    # split by a hash of the path: the same files whatever the seed or call
    load_corpus.cache_clear()
    assert load_corpus().eval_files == c.eval_files


def test_user_folder_is_split_by_file_and_single_file_by_bytes(tmp_path):
    for i in range(10):
        (tmp_path / f"f{i}.txt").write_text(f"file {i} " * 50)
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2" * 100)  # binary: skipped
    (tmp_path / ".hidden").write_text("secret")  # hidden: skipped
    c = load_corpus(str(tmp_path), eval_fraction=0.2)
    assert len(c.eval_files) == 2 and len(c.train_files) == 8
    assert sorted(c.train_files + c.eval_files) == [f"f{i}.txt" for i in range(10)]
    assert b"\0" not in c.train.tobytes() and b"secret" not in c.train.tobytes()

    one = tmp_path / "f3.txt"
    c1 = load_corpus(str(one), eval_fraction=0.1)
    data = one.read_bytes()
    assert c1.train.tobytes() + c1.eval.tobytes() == data
    assert len(c1.eval) == len(data) // 10


def test_bad_paths_and_tiny_corpora_are_data_errors(tmp_path):
    with pytest.raises(DataError, match=r"'.*nope': no such file or folder"):
        load_corpus(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="folder holds no text files"):
        load_corpus(str(tmp_path / "empty"))
    with pytest.raises(
        DataError, match=r"1,000 tokens make only 7 windows of 129 tokens, fewer than the batch size 32"
    ):
        TokenBatches(np.zeros(1000, np.uint8), 32, 128)


def test_batch_at_is_a_pure_function_of_seed_and_step():
    tokens = np.frombuffer(bytes(range(256)) * 40, np.uint8)
    a, b = TokenBatches(tokens, 4, 16, seed=1), TokenBatches(tokens, 4, 16, seed=1)
    for step in (5, 0, 17, 5):  # any order, repeated: always the same batch
        np.testing.assert_array_equal(a.batch_at(step)["inputs"], b.batch_at(step)["inputs"])
    assert not np.array_equal(a.batch_at(0)["inputs"], TokenBatches(tokens, 4, 16, seed=2).batch_at(0)["inputs"])
    batch = a.batch_at(3)
    assert batch["inputs"].shape == (4, 16) and batch["inputs"].dtype == np.int32
    # targets are the next byte
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    np.testing.assert_array_equal((batch["inputs"] + 1) % 256, batch["targets"])  # bytes 0,1,2,... here


def test_each_epoch_visits_every_window_once_in_a_new_order():
    tokens = np.arange(8 * 10 + 1, dtype=np.uint8)  # 10 windows of 8 (+1)
    b = TokenBatches(tokens, 2, 8, seed=0)
    assert b.n_windows == 10
    epoch0 = np.concatenate([b.windows_at(s) for s in range(5)])
    epoch1 = np.concatenate([b.windows_at(s) for s in range(5, 10)])
    assert sorted(epoch0) == list(range(10)) and sorted(epoch1) == list(range(10))
    assert list(epoch0) != list(epoch1)
    starts = b.batch_at(0)["inputs"][:, 0]
    np.testing.assert_array_equal(starts, b.windows_at(0) * 8)


def test_global_batch_is_sharded_and_matches_the_host_batch():
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    sharding = NamedSharding(mesh, P(("data", "fsdp"), None))
    tokens = load_corpus().train[:100_000]
    b = TokenBatches(tokens, 16, 32, sharding, seed=0)
    batch = b.batch_at(2)
    arr = batch["inputs"]
    assert isinstance(arr, jax.Array) and arr.shape == (16, 32) and arr.sharding == sharding
    assert {s.data.shape for s in arr.addressable_shards} == {(2, 32)}
    host = TokenBatches(tokens, 16, 32, seed=0).batch_at(2)
    np.testing.assert_array_equal(np.asarray(arr), host["inputs"])
    np.testing.assert_array_equal(np.asarray(batch["targets"]), host["targets"])


def test_process_builds_only_its_rows(monkeypatch):
    """With devices of another process in the mesh, host_batch_at returns just this process's rows."""
    tokens = load_corpus().train[:100_000]

    class HalfSharding:  # what addressable_devices_indices_map says on process 1 of 2
        def addressable_devices_indices_map(self, shape):
            return {i: (slice(8 + 2 * i, 10 + 2 * i), slice(None)) for i in range(4)}

    local = TokenBatches(tokens, 16, 32, HalfSharding(), seed=0).host_batch_at(4)
    full = TokenBatches(tokens, 16, 32, seed=0).batch_at(4)
    assert local["inputs"].shape == (8, 32)
    np.testing.assert_array_equal(local["inputs"], full["inputs"][8:])


# -- grain: the batch of step k is a pure function of (seed, k), whoever reads it --------------------


class RowsOf:
    """The sharding a process of a multi-process run sees: it addresses only rows [lo, hi) of the batch."""

    def __init__(self, lo, hi, per_device=2):
        self.lo, self.hi, self.per = lo, hi, per_device

    def addressable_devices_indices_map(self, shape):
        return {i: (slice(r, r + self.per), slice(None)) for i, r in enumerate(range(self.lo, self.hi, self.per))}


def test_batches_are_grain_map_datasets():
    import grain

    tokens = np.arange(5000, dtype=np.uint16)
    b = TokenBatches(tokens, 4, 16, seed=0)
    assert isinstance(b.dataset, grain.MapDataset)
    np.testing.assert_array_equal(b.dataset[3]["inputs"], b.batch_at(3)["inputs"])
    # window w of the batch is tokens[w*16 : w*16 + 17]
    np.testing.assert_array_equal(b.batch_at(3)["inputs"][:, 0], b.windows_at(3) * 16)


def test_one_and_two_processes_see_the_same_global_batch_at_every_step(monkeypatch):
    """Process p of 2 reads only its 8 rows; stacked, they are the 1-process batch, step by step."""
    from partitioning.data import order

    tokens = np.random.default_rng(0).integers(0, 50_000, 20_000).astype(np.uint16)
    one = TokenBatches(tokens, 16, 32, seed=3)
    procs = [TokenBatches(tokens, 16, 32, RowsOf(0, 8), seed=3), TokenBatches(tokens, 16, 32, RowsOf(8, 16), seed=3)]
    reads = []
    real = order.TokenWindows.__call__
    monkeypatch.setattr(order.TokenWindows, "__call__", lambda self, idx: reads.append(len(idx)) or real(self, idx))
    for step in [0, 1, 2, 37, 5, 2]:  # any order, repeated: a pure function of (seed, step)
        whole = one.host_batch_at(step)
        reads.clear()
        parts = [p.host_batch_at(step) for p in procs]
        assert reads == [8, 8]  # each process read only its own rows
        for k in ("inputs", "targets"):
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])
    # the global arrays on two meshes of the 8 devices are the same batch too
    for shape in ({"data": 8}, {"data": 2, "fsdp": 2, "tensor": 2}):
        mesh = pt.make_mesh(shape)
        batch = TokenBatches(tokens, 16, 32, NamedSharding(mesh, P(mesh.axis_names[:2])), seed=3).batch_at(37)
        np.testing.assert_array_equal(np.asarray(batch["inputs"]), one.batch_at(37)["inputs"])


def test_adjacent_seeds_do_not_share_epochs():
    """Grain reseeds epoch e with s + e; the user's seed is hashed first, so seed 1 is not seed 0 shifted."""
    tokens = np.arange(8 * 10 + 1, dtype=np.uint8)
    a, b = TokenBatches(tokens, 2, 8, seed=0), TokenBatches(tokens, 2, 8, seed=1)
    epoch1_of_a = np.concatenate([a.windows_at(s) for s in range(5, 10)])
    epoch0_of_b = np.concatenate([b.windows_at(s) for s in range(5)])
    assert list(epoch1_of_a) != list(epoch0_of_b)


def test_array_batches_read_only_this_process_rows():
    data = pt.data.ArrayDataset(
        {"inputs": np.arange(200 * 3, dtype=np.float32).reshape(200, 3), "targets": np.arange(200, dtype=np.int32)},
        eval_fraction=0.1,
    )
    whole = data.batches("train", 16, seed=2).host_batch_at(11)
    half = data.batches("train", 16, {"inputs": RowsOf(8, 16), "targets": RowsOf(8, 16)}, seed=2)
    assert half.rows == slice(8, 16)
    np.testing.assert_array_equal(half.host_batch_at(11)["targets"], whole["targets"][8:])
    np.testing.assert_array_equal(whole["inputs"][:, 0] / 3, whole["targets"])  # rows stay whole
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    sh = NamedSharding(mesh, P(("data", "fsdp")))
    placed = data.batches("train", 16, {"inputs": sh, "targets": sh}, seed=2).batch_at(11)
    np.testing.assert_array_equal(np.asarray(placed["targets"]), whole["targets"])


def test_a_process_holding_some_columns_reads_only_those():
    """Sequence parallelism across processes: a process's block is rows x columns of the batch."""

    class Block:
        def addressable_devices_indices_map(self, shape):
            return {0: (slice(0, 8), slice(16, 32))}

    tokens = np.random.default_rng(1).integers(0, 1000, 20_000).astype(np.uint16)
    whole = TokenBatches(tokens, 16, 32, seed=4).host_batch_at(9)
    block = TokenBatches(tokens, 16, 32, Block(), seed=4).host_batch_at(9)
    for k in ("inputs", "targets"):
        np.testing.assert_array_equal(block[k], whole[k][:8, 16:32])
