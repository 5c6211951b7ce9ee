"""Shared by the Hugging Face tests: the golden fixtures transformers made, meshes, logits, file surgery."""

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.hf.files import discover, write_safetensors

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
# Issue 27's dense families (gemma3_mm, the text tower of a multimodal checkpoint, is tested on its own).
NEW_FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3", "olmo2"]
# Issue 37's dense families: Phi-4 (GQA in the fused qkv_proj), Phi-4-mini (partial rotary, LongRoPE), OLMo-3
# (sliding and full layers, YaRN), SmolLM3 (NoPE layers).
NEW_FAMILIES += ["phi4", "phi4_mini", "olmo3", "smollm3"]
FAMILIES = ["llama", "llama_tied", "mistral", "qwen2", "gemma", "gpt2", *NEW_FAMILIES]
MESHES = {
    "fsdp": {"data": 1, "fsdp": 8},
    "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2},
    "tp": {"data": 4, "tensor": 2},
    "pp": {"stage": 2, "data": 4},
}


def fixture(name: str) -> Path:
    return FIXTURES / name


def mesh_for(preset: str):
    return pt.make_mesh(MESHES[preset])


def logits(model, variables, tokens, mesh=None, rules=None) -> np.ndarray:
    if mesh is None:
        return np.asarray(jax.jit(model.apply)(variables, tokens))
    with pt.sharding_context(mesh, rules):
        return np.asarray(jax.jit(model.apply)(variables, tokens))


def expected(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, transformers' float32 logits) of a fixture."""
    return np.load(fixture(name) / "tokens.npy"), np.load(fixture(name) / "logits.npy")


def tensors_of(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint, read plainly (the test's own reader, not the one under test)."""
    out = {}
    for name, s in discover(directory).items():
        with open(s.file, "rb") as f:
            f.seek(s.start)
            out[name] = np.frombuffer(f.read(int(np.prod(s.shape)) * s.dtype.itemsize), s.dtype).reshape(s.shape)
    return out


@pytest.fixture
def damaged(tmp_path):
    """``damaged(name, drop=(), add={}, replace={})``: a copy of a fixture with its tensors changed."""

    made = []

    def make(name: str, drop=(), add=None, replace=None) -> Path:
        made.append(name)
        out = tmp_path / (name if made.count(name) == 1 else f"{name}-{made.count(name)}")
        shutil.copytree(fixture(name), out, ignore=shutil.ignore_patterns("*.safetensors*", "v4"))
        tensors = {k: v for k, v in tensors_of(fixture(name)).items() if k not in drop}
        tensors.update(replace or {})
        tensors.update(add or {})
        entries = [(k, v.dtype, v.shape) for k, v in tensors.items()]
        write_safetensors(out / "model.safetensors", entries, tensors.values())
        return out

    return make
