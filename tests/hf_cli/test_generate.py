"""Greedy decoding with the KV cache gives the tokens of re-running the whole sequence at every step."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioning as pt
from partitioning.checkpoint.hf import load_hf
from partitioning.config import load_config
from partitioning.config.build import mesh_from_config, trainer_from_config
from partitioning.errors import ConfigError
from partitioning.mesh import sharding_context
from partitioning.models import GPT, MLP
from partitioning.rules import as_rules
from partitioning.train.batch import place
from partitioning.train.generate import Decoder, batch_rows, generate

FIXTURES = "tests/fixtures/hf"
MESHES = {"fsdp": {"data": 1, "fsdp": 8}, "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2}}


def full_recompute(model, params, prompt, n, mesh, rules):
    """Greedy decoding without a cache: the whole sequence (padded to one length: one compile) at every step."""
    rows, total = batch_rows(mesh, rules), len(prompt) + n
    sharding = NamedSharding(mesh, as_rules(rules).batch_spec(2))
    step = jax.jit(lambda p, t: jnp.argmax(model.apply({"params": p}, t), axis=-1))
    seq = list(prompt)
    for _ in range(n):
        buf = np.zeros((rows, total), np.int32)
        buf[:, : len(seq)] = seq
        with sharding_context(mesh, rules):
            best = np.asarray(jax.device_get(step(params, place(buf, sharding))))
        seq.append(int(best[0, len(seq) - 1]))
    return seq[len(prompt) :]


@pytest.mark.parametrize(
    "family,rules",
    [
        ("mistral", "fsdp"),
        ("llama", "fsdp_tp"),
        ("gpt2", "fsdp_tp"),
        ("gemma3", "fsdp_tp"),
        ("gemma2", "fsdp"),
        ("qwen3", "fsdp"),
        ("phi3", "fsdp_tp"),
        ("olmo2", "fsdp_tp"),
    ],
    ids=[
        "mistral-sliding-window-fsdp",
        "llama-fsdp_tp",
        "gpt2-learned-positions-fsdp_tp",
        "gemma3-local-global-layers-fsdp_tp",
        "gemma2-soft-caps-fsdp",
        "qwen3-fsdp",
        "phi3-fsdp_tp",
        "olmo2-fsdp_tp",
    ],
)
def test_cached_greedy_decoding_equals_recomputing_the_sequence(repo, monkeypatch, family, rules):
    monkeypatch.chdir(repo)
    mesh = pt.make_mesh(MESHES[rules])
    model, variables = load_hf(f"{FIXTURES}/{family}", mesh, rules)
    prompt = [int(t) for t in np.load(f"{FIXTURES}/{family}/tokens.npy").reshape(-1)[:5]]
    n = 12  # past mistral's window of 5: the cache's window mask is exercised
    cached = generate(model, variables["params"], prompt, mesh=mesh, rules=rules, max_tokens=n)
    assert len(cached) == n
    assert cached == full_recompute(model, variables["params"], prompt, n, mesh, rules)


def test_the_cache_is_laid_out_by_the_rules_and_stacked_with_the_layers():
    mesh = pt.make_mesh(MESHES["fsdp_tp"])
    model = GPT(vocab_size=256, embed=32, heads=4, kv_heads=2, mlp=64, layers=3)
    dec = Decoder(model, mesh, "fsdp_tp", max_len=16)
    keys = dec.cache_shardings["blocks"]["attn"]["cached_key"]
    # (layers, batch, length, kv_heads, kv): batch over the batch axes, kv heads over tensor, like the activations
    assert tuple(keys.spec) == (None, ("data", "fsdp"), None, "tensor", None)
    cache = dec._zeros()
    assert cache["blocks"]["attn"]["cached_key"].shape == (3, 4, 16, 2, 8)
    assert cache["blocks"]["attn"]["cache_index"].shape == (3,)


def test_stop_token_and_models_without_a_decode_mode():
    mesh = pt.make_mesh(MESHES["fsdp"])
    model = GPT(vocab_size=256, embed=32, heads=4, mlp=64, layers=1)
    params = pt.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
    dec = Decoder(model, mesh, "fsdp", max_len=5)
    first = dec.greedy(params, list(b"ab"), 3)
    assert len(first) == 3 and dec.greedy(params, list(b"ab"), 3, stop_id=first[0]) == first[:1]
    with pytest.raises(ConfigError, match="2 prompt tokens \\+ 4 new ones exceed this decoder's 5 positions"):
        dec.greedy(params, list(b"ab"), 4)
    with pytest.raises(ConfigError, match="MLP has no decode mode"):
        generate(MLP(), {}, [1], mesh=mesh, rules="fsdp")
    with pytest.raises(ConfigError, match="max_tokens must be >= 1"):
        generate(model, params, [1], mesh=mesh, rules="fsdp", max_tokens=0)


BYTES_CONFIG = """\
model: {name: gpt, vocab_size: 256, embed: 32, heads: 2, mlp: 64, layers: 1}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
train: {batch_size: 8, seq_len: 16}
run_dir: runs/bytes
"""


def test_a_byte_level_run_generates_utf8_text(tmp_path, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(tmp_path)
    Path("bytes.yaml").write_text(BYTES_CONFIG)
    r = run_cli_in_process("generate", "bytes.yaml", "--prompt", "é")
    (line,) = [x for x in r.stderr.splitlines() if not x.startswith("simulating")]
    assert r.returncode == 2 and line.startswith("error: runs/bytes/checkpoints: no checkpoint to generate from; train")
    r = run_cli_in_process("generate", "bytes.yaml", "--prompt", "é", "--from-hf")
    assert r.returncode == 2
    assert r.stderr.endswith(
        "error: --from-hf: bytes.yaml:1: model is not a Hugging Face checkpoint (model: {hf: DIR})\n"
    )
    # A checkpoint as `train` writes it (a fresh init is enough to talk; no training step compiled).
    cfg = load_config("bytes.yaml")
    trainer = trainer_from_config(cfg, mesh_from_config(cfg))
    pt.save_checkpoint("runs/bytes/checkpoints", 2, trainer.init(jax.random.key(0)), rules=cfg.rules)
    r = run_cli_in_process("generate", "bytes.yaml", "--prompt", "é", "--max-tokens", "6")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("é") and r.stdout.endswith("\n")  # the prompt's two bytes, then 6 decoded bytes
    assert "generate: 6 tokens from step 2 of runs/bytes/checkpoints, greedy with a KV cache" in r.stderr
