"""Bad input, as a new user's mistakes and a cluster's accidents make it: exit 2, one line naming where
(file:line and key, the flag, the path), no traceback, nothing on disk changed — and nothing hangs."""

import contextlib
from pathlib import Path

import jax
import pytest

RUN = "run.yaml"


def one_line(r) -> str:
    """The single error line of a failed command (and that it is the only line besides device notes)."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("simulating ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0][len("error: ") :]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Runs a test from an empty folder, so every path is relative as a user types it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@contextlib.contextmanager
def compiles():
    """The functions XLA compiled inside the block (jax's own compile events): bad input is refused before the
    model's init or train step is compiled."""
    seen: list[str] = []

    def listener(event: str, duration: float, **kw) -> None:
        if "backend_compile" in event:
            seen.append(str(kw.get("fun_name", "")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def write(text: str | bytes, name: str = RUN) -> str:
    (Path(name).write_bytes if isinstance(text, bytes) else Path(name).write_text)(text)
    return name


# -- YAML that used to crash or hang the reader -------------------------------------------------


@pytest.mark.parametrize(
    "text, error",
    [
        ("model: &m {name: gpt, x: *m}\n", "run.yaml:1: an alias refers to a value that contains it (recursive alias)"),
        ("model: " + "[" * 5000 + "]" * 5000 + "\n", "run.yaml:1: nested more than 64 levels deep"),
        (
            "mystery: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
            "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
            "run.yaml:1: more than 100,000 values after expanding aliases (an alias bomb?); write the values out",
        ),
        ("? [model, mesh]\n: 1\n", "run.yaml:1: the top level: keys must be names (strings), got a list"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "run.yaml: not UTF-8 text (byte 0 looks like binary data); save it as UTF-8"),
        (
            "model: {name: gpt}\n".encode("utf-16"),
            "run.yaml: not UTF-8 text (byte 0 looks like UTF-16 text); save it as UTF-8",
        ),
        ("model: {name: gpt}\nmodel: {name: mlp}\n", "run.yaml:2: model: key appears twice (first at line 1)"),
    ],
)
def test_unreadable_yaml_is_one_line(in_tmp, run_cli_in_process, text, error):
    write(text)
    with compiles() as compiled:
        assert one_line(run_cli_in_process("check", RUN)) == error
    assert compiled == [] and sorted(p.name for p in Path().iterdir()) == [RUN]  # refused at the file: nothing built


def test_yaml_12_numbers_merge_keys_and_every_error_at_once(in_tmp, run_cli_in_process, base_config):
    write(base_config + "optimizer: {lr: 3e-3}\n")
    r = run_cli_in_process("config", "show", RUN)
    assert r.returncode == 0, r.stderr
    assert "  lr: 0.003\n" in r.stdout  # YAML 1.2: a float, not a string
    write(base_config + "small: &small {seq_len: 16, batch_size: 8}\ntrain:\n  <<: *small\n  steps: 3\n")
    r = run_cli_in_process("check", RUN)
    assert one_line(r).startswith("run.yaml:11: small: unknown key")  # the merge itself reads fine
    write(base_config + "train:\n  <<: {seq_len: 16, batch_size: 8}\n  steps: 3\n")
    r = run_cli_in_process("config", "show", RUN)
    assert r.returncode == 0 and "  seq_len: 16\n" in r.stdout and "  steps: 3\n" in r.stdout
    write(base_config + "train: {steps: 0, batch_sise: 8}\noptimizer: {b1: 1.5}\n")
    r = run_cli_in_process("check", RUN)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: run.yaml:11: train.steps: must be >= 1, got 0",
        "error: run.yaml:11: train.batch_sise: unknown key (valid: steps, batch_size, seq_len, grad_accum, "
        "microbatches, pipeline_repeats, log_every, eval_every, eval_batches, tracker, seed, loss, step, inputs, rngs, "
        "on_nonfinite, trainable, measure_defaults, max_skipped_steps, offload, offload_update); "
        "did you mean 'batch_size'?",
        "error: run.yaml:12: optimizer.b1: must be < 1, got 1.5",
    ]


# -- values out of range, model options ----------------------------------------------------------


@pytest.mark.parametrize(
    "edit, error",
    [
        (("embed: 64", "embed: big"), "run.yaml:3: model.embed: expected int, got str 'big'"),
        (("heads: 4", "heads: 0"), "run.yaml:4: model.heads: heads must be a positive integer, got 0"),
        (
            ("heads: 4", "heads: 4\n  kv_heads: 3"),
            "run.yaml:5: model.kv_heads: heads (4) must be a multiple of kv_heads (3)",
        ),
        (("embed: 64", "embed: 66"), "run.yaml:4: model.heads: embed (66) must be a multiple of heads (4)"),
        (
            ("embed: 64", "embed: 20"),
            "run.yaml:3: model.embed: embed / heads = 20 / 4 = 5 must be even: "
            "rotary position embeddings rotate pairs of features",
        ),
        (("layers: 2", "layers: -1"), "run.yaml:6: model.layers: layers must be a positive integer, got -1"),
        (
            ("layers: 2", "layers: 2\n  remat: ful"),
            "run.yaml:7: model.remat: remat must be one of none, full, dots, dots_no_batch, offload, got 'ful'; "
            "did you mean 'full'?",
        ),
        (
            ("layers: 2", "layers: 2\n  dtype: bf16"),
            "run.yaml:7: model.dtype: dtype must be a floating-point dtype "
            "(float32, bfloat16, float16, float64), got 'bf16'; did you mean 'bfloat16'?",
        ),
        (
            ("layers: 2", "layers: 2\n  moe: {experts: 8, top_k: 9}"),
            "run.yaml:7: model.moe: moe needs experts >= 1 and 1 <= top_k <= experts, got experts 8, top_k 9",
        ),
        (
            ("{data: 1, fsdp: -1, tensor: 1}", "{stage: 2, data: 1, fsdp: -1}"),
            "run.yaml:8: mesh.shape.stage: the mesh has a 'stage' axis of size 2 but the rules do not put 'layers' "
            "on it; "
            "add the rule [layers, stage] (presets pp, pp_fsdp)",
        ),
        (("devices: 8", "devices: 0"), "run.yaml:9: mesh.devices: must be >= 1, got 0"),
        (
            ("rules: fsdp", "rules: fsdp\ncheckpoint: {every: -2}"),
            "run.yaml:11: checkpoint.every: must be >= 0, got -2",
        ),
        (
            ("rules: fsdp", "rules: fsdp\ntrain: {batch_size: 12}"),
            "run.yaml:11: train.batch_size: batch_size 12 is not divisible by the batch mesh axes ('data', 'fsdp') "
            "of size 8; "
            "use a multiple of 8",
        ),
        (
            ("{data: 1, fsdp: -1, tensor: 1}", "{data: 3, fsdp: 2}"),
            "run.yaml:8: mesh.shape: mesh {data: 3, fsdp: 2} needs 6 devices, but there are 8; change a size or use "
            "-1 for "
            "one axis",
        ),
    ],
)
def test_bad_values_name_their_key(in_tmp, run_cli_in_process, base_config, edit, error):
    write(base_config.replace(*edit))
    assert one_line(run_cli_in_process("check", RUN)) == error


# -- CLI arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, error",
    [
        (["--devices", "0"], "--devices must be a positive number of devices, got 0"),
        (["--devices", "-4"], "--devices must be a positive number of devices, got -4"),
        (["--set", "model.name.x=1"], "--set model.name.x=1: model.name is 'gpt' (str), not a mapping with keys"),
        (["--set", "train.steps.max=3"], "--set train.steps.max=3: train.steps is 5 (int), not a mapping with keys"),
        (["--set", "train.steps=x"], "run.yaml (--set train.steps=x): train.steps: expected int, got str 'x'"),
    ],
)
def test_bad_arguments_name_the_flag(in_tmp, run_cli_in_process, base_config, args, error):
    write(base_config + "train: {steps: 5}\n")
    assert one_line(run_cli_in_process("check", RUN, *args)) == error


def test_trackers_name_their_key_and_the_package_to_install(in_tmp, run_cli_in_process, base_config, monkeypatch):
    write(base_config + "train: {tracker: [jsonl, tensorbord]}\n")
    assert one_line(run_cli_in_process("check", RUN)) == (
        "run.yaml:11: train.tracker[1]: must be one of jsonl, tensorboard, wandb, got 'tensorbord'; "
        "did you mean 'tensorboard'?"
    )
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    write(base_config + "train: {tracker: [jsonl, wandb]}\n")
    assert one_line(run_cli_in_process("train", RUN)) == (
        "run.yaml:11: train.tracker: tracker 'wandb' needs the wandb package, which is not installed: "
        "pip install 'partitioning[wandb]' (or leave wandb out of train.tracker)"
    )
    assert not Path("runs").exists()
    write(base_config)
    assert one_line(run_cli_in_process("train", RUN, "--peak-tflops", "0")) == (
        "--peak-tflops must be a positive number of TFLOP/s, got 0"
    )


def test_huge_device_counts_answer_at_once(in_tmp, run_cli_in_process, base_config):
    write(base_config)
    with compiles() as compiled:
        error = one_line(run_cli_in_process("check", RUN, "--devices", "100000"))
    assert error.startswith("run.yaml:10: rules: params/")
    assert "is not divisible by mesh axes ('fsdp',) of size 100000" in error
    # priced from shapes: no device simulated, neither the init nor the step compiled, nothing written
    assert not [f for f in compiled if "step" in f or "init" in f], compiled
    assert jax.device_count() == 8 and sorted(p.name for p in Path().iterdir()) == [RUN]
    # train needs the devices: more than the CPU can simulate is one line, not a hang.
    assert one_line(run_cli_in_process("train", RUN, "--devices", "100000")) == (
        "--devices: 100,000 devices: the CPU simulates at most 2,048; `partitioning plan` and `partitioning check` "
        "price bigger meshes from shapes alone"
    )


def test_usage_errors_are_one_line_with_a_pointer_to_help(run_cli_subprocess):
    r = run_cli_subprocess("plan")
    assert one_line(r) == "the following arguments are required: config; see 'partitioning plan --help'"
    r = run_cli_subprocess("trian", "x.yaml")
    assert "did you mean 'train'?; see 'partitioning --help'" in one_line(r)


def test_distributed_without_a_cluster_is_one_line(in_tmp, run_cli_subprocess, base_config):
    write(base_config)
    r = run_cli_subprocess("train", RUN, "--distributed", cwd=in_tmp)
    assert one_line(r).startswith("--distributed: no cluster to join was detected")


def test_a_closed_pipe_is_a_quiet_exit(in_tmp):
    import subprocess
    import sys

    out = subprocess.run(
        f"{sys.executable} -m partitioning config schema | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout == '{\n "$defs"' and out.stderr == ""


@pytest.mark.parametrize("argv", [["config", "schema"], ["rules", "explain", RUN]])
def test_a_pipe_closed_before_the_output_is_exit_0_without_a_traceback(in_tmp, base_config, argv):
    """Plain prints and rich tables alike (rich alone would exit 1)."""
    import subprocess
    import sys

    write(base_config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "partitioning", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err, err


# -- paths and the disk -----------------------------------------------------------------------------


def test_run_dir_or_checkpoint_dir_that_is_a_file(in_tmp, run_cli_in_process, base_config):
    Path("taken").write_text("not a folder")
    write(base_config + "run_dir: taken\n")
    assert one_line(run_cli_in_process("check", RUN)) == "run.yaml:11: run_dir: taken is a file, not a folder"
    write(base_config + "checkpoint: {dir: taken}\n")
    assert one_line(run_cli_in_process("train", RUN)) == "run.yaml:11: checkpoint.dir: taken is a file, not a folder"
    assert not Path("runs").exists()  # refused before anything was written


def test_data_that_is_missing_empty_or_too_small(in_tmp, run_cli_in_process, base_config):
    write(base_config + "data: {path: nope.txt}\n")
    assert one_line(run_cli_in_process("check", RUN)) == "run.yaml:11: data.path: 'nope.txt': no such file or folder"
    Path("tiny.txt").write_text("print('hi')\n" * 3)
    write(base_config + "data: {path: tiny.txt}\n")
    error = one_line(run_cli_in_process("check", RUN))
    assert error.startswith("run.yaml:11: data.path: tiny.txt (train): ") and "fewer than the batch size 32" in error
    Path("empty").mkdir()
    write(base_config + "data: {path: empty}\n")
    assert one_line(run_cli_in_process("check", RUN)) == "run.yaml:11: data.path: 'empty': folder holds no text files"


def test_plan_png_into_an_unwritable_path(in_tmp, run_cli_in_process, base_config):
    write(base_config)
    error = one_line(run_cli_in_process("plan", RUN, "--no-compile", "--png", "/proc/no/plan.png"))
    assert error.startswith("/proc/no/plan.png: cannot write the PNG: ")


def test_memory_budget_refuses_with_the_numbers_and_the_largest_consumers(in_tmp, run_cli_in_process, base_config):
    write(base_config.replace("devices: 8", "devices: 8\n  device_memory: 64KiB"))
    error = one_line(run_cli_in_process("check", RUN))
    assert error.startswith("run.yaml:10: mesh.device_memory: this layout needs ")
    assert "(compiled), more than the budget of 64.00 KiB; largest: temporaries (activations, XLA scratch) " in error
    assert error.count("(+grad, optimizer)") == 2  # the top three: the temporaries and two parameters
    assert error.endswith("shard more (fsdp / tensor axes), remat, a smaller batch, or raise mesh.device_memory")
    r = run_cli_in_process("check", RUN, "--set", "mesh.device_memory=16GiB")
    assert r.returncode == 0 and "budget 16.00 GiB" in r.stdout


@pytest.mark.slow  # ~20 s: trains two steps, then refuses a resume
def test_a_resume_that_does_not_fit_changes_nothing(in_tmp, run_cli_in_process, base_config):
    write(base_config + "train: {steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0}\n")
    assert run_cli_in_process("train", RUN, "--no-progress").returncode == 0
    before = {p: p.read_bytes() for p in Path("runs").rglob("*") if p.is_file()}
    write(base_config.replace("embed: 64", "embed: 32") + "train: {steps: 4, batch_size: 8, seq_len: 16}\n")
    error = one_line(run_cli_in_process("train", RUN, "--resume"))
    assert error.startswith("checkpoint ") and "does not fit the model" in error
    assert error.endswith(
        "to start over with this model use --no-resume (the old run is moved to RUN_DIR/previous/) or another run_dir"
    )
    after = {p: p.read_bytes() for p in Path("runs").rglob("*") if p.is_file()}
    assert after == before  # config.yaml, metrics, checkpoints: untouched


def test_base_inheritance_and_its_errors(in_tmp, run_cli_in_process, base_config):
    Path("common.yaml").write_text(base_config + "train: {steps: 7, batch_size: 8}\n")
    write("base: common.yaml\ntrain: {batch_size: 16}\n")
    r = run_cli_in_process("config", "show", RUN)
    assert r.returncode == 0, r.stderr
    assert "  steps: 7\n" in r.stdout and "  batch_size: 16\n" in r.stdout  # inherited, overridden
    Path("common.yaml").write_text(base_config + "train: {steps: -7}\n")
    assert one_line(run_cli_in_process("check", RUN)) == "common.yaml:11: train.steps: must be >= 1, got -7"
    Path("a.yaml").write_text("base: b.yaml\n")
    Path("b.yaml").write_text("base: a.yaml\n")
    assert "'base' files extend each other in a loop" in one_line(run_cli_in_process("check", "a.yaml"))
