"""Pre-tokenized sources: .npy and raw .bin memory maps, folders of shards, eval_path, and one clear
DataError (naming the file and the argument at fault) for every way a dataset can be wrong."""

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from partitioning.data.corpus import load_corpus
from partitioning.data.sources import TokenStream, read_splits, source_of
from partitioning.errors import DataError


@pytest.fixture(autouse=True)
def _fresh_cache():
    load_corpus.cache_clear()  # tests rewrite files under the same names
    yield
    load_corpus.cache_clear()


def _mapped(a) -> bool:
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


def test_npy_file_is_memory_mapped_and_split_by_position(tmp_path):
    tokens = np.arange(10_000, dtype=np.int32) % 5000
    np.save(tmp_path / "tok.npy", tokens)
    c = load_corpus(str(tmp_path / "tok.npy"), eval_fraction=0.1)
    assert c.kind == "tokens" and c.vocab is None
    assert (len(c.train), len(c.eval)) == (9000, 1000)
    np.testing.assert_array_equal(c.train[0:9000], tokens[:9000])
    np.testing.assert_array_equal(c.eval[0:1000], tokens[9000:])
    assert _mapped(c.train.parts[0]) and _mapped(c.eval.parts[0])  # read from the file, never loaded whole
    assert c.describe() == f"{tmp_path / 'tok.npy'}: 9,000 train / 1,000 eval tokens"


def test_bin_files_need_their_dtype_and_take_an_eval_path(tmp_path):
    """nanoGPT's layout: train.bin and val.bin of uint16 GPT-2 tokens."""
    train = np.random.default_rng(0).integers(0, 50257, 4000).astype(np.uint16)
    val = np.random.default_rng(1).integers(0, 50257, 1000).astype(np.uint16)
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    c = load_corpus(str(tmp_path / "train.bin"), dtype="uint16", eval_path=str(tmp_path / "val.bin"))
    assert c.kind == "tokens" and c.train.dtype == np.uint16
    np.testing.assert_array_equal(c.train[0:4000], train)
    np.testing.assert_array_equal(c.eval[0:1000], val)
    assert c.eval_source == str(tmp_path / "val.bin")


def test_a_folder_of_shards_reads_as_one_sequence_split_by_file(tmp_path):
    shards = [np.full(100 + i, i, dtype=np.uint16) for i in range(6)]
    for i, s in enumerate(shards):
        np.save(tmp_path / f"shard_{i:02d}.npy", s)
    assert source_of(str(tmp_path), None) == "tokens"
    train, ev, info = read_splits(str(tmp_path), eval_fraction=0.2)
    assert len(info["eval_files"]) == 2 and len(info["train_files"]) == 4
    assert sorted(info["train_files"] + info["eval_files"]) == [f"shard_{i:02d}.npy" for i in range(6)]
    kept = [int(f[6:8]) for f in info["train_files"]]
    whole = np.concatenate([shards[i] for i in kept])
    assert len(train) == len(whole)
    # windows that cross a shard boundary read from both shards
    starts = np.array([0, 95, len(whole) - 10])
    np.testing.assert_array_equal(train.take(starts, 10), np.stack([whole[s : s + 10] for s in starts]))


def test_token_stream_reports_the_first_token_outside_the_vocabulary_by_file_and_index(tmp_path):
    a, b = np.zeros(50, np.int32), np.zeros(50, np.int32)
    b[7] = 300
    s = TokenStream([a, b], names=["a.npy", "b.npy"])
    assert s.out_of_range(301) is None
    assert s.out_of_range(300) == (300, "b.npy", 7)
    b[7], a[3] = 0, -1
    assert s.out_of_range(300) == (-1, "a.npy", 3)
    # a dtype that cannot hold a token >= vocab is not scanned at all
    assert TokenStream([np.full(10, 255, np.uint8)]).out_of_range(256) is None
    # a single file split in two reports indices in the file
    np.save(tmp_path / "t.npy", np.r_[np.zeros(90, np.int32), [5], np.zeros(9, np.int32)])
    c = load_corpus(str(tmp_path / "t.npy"), eval_fraction=0.1)
    assert c.eval.out_of_range(5) == (5, str(tmp_path / "t.npy"), 90)


def test_text_folders_with_a_stray_bin_file_stay_text(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text("hello " * 20)
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2" * 100)
    assert source_of(str(tmp_path), None) == "text"
    assert load_corpus(str(tmp_path)).kind == "text"


def _errors(tmp_path):
    np.save(tmp_path / "floats.npy", np.zeros(100, np.float32))
    np.save(tmp_path / "empty.npy", np.zeros(0, np.int32))
    np.save(tmp_path / "i32.npy", np.zeros(100, np.int32))
    (tmp_path / "fake.npy").write_text("hello, not numpy")
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "t.bin")
    (tmp_path / "odd.bin").write_bytes(b"abc")
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("text")
    (tmp_path / "nothing").mkdir()
    return [
        (dict(path="nope.npy"), "path", r"'.*nope.npy': no such file or folder"),
        (dict(path="floats.npy"), "path", r"'.*floats.npy': holds float32 values; token arrays need an integer dtype"),
        (dict(path="empty.npy"), "path", r"'.*empty.npy': holds no tokens"),
        (dict(path="fake.npy"), "path", r"'.*fake.npy': not a .npy file \(no NumPy header\)"),
        (dict(path="i32.npy", dtype="uint16"), "dtype", r"'.*i32.npy': holds int32 tokens, not uint16"),
        (dict(path="t.bin"), "dtype", r"'.*t.bin': a .bin file has no header; say its dtype"),
        (
            dict(path="odd.bin", dtype="uint16"),
            "dtype",
            r"'.*odd.bin': 3 bytes is not a whole number of uint16 tokens \(2 bytes each\)",
        ),
        (dict(path="empty.bin", dtype="uint16"), "path", r"'.*empty.bin': file is empty"),
        (dict(path="notes.txt", source="tokens"), "path", r"'.*notes.txt': not a token array \(.npy or .bin\)"),
        (dict(path="i32.npy", source="text"), "path", r"'.*i32.npy': binary data, not text; .* use source: tokens"),
        (dict(path="nothing", source="tokens"), "path", r"'.*nothing': folder holds no .npy or .bin token files"),
        (dict(path="i32.npy", eval_path="nope"), "eval_path", r"'.*nope': no such file or folder"),
        (dict(path=None, source="tokens"), "path", r"source: tokens needs a path"),
        (dict(path="i32.npy", dtype="float32"), "dtype", r"dtype must be one of uint8, "),
    ]


def test_every_bad_dataset_is_one_data_error_naming_the_file_and_argument(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for kwargs, arg, pattern in _errors(tmp_path):
        with pytest.raises(DataError, match=pattern) as info:
            read_splits(**kwargs)
        assert info.value.arg == arg, (kwargs, info.value.arg)


def test_an_unreadable_file_is_a_data_error(tmp_path, monkeypatch):
    f = tmp_path / "locked.npy"
    np.save(f, np.zeros(100, np.int32))
    f.chmod(0)
    if os.geteuid() == 0:  # root reads any file: refuse the way the OS would
        real_open = Path.open

        def refuse(self, *a, **k):
            if self.name == "locked.npy":
                raise PermissionError(13, "Permission denied", str(self))
            return real_open(self, *a, **k)

        monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(DataError, match=r"'.*locked.npy': cannot read: Permission denied") as info:
        read_splits(str(f))
    assert info.value.arg == "path"
