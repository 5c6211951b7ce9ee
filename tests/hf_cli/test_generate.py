"""Greedy decoding with the KV cache gives the tokens of re-running the whole sequence at every step."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import partitioning as pt
from partitioning.config import load_config
from partitioning.config.build import mesh_from_config, trainer_from_config
from partitioning.data.batch import place
from partitioning.decode.generate import Decoder, batch_rows, generate
from partitioning.errors import ConfigError
from partitioning.hf.weights import load_hf
from partitioning.mesh import sharding_context
from partitioning.models import GPT, MLP
from partitioning.rules import as_rules

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


@pytest.mark.parametrize(
    "family,rules",
    [
        ("gemma3", "fsdp_tp"),
        ("gemma2", "fsdp"),
        ("qwen3", "fsdp"),
        ("phi3", "fsdp_tp"),
        ("olmo2", "fsdp_tp"),
        ("phi4", "fsdp_tp"),
        ("olmo3", "fsdp_tp"),
        ("smollm3", "fsdp"),
    ],
)
def test_cached_greedy_decoding_gives_transformers_greedy_tokens(repo, monkeypatch, family, rules):
    # The newer families against transformers' own greedy continuation (tools/make_hf_fixtures.py's
    # greedy.npy): 12 tokens past a 5-token prompt, beyond the 5-token windows of Gemma 2/3's local layers
    # and Phi-3's, so the cache's per-layer window masks and Gemma 3's local RoPE are exercised.
    monkeypatch.chdir(repo)
    mesh = pt.make_mesh(MESHES[rules])
    model, variables = load_hf(f"{FIXTURES}/{family}", mesh, rules)
    prompt = [int(t) for t in np.load(f"{FIXTURES}/{family}/tokens.npy")[0, :5]]
    want = np.load(f"{FIXTURES}/{family}/greedy.npy").tolist()
    assert generate(model, variables["params"], prompt, mesh=mesh, rules=rules, max_tokens=len(want)) == want


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


def test_a_batch_of_prompts_of_any_length_decodes_as_each_alone(repo, monkeypatch):
    monkeypatch.chdir(repo)
    mesh = pt.make_mesh(MESHES["fsdp_tp"])
    model, variables = load_hf(f"{FIXTURES}/llama", mesh, "fsdp_tp")
    params = variables["params"]
    dec = Decoder(model, mesh, "fsdp_tp", max_len=14, batch=5)
    assert dec.rows == 8  # 5 prompts rounded up to the 4 batch shards
    prompts = [[1, 90, 3], [1, 272], [1, 272, 203], [1, 5], [1, 7, 9]]  # two lengths: two prefill compiles
    together = dec.decode(params, prompts, 6)
    alone = [dec.decode(params, [p], 6)[0] for p in prompts]
    assert together == alone and [len(t) for t in together] == [6] * 5
    assert together[0] == dec.greedy(params, [1, 90, 3], 6) == [253, 141, 314, 149, 32, 89]
    # Stop tokens end each row on its own, included.
    stops = {314, together[1][1]}
    cut = [t[: next((i + 1 for i, x in enumerate(t) if x in stops), len(t))] for t in together]
    assert dec.decode(params, prompts, 6, stop_ids=stops) == cut
    assert cut[0] == [253, 141, 314] and len(cut[1]) == 2 and sum(map(len, cut)) < 30


CHAT_CONFIG = """\
model: {hf: chatllama}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
run_dir: runs/chat
"""
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture
def chat_checkpoint(repo, tmp_path, monkeypatch):
    """The llama fixture with a chat template and an end-of-turn id in generation_config.json, beside chat.yaml."""
    import json
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(repo / FIXTURES / "llama", "chatllama", ignore=shutil.ignore_patterns("v4"))
    Path("chatllama/chat_template.jinja").write_text(TEMPLATE)
    gen = json.loads(Path("chatllama/generation_config.json").read_text())
    Path("chatllama/generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 3]}))
    Path("chat.yaml").write_text(CHAT_CONFIG)
    return repo


def test_chat_prompts_from_a_file_sampled(chat_checkpoint, run_cli_in_process):
    import json

    from partitioning.data.chat import ChatTemplate
    from partitioning.data.prompts import stop_ids
    from partitioning.data.tokenize import load_tokenizer

    tok = load_tokenizer("chatllama")
    assert stop_ids("chatllama", tok) == [2, 3]  # the tokenizer's EOS, then generation_config's list
    assert ChatTemplate.from_dir("chatllama").render(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    ) == ("<s>[user] hi</s>[assistant] ")
    rows = [
        {"prompt": "def f("},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}]},
    ]
    Path("prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["generate", "chat.yaml", "--prompts", "prompts.jsonl", "--chat", "--max-tokens", "5"]
    r = run_cli_in_process(*args, "--temperature", "0.7", "--top-p", "0.9", "--seed", "3")
    assert r.returncode == 0, r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [sorted(o) for o in out] == [["completion", "prompt", "tokens"], ["completion", "messages", "tokens"]]
    assert out[0]["prompt"] == "def f(" and out[1]["messages"] == rows[1]["messages"]
    assert all(1 <= o["tokens"] <= 5 and isinstance(o["completion"], str) for o in out)
    assert "tokens for 2 prompts from the Hugging Face weights in chatllama, sampled (temperature 0.7, top-p 0.9)" in (
        r.stderr
    )


@pytest.mark.parametrize(
    "args,line",
    [
        (["--prompt", "x", "--temperature", "-1"], "error: --temperature: temperature must be >= 0 (0: greedy)"),
        (["--prompt", "x", "--top-p", "0"], "error: --top-p: top_p must be in (0, 1], got 0.0"),
        (["--prompt", "x", "--top-k", "-2"], "error: --top-k: top_k must be >= 0 (0: off), got -2"),
        (["--prompts", "bad.jsonl"], "error: bad.jsonl:2: expected an object with `prompt` (text) or `messages`"),
        (["--prompts", "chat.jsonl"], "error: chat.jsonl: prompt 1: a `messages` prompt needs --chat (the"),
        (["--prompts", "missing.txt"], "error: missing.txt: cannot read the prompts (FileNotFoundError"),
    ],
)  # fmt: skip
def test_bad_generate_flags_are_one_line(chat_checkpoint, run_cli_in_process, args, line):
    Path("bad.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    Path("chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    r = run_cli_in_process("generate", "chat.yaml", *args)
    lines = [x for x in r.stderr.splitlines() if not x.startswith("simulating")]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(line), r.stderr
    assert r.stdout == ""


def test_chat_on_a_base_model_without_a_template_is_one_line(repo, tmp_path, monkeypatch, run_cli_in_process):
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(repo / FIXTURES / "llama", "chatllama", ignore=shutil.ignore_patterns("v4"))
    Path("chat.yaml").write_text(CHAT_CONFIG)
    r = run_cli_in_process("generate", "chat.yaml", "--prompt", "hi", "--chat")
    assert r.returncode == 2
    assert r.stderr.endswith(
        "error: --chat: chatllama has no chat template (tokenizer_config.json chat_template or chat_template.jinja); "
        "drop --chat for a base model\n"
    )


def test_chat_uses_the_template_the_run_s_chat_data_named(repo, tmp_path, monkeypatch):
    """A base checkpoint fine-tuned on chat data with `data.chat_template`: `generate --chat` renders with it."""
    from partitioning.cli.generate import _chat_template
    from partitioning.data.chat import ChatTemplate

    monkeypatch.chdir(tmp_path)
    Path("chat.yaml").write_text(
        f"model: {{hf: {repo / FIXTURES / 'llama'}}}\n"
        f"data: {{format: chat, path: chat.jsonl, chat_template: {repo / 'tests/fixtures/chat/mistral'}}}\n"
        "mesh: {shape: {data: 1, fsdp: -1}}\nrules: fsdp\n"
    )
    template = _chat_template(load_config("chat.yaml"), repo / FIXTURES / "llama")
    messages = [{"role": "user", "content": "hi"}]
    want = ChatTemplate.from_dir(repo / "tests/fixtures/chat/mistral").render(messages, add_generation_prompt=True)
    assert template.render(messages, add_generation_prompt=True) == want == "<s>[INST] hi [/INST]"
