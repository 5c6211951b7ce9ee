"""``model: {hf: DIR}`` in a run config: found beside the config (then the cwd), errors at file:line."""

from pathlib import Path

import pytest

from partitioning.config import load_config
from partitioning.config.build import model_options_resolved
from partitioning.errors import ConfigError

CONFIG = """\
model:
  hf: {hf}
{extra}mesh:
  shape: {{data: 1, fsdp: -1}}
  devices: 8
rules: fsdp
"""


def checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return folder


def write_config(path: Path, hf: str, extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG.format(hf=hf, extra=extra))
    return path


def test_the_shipped_plan_only_configs_find_their_config_json(repo, monkeypatch):
    monkeypatch.chdir(repo)
    cfg = load_config("configs/llama3_70b_hf.yaml")
    assert cfg.model_hf == Path("configs/hf/llama-3.1-70b")
    assert cfg.model_name == "hf/llama-3.1-70b"
    assert model_options_resolved(cfg) == {
        "scan_layers": True,
        "remat": "full",
        "dtype": "bfloat16",
        "param_dtype": "float32",
        "capacity_factor": None,
        "attention": "xla",
        "context_parallel": "auto",
    }
    assert cfg.resolved()["model"] == {"hf": "hf/llama-3.1-70b", **cfg.model_options}
    assert load_config("configs/llama3_8b_hf.yaml").model_hf == Path("configs/hf/llama-3.1-8b")


def test_a_relative_path_is_looked_for_beside_the_config_then_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint(tmp_path / "runs" / "ckpt")
    checkpoint(tmp_path / "ckpt")
    beside = write_config(tmp_path / "runs" / "a.yaml", "ckpt")
    assert load_config("runs/a.yaml").model_hf == Path("runs/ckpt")
    checkpoint(tmp_path / "elsewhere")
    assert load_config(write_config(tmp_path / "runs" / "b.yaml", "elsewhere")).model_hf == Path("elsewhere")
    # A --set value is typed relative to where the command runs: the cwd first.
    assert load_config(beside, ["model.hf=ckpt"]).model_hf == Path("ckpt")
    # A config.json named directly is fine too.
    write_config(tmp_path / "c.yaml", "ckpt/config.json")
    assert load_config("c.yaml").model_hf == Path("ckpt/config.json")


@pytest.mark.parametrize(
    "hf,extra,message",
    [
        ("missing", "", "a.yaml:2: model.hf: no such checkpoint folder or config.json 'missing' (looked in cfg, .)"),
        ("empty", "", "a.yaml:2: model.hf: cfg/empty has no config.json (a Hugging Face checkpoint folder holds"),
        ("ckpt", "  layers: 3\n", "a.yaml:3: model.layers: unknown key (valid: hf, scan_layers, remat, dtype, "),
        (
            "ckpt",
            "  remat: some\n",
            "a.yaml:3: model.remat: must be one of auto, none, full, dots, dots_no_batch, offload, got 'some'",
        ),
        ("ckpt", "  scan_layers: 1\n", "a.yaml:3: model.scan_layers: expected true or false, got int 1"),
        ("ckpt", "  name: gpt\n", "a.yaml:1: model: expected a mapping with a 'name' key"),
        ("[1]", "", "a.yaml:2: model.hf: expected a string, got list [1]"),
    ],
)
def test_bad_hf_sections_are_one_line_at_the_key(tmp_path, monkeypatch, hf, extra, message):
    monkeypatch.chdir(tmp_path)
    checkpoint(tmp_path / "cfg" / "ckpt")
    (tmp_path / "cfg" / "empty").mkdir()
    path = write_config(tmp_path / "cfg" / "a.yaml", hf, extra)
    with pytest.raises(ConfigError) as e:
        load_config(Path("cfg/a.yaml"))
    assert str(e.value).startswith(f"cfg/{message}"), str(e.value)
    assert str(path)  # the file is the user's, untouched
