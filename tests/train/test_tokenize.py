"""Text tokenized with a tokenizer.json: BOS / EOS per document as tokenizer_config.json says, cached on disk."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from partitioning.data import tokenize as tokenize_mod
from partitioning.data.corpus import load_corpus
from partitioning.data.tokenize import load_tokenizer, tokenize_files
from partitioning.errors import DataError

SPECIALS = ["<unk>", "<s>", "</s>", "<|endoftext|>"]
TEXT = "def add(x, y):\n    return x + y\n\nclass Point:\n    pass\n" * 20


def make_tokenizer(folder, config=None, template=False):
    """A small byte-level BPE tokenizer.json (+ tokenizer_config.json) as transformers' fast tokenizers save them."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([TEXT], trainer)
    if template:  # Llama 3's way: the post-processor adds BOS, the config says nothing
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def bare(folder, text):
    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids


LLAMA = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>"}
GPT2 = {"add_bos_token": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
BOTH = {"add_bos_token": True, "add_eos_token": True, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}


@pytest.mark.parametrize(
    "config,template,head,tail",
    [(LLAMA, False, [1], []), (GPT2, False, [], [3]), (BOTH, False, [1], [2]), (None, True, [1], [])],
    ids=["llama-bos", "gpt2-eos-between", "bos-and-eos", "post-processor-bos"],
)
def test_each_document_gets_bos_eos_as_the_tokenizer_config_says(tmp_path, config, template, head, tail):
    folder = make_tokenizer(tmp_path / "tok", config, template)
    tok = load_tokenizer(folder)
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def add(x, y):\n")
    b.write_text("class Point:\n")
    tokens = tokenize_files([a, b], tok, tmp_path / "cache")
    expected = head + bare(folder, a.read_text()) + tail + head + bare(folder, b.read_text()) + tail
    assert tokens.tolist() == expected
    assert tokens.dtype == np.uint16
    # A prompt gets the BOS but no EOS; decoding leaves special tokens out.
    assert tok.encode("def ", document=False) == head + bare(folder, "def ")
    assert tok.decode(tokens[: len(head) + 3]) == tok.decode(bare(folder, a.read_text())[:3])


def test_tokenized_once_then_read_from_the_cache(tmp_path, capsys, monkeypatch):
    import partitioning.data.progress

    monkeypatch.setattr(partitioning.data.progress, "DELAY_S", 0.0)  # as if it took more than a second
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok", LLAMA))
    f = tmp_path / "a.py"
    f.write_text(TEXT)
    first = tokenize_files([f], tok, tmp_path / "cache", progress="lines")
    assert "data: tokenizing 1 file(s)" in capsys.readouterr().err
    cached = list((tmp_path / "cache").glob("*.npy"))
    assert len(cached) == 1 and isinstance(first, np.memmap)
    again = tokenize_files([f], tok, tmp_path / "cache")
    assert capsys.readouterr().err == ""  # nothing tokenized
    assert np.array_equal(first, again) and list((tmp_path / "cache").glob("*")) == cached
    # Another text, or the same tokenizer with other special-token rules: tokenized again, cached beside.
    f.write_text(TEXT + "x = 1\n")
    tokenize_files([f], tok, tmp_path / "cache")
    gpt2 = load_tokenizer(make_tokenizer(tmp_path / "tok2", GPT2))
    tokenize_files([f], gpt2, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 3


def test_a_damaged_cache_file_is_tokenized_again(tmp_path):
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok", LLAMA))
    f = tmp_path / "a.py"
    f.write_text(TEXT)
    good = tokenize_files([f], tok, tmp_path / "cache").tolist()
    (cached,) = (tmp_path / "cache").glob("*.npy")
    cached.write_bytes(b"garbage")
    assert tokenize_files([f], tok, tmp_path / "cache").tolist() == good


def test_a_long_file_is_one_document_tokenized_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenize_mod, "PIECE_BYTES", 100)
    monkeypatch.setattr(tokenize_mod, "GROUP_BYTES", 250)
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok", BOTH))
    f = tmp_path / "long.py"
    f.write_text(TEXT)
    tokens = tokenize_files([f], tok, tmp_path / "cache").tolist()
    assert tokens[0] == 1 and tokens[-1] == 2
    assert tokens.count(1) == 1 and tokens.count(2) == 1
    assert tok.decode(tokens) == TEXT


def test_load_corpus_tokenizes_text_and_reports_the_tokenizer(tmp_path):
    folder = make_tokenizer(tmp_path / "tok", GPT2)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(20):
        (data / f"f{i}.py").write_text(TEXT)
    corpus = load_corpus(str(data), tokenizer=str(folder), cache_dir=str(tmp_path / "cache"))
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    assert corpus.vocab == vocab and corpus.tokenizer.path == folder / "tokenizer.json"
    per_file = len(bare(folder, TEXT)) + 1  # + the EOS between documents
    assert len(corpus.train) + len(corpus.eval) == 20 * per_file
    assert len(corpus.eval) == per_file  # one file of twenty (5%) held out
    assert "tokens (tokenizer" in corpus.describe()
    batch = corpus.batches("train", 4, 16, seed=0).batch_at(3)
    assert batch["inputs"].shape == (4, 16)
    assert np.array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    assert batch["inputs"].max() < vocab


def test_bad_tokenizers_are_one_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match=r"bad/tokenizer.json: not a tokenizer.json the tokenizers library can read"):
        load_tokenizer(bad)
    with pytest.raises(DataError, match=r"no such tokenizer"):
        load_tokenizer(tmp_path / "missing")
    folder = make_tokenizer(tmp_path / "tok", {"add_bos_token": True, "bos_token": "<bos>"})
    with pytest.raises(DataError, match=r"tokenizer_config.json: bos_token '<bos>' is not in the tokenizer's vocab"):
        load_tokenizer(folder)
