"""save_hf: files transformers reads (its names, shapes, dtypes, sharding, metadata), bit-exact through load_hf,
all-or-nothing on disk; a plain GPT exports as Llama."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.hf import write as hf_write
from partitioning.models import GPT
from tests.hf.conftest import FAMILIES, fixture, logits, mesh_for, tensors_of

HF_PYTHON = os.environ.get("PARTITIONING_HF_PYTHON")  # a Python with torch + transformers (tools/make_hf_fixtures.py)


def same_bits(a, b) -> bool:
    """The same tree with the same bytes in every leaf."""
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("name", FAMILIES + ["llama_bf16", "qwen2_fp16"])
def test_saved_files_are_the_originals_and_load_back_bit_exact(name, tmp_path):
    src = fixture(name)
    model, variables = pt.hf.load_hf(src, mesh_for("fsdp"), "fsdp", scan_layers=name != "gpt2")
    disk_dtype = {"llama_bf16": "bfloat16", "qwen2_fp16": "float16"}.get(name)
    out = pt.hf.save_hf(model, variables, tmp_path / "out", dtype=disk_dtype)
    assert out == tmp_path / "out"
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    original = json.loads((src / "config.json").read_text())
    assert json.loads((out / "config.json").read_text()) == {**original, "dtype": disk_dtype or "float32"}
    # The same tensors, names and bytes as transformers wrote (GPT-2's fused c_attn reassembled).
    want, got = tensors_of(src), tensors_of(out)
    want.pop("lm_head.weight", None) if model.tie_embeddings else None
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)), k
    again, variables2 = pt.hf.load_hf(out, scan_layers=name != "gpt2")
    assert same_bits(variables2, variables)


def test_safetensors_reads_what_save_hf_writes(tmp_path):
    numpy_reader = pytest.importorskip("safetensors.numpy")
    model, variables = pt.hf.load_hf(fixture("gpt2"))
    out = pt.hf.save_hf(model, variables, tmp_path / "gpt2")
    theirs = numpy_reader.load_file(out / "model.safetensors")
    ours = tensors_of(out)
    assert sorted(theirs) == sorted(ours)
    assert all(np.array_equal(theirs[k], ours[k]) for k in ours)
    with open(out / "model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        assert json.loads(f.read(n))["__metadata__"] == {"format": "pt"}
        assert n % 8 == 0


def test_sharded_save_with_an_index_then_a_single_file_replaces_it(tmp_path):
    model, variables = pt.hf.load_hf(fixture("llama_sharded"), mesh_for("fsdp_tp"), "fsdp_tp")
    out = pt.hf.save_hf(model, variables, tmp_path / "out", max_shard_size="40KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in tensors_of(out).values())
    assert all((out / f).stat().st_size < 40_000 + 4096 for f in files)
    assert sorted(index["weight_map"]) == sorted(tensors_of(fixture("llama_sharded")))
    _, again = pt.hf.load_hf(out)
    assert same_bits(again, variables)
    pt.hf.save_hf(model, variables, out)  # one file now: the old shards and index go
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


def test_a_failed_save_changes_nothing_on_disk(tmp_path, monkeypatch):
    model, variables = pt.hf.load_hf(fixture("qwen2"))
    out = pt.hf.save_hf(model, variables, tmp_path / "out")
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    calls = []

    def failing(x, layer=None):
        calls.append(1)
        if len(calls) > 5:
            raise OSError("disk full")
        return hf_write.host_value.__wrapped__(x, layer)

    failing.__wrapped__ = hf_write.host_value
    monkeypatch.setattr(hf_write, "host_value", failing)
    with pytest.raises(OSError):
        pt.hf.save_hf(model, variables, out, dtype="bfloat16")
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    with pytest.raises(OSError):
        pt.hf.save_hf(model, variables, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_plain_gpt_exports_as_llama_and_mistral(tmp_path):
    tokens = np.arange(24, dtype=np.int32).reshape(2, 12) % 64
    rng = np.random.default_rng(0)
    for kw, arch in [
        (
            dict(kv_heads=2, tie_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
            "LlamaForCausalLM",
        ),
        (dict(sliding_window=4, rope_theta=500.0), "MistralForCausalLM"),
    ]:
        model = GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2, **kw)
        # Random values of the init's shapes: compiling GPT's init takes ~20 s on a loaded 2-core host.
        abstract = pt.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens))
        variables = jax.tree.map(lambda a: rng.normal(0, 0.3, a.shape).astype(a.dtype), abstract)
        out = pt.hf.save_hf(model, variables, tmp_path / arch)
        assert json.loads((out / "config.json").read_text())["architectures"] == [arch]
        # Loaded back as the Llama family: weights stored (out, in), the same function.
        again, variables2 = pt.hf.load_hf(out)
        assert variables2["params"]["blocks"]["attn"]["q"].shape == (2, 4, 8, 32)
        np.testing.assert_allclose(logits(again, variables2, tokens), logits(model, variables, tokens), atol=1e-5)
        out2 = pt.hf.save_hf(again, variables2, tmp_path / f"{arch}-again")
        first, second = tensors_of(out), tensors_of(out2)
        assert sorted(first) == sorted(second) and all(np.array_equal(first[k], second[k]) for k in first)
    with pytest.raises(pt.ConfigError, match="moe"):
        pt.hf.save_hf(GPT(moe={"experts": 2}), {}, tmp_path / "moe")


def test_save_hf_refuses_parameters_of_another_shape(tmp_path):
    model, variables = pt.hf.load_hf(fixture("llama"))
    other, _ = pt.hf.load_hf(fixture("llama_sharded"))
    wrong = jax.tree.map(lambda x: x, variables)
    wrong["params"]["embedding"] = np.zeros((10, 32), np.float32)
    with pytest.raises(pt.CheckpointError, match=r"embedding has shape \[10, 32\]; the model has \[320, 32\]"):
        pt.hf.save_hf(model, wrong, tmp_path / "x")
    with pytest.raises(pt.ConfigError, match="dtype"):
        pt.hf.save_hf(model, variables, tmp_path / "x", dtype="int8")
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(not HF_PYTHON, reason="set PARTITIONING_HF_PYTHON to a Python with transformers")
@pytest.mark.parametrize("name", FAMILIES)
def test_transformers_loads_what_save_hf_writes(name, tmp_path, repo):
    model, variables = pt.hf.load_hf(fixture(name), mesh_for("fsdp"), "fsdp")
    out = pt.hf.save_hf(model, variables, tmp_path / name, max_shard_size="50KB")
    r = subprocess.run(
        [HF_PYTHON, str(repo / "tools" / "make_hf_fixtures.py"), "--check", str(out), "--expect", str(fixture(name))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert r.stdout.startswith("OK")


@pytest.mark.slow
def test_two_processes_load_their_halves_and_save_through_process_0(repo, tmp_path, free_port):
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(repo)
    procs = [
        subprocess.Popen(
            [sys.executable, "tests/hf/mp_worker.py", str(i), port, str(fixture("llama")), str(tmp_path)],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            [q.kill() for q in procs]
            pytest.fail("multi-process load_hf timed out")
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    results = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
    assert all(r["diff"] <= 1e-4 for r in results), results
    # Each process reads only its devices' shards: under fsdp_tp less than the whole (rows split along
    # `embed` are read whole, in runs); under pp everything but the other stage's layer.
    tensors = tensors_of(fixture("llama"))
    total = sum(v.nbytes for v in tensors.values())
    for i, r in enumerate(results):
        other_layer = sum(v.nbytes for k, v in tensors.items() if k.startswith(f"model.layers.{1 - i}."))
        assert r["bytes_read"] < total and r["pp_bytes_read"] == total - other_layer, (results, total)
    # Mixtral's 4 experts split over the 2 processes: each read the tensors of its 2 experts, no other.
    assert [r["experts_read"] for r in results] == [[0, 1], [2, 3]], results
    saved, want = tensors_of(tmp_path / "saved"), tensors_of(fixture("llama"))
    assert sorted(saved) == sorted(want) and all(np.array_equal(saved[k], want[k]) for k in want)
    assert (tmp_path / "saved" / "model.safetensors.index.json").exists()
