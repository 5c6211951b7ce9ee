"""Every public function that takes a path or a config file refuses what users get wrong -- a path that does
not exist (relative or absolute), a folder for a file and a file for a folder, binary garbage, an empty file, a
tokenizer.json for a config, a misspelt key, an output under a file or over a non-empty folder -- with one
PartitioningError line naming the path as given (the CLI's message where the CLI reads the same input), and
leaves nothing new on disk. Loading-the-checkpoint cases live in tests/hf/test_api_guards.py."""

import shutil
from pathlib import Path

import pytest

import partitioning as pt
from partitioning.hf import write as hf_write

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LLAMA = FIXTURES / "hf" / "llama"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working directory with the things users point at by mistake, named relative to it."""
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("not a folder\n")
    Path("empty").mkdir()
    Path("full").mkdir()
    Path("full/keep.txt").write_text("the user's file\n")
    Path("garbage.bin").write_bytes(b"\x80\x81\x00binary")
    Path("empty.yaml").write_text("")
    Path("folder.yaml").mkdir()
    shutil.copy(LLAMA / "tokenizer.json", "tokenizer.json")
    return tmp_path


def _files(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def _refused(root: Path, call, message: str) -> None:
    """``call()`` raises a PartitioningError whose one line is ``message`` and changes nothing under root."""
    before = _files(root)
    with pytest.raises(pt.PartitioningError) as e:
        call()
    assert str(e.value) == message
    assert "\n" not in str(e.value)
    assert _files(root) == before


READERS = {
    # Rules.from_yaml, table_mesh and load_config read YAML with the CLI's reader: its messages, word for word
    "rules-missing": (lambda: pt.Rules.from_yaml("nope.yaml"), "nope.yaml: no such rules file"),
    "rules-folder": (lambda: pt.Rules.from_yaml("empty"), "empty: is a folder, not a rules file"),
    "rules-binary": (
        lambda: pt.Rules.from_yaml("garbage.bin"),
        "garbage.bin: not UTF-8 text (byte 0 looks like binary data); save it as UTF-8",
    ),
    "rules-empty": (
        lambda: pt.Rules.from_yaml("empty.yaml"),
        "empty.yaml: a rules file needs a top-level 'rules:' list",
    ),
    "rules-under-file": (
        lambda: pt.Rules.from_yaml("notes.txt/r.yaml"),
        "notes.txt/r.yaml: cannot read rules file: Not a directory",
    ),
    "rules-tokenizer": (
        lambda: pt.Rules.from_yaml("tokenizer.json"),
        "tokenizer.json:2: version: unknown key (valid: rules, batch_axes, follows, mesh)",
    ),
    "preset-misspelt": (
        lambda: pt.Rules.preset("fsdpp"),
        "unknown rule preset 'fsdpp' (presets: dp, ep, fsdp, fsdp_cp, fsdp_tp, pp, pp_fsdp, seq, tp); "
        "did you mean 'fsdp'?",
    ),
    "table_mesh-folder": (lambda: pt.rules.table_mesh("empty"), "empty: is a folder, not a rules file"),
    "table_mesh-binary": (
        lambda: pt.rules.table_mesh("garbage.bin"),
        "garbage.bin: not UTF-8 text (byte 0 looks like binary data); save it as UTF-8",
    ),
    "config-missing": (lambda: pt.load_config("nope.yaml"), "nope.yaml: no such config file"),
    "config-folder": (lambda: pt.load_config("empty"), "empty: is a folder, not a config file"),
    "config-binary": (
        lambda: pt.load_config("garbage.bin"),
        "garbage.bin: not UTF-8 text (byte 0 looks like binary data); save it as UTF-8",
    ),
    "config-empty": (
        lambda: pt.load_config("empty.yaml"),
        "empty.yaml: missing required sections 'model', 'mesh', 'rules'",
    ),
    "config-under-file": (
        lambda: pt.load_config("notes.txt/run.yaml"),
        "notes.txt/run.yaml: cannot read config file: Not a directory",
    ),
    "annotations-missing": (lambda: pt.Annotations.parse("nope.yaml"), "nope.yaml: no such annotations file"),
    "annotations-folder": (
        lambda: pt.Annotations.parse("folder.yaml"),
        "folder.yaml: is a folder, not an annotations file",
    ),
    "annotations-not-a-file-name": (
        lambda: pt.Annotations.parse("empty"),
        "annotations: expected a list of [path_regex, names] rows, got str",
    ),
    "annotations-empty": (
        lambda: pt.Annotations.parse("empty.yaml"),
        "empty.yaml: an annotations file has an `annotations:` key (partitioning annotate --out)",
    ),
    "hardware-missing": (lambda: pt.tune.load_hardware("nope.yaml"), "nope.yaml: no such hardware file"),
    "hardware-folder": (lambda: pt.tune.load_hardware("empty"), "empty: is a folder, not a hardware file"),
    "hardware-misspelt": (
        lambda: pt.tune.hardware("h1000"),
        "--hardware 'h1000': no such profile; choose one of h100, h200, a100-80g, v4, v5e, v5p, cpu or give a YAML "
        "file; did you mean 'h100'?",
    ),
    "hardware-not-a-name": (
        lambda: pt.tune.hardware(3),
        "--hardware 3: expected a profile name (h100, h200, a100-80g, v4, v5e, v5p, cpu)",
    ),
    "model-misspelt": (
        lambda: pt.model.build_model("mlpp"),
        "unknown model 'mlpp' (registered: gpt, mlp); did you mean 'mlp'?",
    ),
    # data
    "tokenizer-missing": (
        lambda: pt.data.load_tokenizer("nope"),
        "nope: no such tokenizer (a tokenizer.json, or a folder holding one)",
    ),
    "tokenizer-folder-without": (
        lambda: pt.data.load_tokenizer("empty"),
        "empty: no such tokenizer (a tokenizer.json, or a folder holding one)",
    ),
    "tokenizer-empty": (
        lambda: pt.data.load_tokenizer("empty.yaml"),
        "empty.yaml: not a tokenizer.json the tokenizers library can read "
        "(EOF while parsing a value at line 1 column 0)",
    ),
    "chat-missing": (
        lambda: pt.data.ChatTemplate.from_dir("nope"),
        "nope: no such folder: a tokenizer folder (with tokenizer_config.json or chat_template.jinja)",
    ),
    "chat-file": (
        lambda: pt.data.ChatTemplate.from_dir("tokenizer.json"),
        "tokenizer.json: a file, not a tokenizer folder (with tokenizer_config.json or chat_template.jinja)",
    ),
    "corpus-missing": (lambda: pt.data.load_corpus("nope.txt"), "'nope.txt': no such file or folder"),
    "corpus-folder": (lambda: pt.data.load_corpus("empty"), "'empty': folder holds no text files"),
    "corpus-empty": (lambda: pt.data.load_corpus("empty.yaml"), "'empty.yaml': file is empty"),
    "corpus-binary": (
        lambda: pt.data.load_corpus("garbage.bin"),
        "'garbage.bin': a .bin file has no header; say its dtype (e.g. uint16 for GPT-2 tokens)",
    ),
    "instructions-missing": (
        lambda: pt.data.load_instructions("nope.jsonl", "prompt_completion", str(LLAMA)),
        "'nope.jsonl': no such file or folder",
    ),
    "instructions-folder": (
        lambda: pt.data.load_instructions("empty", "prompt_completion", str(LLAMA)),
        "'empty': folder holds no .jsonl files",
    ),
    # checkpoints and adapters
    "metadata-file": (
        lambda: pt.checkpoint.checkpoint_metadata("notes.txt"),
        "notes.txt: a file, not a checkpoint directory",
    ),
    "adapter-missing": (
        lambda: pt.hf.load_hf(LLAMA, adapter="nope"),
        "nope does not exist: a PEFT adapter is a folder with adapter_config.json and adapter_model.safetensors",
    ),
    "adapter-file": (
        lambda: pt.hf.load_hf(LLAMA, adapter="notes.txt"),
        "notes.txt is a file: a PEFT adapter is a folder with adapter_config.json and adapter_model.safetensors",
    ),
    "adapter-folder-without": (
        lambda: pt.hf.load_hf(LLAMA, adapter="empty"),
        "empty has no adapter_config.json: a PEFT adapter is a folder with adapter_config.json and "
        "adapter_model.safetensors",
    ),
}


@pytest.mark.parametrize("case", list(READERS))
def test_readers_refuse_bad_paths_in_one_line(here, case):
    call, message = READERS[case]
    _refused(here, call, message)


@pytest.mark.parametrize(
    "fn, what",
    [
        (pt.Rules.from_yaml, "rules file"),
        (pt.load_config, "config file"),
        (pt.tune.load_hardware, "hardware file"),
        (pt.data.load_tokenizer, "tokenizer"),
        (pt.checkpoint.checkpoint_metadata, "checkpoint"),
    ],
)
def test_an_absolute_path_is_named_absolute(here, fn, what):
    with pytest.raises(pt.PartitioningError) as e:
        fn(here / "nope.yaml")
    assert str(e.value).startswith(f"{here / 'nope.yaml'}: no such {what}")


def test_a_misspelt_key_in_a_rules_file_gets_a_did_you_mean(here):
    Path("r.yaml").write_text("rulez:\n  - [batch, data]\n")
    _refused(
        here,
        lambda: pt.Rules.from_yaml("r.yaml"),
        "r.yaml:1: rulez: unknown key (valid: rules, batch_axes, follows, mesh); did you mean 'rules'?",
    )


@pytest.fixture(scope="module")
def llama():
    return pt.hf.load_hf(LLAMA)


@pytest.fixture(scope="module")
def llama_lora():
    return pt.hf.load_hf(LLAMA, adapter=FIXTURES / "peft" / "llama")


HF_KIND = "a Hugging Face checkpoint"
WRITERS = {
    "save_hf": (lambda m, out: pt.hf.save_hf(*m[0], out), HF_KIND),
    "save_peft": (lambda m, out: pt.hf.save_peft(*m[1], out), "a PEFT adapter"),
}


@pytest.mark.parametrize("fn", list(WRITERS))
@pytest.mark.parametrize(
    "out, message",
    [
        ("notes.txt", "notes.txt: is a file; out_dir must be a folder (new, empty, or holding {kind})"),
        ("notes.txt/out", "notes.txt/out: cannot make this folder: notes.txt is a file"),
        ("full", "full: exists and is not empty; choose a new folder, an empty one or one holding {kind}"),
    ],
)
def test_writers_refuse_an_output_they_cannot_use_and_write_nothing(here, llama, llama_lora, fn, out, message):
    call, kind = WRITERS[fn]
    _refused(here, lambda: call((llama, llama_lora), out), message.format(kind=kind))


def test_writers_replace_their_own_earlier_save(here, llama, llama_lora):
    assert sorted(p.name for p in pt.hf.save_hf(*llama, "out").iterdir()) == ["config.json", "model.safetensors"]
    pt.hf.save_hf(*llama, "out")  # a checkpoint folder is replaced, as before
    pt.hf.save_peft(*llama_lora, "adapter")
    pt.hf.save_peft(*llama_lora, "adapter")
    _refused(
        here,
        lambda: pt.hf.save_peft(*llama_lora, "out"),
        "out: exists and is not empty; choose a new folder, an empty one or one holding a PEFT adapter",
    )


def test_a_failed_save_removes_every_folder_it_made(here, llama, monkeypatch):
    def failing(x, layer=None):
        raise OSError("disk full")

    monkeypatch.setattr(hf_write, "host_value", failing)
    before = _files(here)
    with pytest.raises(OSError):
        pt.hf.save_hf(*llama, "new/deeper/out")
    assert _files(here) == before


@pytest.mark.parametrize(
    "directory, message",
    [
        ("notes.txt", "notes.txt: is a file; directory must be a folder (new, empty, or holding checkpoints)"),
        ("notes.txt/ckpt", "notes.txt/ckpt: cannot make this folder: notes.txt is a file"),
    ],
)
def test_checkpoint_directories_under_or_at_a_file_are_refused(here, directory, message):
    _refused(here, lambda: pt.CheckpointManager(directory), message)
    _refused(here, lambda: pt.save_checkpoint(directory, 1, {"w": [1.0]}), message)


@pytest.mark.parametrize(
    "path, message",
    [
        ("empty", "empty: a folder; name a .png file"),
        ("plan.txt", "plan.txt: not a .png; name a .png file"),
        ("notes.txt/plan.png", "notes.txt/plan.png: cannot write the PNG: notes.txt is a file, not a folder"),
    ],
)
def test_plots_refuse_a_path_they_cannot_write(here, path, message):
    _refused(here, lambda: pt.train.plot_loss([{"step": 1, "loss": 2.0}], path), message)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: pt.train.JsonlLogger("empty"),
            "empty: cannot write the metrics: a folder; name a file (metrics.jsonl)",
        ),
        (
            lambda: pt.train.JsonlLogger("notes.txt/m.jsonl"),
            "notes.txt/m.jsonl: cannot write the metrics: notes.txt is a file",
        ),
        (
            lambda: pt.train.TensorBoardLogger("notes.txt/tb"),
            "notes.txt/tb: cannot write TensorBoard events: notes.txt is a file",
        ),
    ],
)
def test_loggers_refuse_an_unwritable_path_when_made(here, make, message):
    _refused(here, make, message)
