"""The Python API as guarded as the CLI: every public function that takes a Hugging Face path validates it
with the CLI's message -- a file given for the folder, config.json values of the wrong type, a misspelt key,
an architecture a letter away -- and an error path leaves nothing on disk."""

import json
import shutil
from pathlib import Path

import pytest

import partitioning as pt
from partitioning.errors import CheckpointError

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama"
ENTRY_POINTS = {
    "load_hf": lambda p: pt.hf.load_hf(p, pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp"),
    "hf_model": pt.hf.hf_model,
    "hf_family": pt.hf.hf_family,
}


@pytest.fixture
def ckpt(tmp_path, monkeypatch):
    shutil.copytree(HF, tmp_path / "llama")
    monkeypatch.chdir(tmp_path)
    return Path("llama")


def _edit(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*"))


@pytest.mark.parametrize("fn", list(ENTRY_POINTS))
@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_file_for_the_folder_is_said_as_such(ckpt, fn, name):
    with pytest.raises(CheckpointError) as e:
        ENTRY_POINTS[fn](ckpt / name)
    assert str(e.value) == (
        f"llama/{name}: a file, not a Hugging Face checkpoint: pass its folder (llama, with config.json and "
        f"*.safetensors) or its config.json"
    )


@pytest.mark.parametrize("fn", list(ENTRY_POINTS))
@pytest.mark.parametrize(
    "changes, error",
    [
        ({"vocab_size": "320"}, "llama/config.json: vocab_size must be an integer, got '320' (a string)"),
        ({"rms_norm_eps": "1e-5"}, "llama/config.json: rms_norm_eps must be a number, got '1e-5' (a string)"),
        ({"tie_word_embeddings": 1}, "llama/config.json: tie_word_embeddings must be true or false, got 1 (int)"),
        (
            {"num_key_valu_heads": 2, "num_key_value_heads": None},
            "llama/config.json: unknown key 'num_key_valu_heads' (did you mean 'num_key_value_heads'?)",
        ),
        ({"architectures": ["LLamaForCausalLM"]}, "(did you mean 'LlamaForCausalLM'?)"),
    ],
)
def test_config_json_is_validated_by_every_entry_point(ckpt, fn, changes, error):
    _edit(ckpt, **changes)
    before = _files(Path("."))
    with pytest.raises(CheckpointError) as e:
        ENTRY_POINTS[fn](ckpt)
    assert str(e.value) == error if error.startswith("llama/") else str(e.value).endswith(error), str(e.value)
    assert str(e.value).startswith("llama/config.json: ")
    assert _files(Path(".")) == before  # an error path leaves nothing behind


@pytest.mark.parametrize("fn", ["restore_checkpoint", "checkpoint_metadata"])
def test_checkpoint_paths_are_validated_like_the_cli(tmp_path, monkeypatch, fn):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        getattr(pt.checkpoint, fn)(
            "nope", **({"mesh": pt.make_mesh({"data": 1, "fsdp": -1})} if fn == "restore_checkpoint" else {})
        )
    assert str(e.value) == "nope: no such checkpoint (expected a run dir, a checkpoints dir or a step dir)"
    assert list(tmp_path.iterdir()) == []
