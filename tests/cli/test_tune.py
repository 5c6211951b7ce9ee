"""`partitioning tune` (partitioning.cli.tune): the ranked table, JSON, PNG, the best layout as a runnable
config, the one-line errors, and 70B on 2048 devices."""

import json

import pytest

from partitioning.config.load import load_config

GPT_CONFIG = """\
model: {name: gpt, vocab_size: 256, embed: 64, heads: 4, mlp: 128, layers: 2}
mesh:
  shape: {data: 1, fsdp: -1, tensor: 1}
  devices: 8
rules: fsdp
train:
  batch_size: 16
  seq_len: 32
  steps: 2
  eval_batches: 0
"""


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(exit code, stdout, stderr, folder) of one in-process tune of the small GPT on 8 devices (h100)."""
    import contextlib
    import io

    from partitioning.cli import main

    d = tmp_path_factory.mktemp("tune")
    (d / "gpt.yaml").write_text(GPT_CONFIG)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [
                "tune",
                str(d / "gpt.yaml"),
                "--hardware",
                "h100",
                "--compile",
                "1",
                "--top",
                "5",
                "--json",
                str(d / "tune.json"),
                "--png",
                str(d / "tune.png"),
                "--out",
                str(d / "best.yaml"),
            ]
        )
    return code, out.getvalue(), err.getvalue(), d


def test_tune_ranks_explains_and_writes(tuned):
    code, out, err, d = tuned
    assert code == 0, err
    j = json.loads((d / "tune.json").read_text())
    search = j["search"]
    assert search["devices"] == 8 and search["hardware"]["name"] == "h100"
    assert search["fitting"] == len(search["ranked"]) > 0
    assert all(r["reason"] for r in search["rejected"])
    best = j["best"]
    assert best == search["ranked"][0] and best["fits"] and best["compiled"]["status"] == "ok"
    assert best["peak_source"] == "compiled" and best["peak_bytes"] <= search["budget_bytes"]
    est = best["estimate"]
    assert set(est["compute_s"]) == {"fwd", "bwd", "update"} and est["bottleneck"]
    assert est["step_time_s"] == pytest.approx(
        sum(max(est["compute_s"][p], est["comm_s"][p]) for p in ("fwd", "bwd", "update"))
    )
    assert "best: " + best["label"] in out and "why: fwd: compute" in out
    assert (d / "tune.png").stat().st_size > 10_000


def test_the_best_layout_is_a_config(tuned):
    *_, d = tuned
    best = json.loads((d / "tune.json").read_text())["best"]
    cfg = load_config(d / "best.yaml")
    assert cfg.mesh.shape == best["mesh"] and cfg.mesh.devices == 8
    assert cfg.rules.to_list() == best["rules_table"]
    assert cfg.train.grad_accum == best["grad_accum"]
    assert cfg.model_options.get("remat") == best["remat"]
    assert (d / "best.yaml").read_text().startswith("# Written by `partitioning tune")
    assert cfg.run_dir == "runs/best"  # its own: training it never resumes the tuned config's run


def test_every_rule_table_has_its_own_colour_and_marker():
    from partitioning.tune.plot import table_styles

    styles = table_styles([f"t{i}" for i in range(12)])
    assert len(set(styles.values())) == 12 and len({c for c, _ in list(styles.values())[:10]}) == 10
    assert "#7f7f7f" not in {c for c, _ in styles.values()}  # grey is the rejected layouts' colour


@pytest.mark.slow
def test_the_best_layout_trains_on_8_devices(tuned, run_cli_subprocess):
    *_, d = tuned
    r = run_cli_subprocess(
        "train", d / "best.yaml", "--set", f"run_dir={d / 'run'}", "--set", "checkpoint.every=0", cwd=d
    )
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = [json.loads(line) for line in (d / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("step", 0) for m in metrics) == 2


def test_the_cpu_profile_is_measured(write, tmp_path, run_cli_in_process):
    cfg = write("gpt.yaml", GPT_CONFIG)
    code, out, err = run_cli_in_process(
        "tune", cfg, "--hardware", "cpu", "--compile", "1", "--rules", "fsdp", "--json", tmp_path / "t.json"
    )
    assert code == 0, err
    hw = json.loads((tmp_path / "t.json").read_text())["search"]["hardware"]
    assert hw["name"] == "cpu" and hw["measured"] and not hw["overlap"]
    assert (
        hw["peak_flops"] > 1e8
        and hw["alloc_bandwidth"] > 0
        and set(hw["collective_bandwidth"]) == {"all-gather", "reduce-scatter", "all-reduce"}
    )
    assert "device-seconds" in out


def test_nothing_fits_says_which_budget_would(write, tmp_path, run_cli_in_process, one_line_error):
    cfg = write("gpt.yaml", GPT_CONFIG)
    r = run_cli_in_process("tune", cfg, "--device-memory", "64KiB", "--compile", "0", "--out", tmp_path / "b.yaml")
    line = one_line_error(r)
    assert "no layout of 8 devices fits 64.00 KiB per device" in line and "would fit it" in line
    assert not (tmp_path / "b.yaml").exists()


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--hardware", "h10"], "--hardware 'h10': no such profile; choose one of h100, h200"),
        (["--hardware", "missing.yaml"], "--hardware missing.yaml: no such file"),
        (["--device-memory", "lots"], "--device-memory: expected a size such as 80GiB"),
        (["--top", "0"], "--top must be at least 1, got 0"),
        (["--rules", "fsdpp"], "--rules fsdpp:"),
        (["--devices", "0"], "--devices must be a positive number of devices, got 0"),
    ],
)
def test_bad_input_is_one_line(write, run_cli_in_process, one_line_error, args, expected):
    cfg = write("gpt.yaml", GPT_CONFIG)
    assert expected in one_line_error(run_cli_in_process("tune", cfg, "--compile", "0", *args))


def test_a_bad_hardware_file_names_its_line(write, run_cli_in_process, one_line_error):
    cfg = write("gpt.yaml", GPT_CONFIG)
    hw = write("hw.yaml", "name: x\npeak_flops: -1\n")
    r = run_cli_in_process("tune", cfg, "--hardware", hw, "--compile", "0")
    assert r.returncode == 2 and f"{hw}:2: peak_flops: expected a positive number, got -1" in r.stderr


@pytest.mark.slow
def test_llama3_70b_on_2048_v5p_recommends_a_layout_the_compiled_view_confirms(repo, tmp_path, run_cli_subprocess):
    r = run_cli_subprocess(
        "tune",
        "configs/llama3_70b.yaml",
        "--devices",
        2048,
        "--hardware",
        "v5p",
        # Without the pipelined tables: their compiled step holds the bubble, so one compile of a pipelined
        # leader within 1% of the next layout cannot settle the recommendation.
        "--rules",
        "fsdp",
        "tp",
        "fsdp_tp",
        "--json",
        tmp_path / "t.json",
        "--compile",
        "1",
        cwd=repo,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    best = json.loads((tmp_path / "t.json").read_text())["best"]
    assert best["peak_source"] == "compiled" and best["compiled"]["status"] == "ok"
    assert best["compiled"]["memory"]["peak_estimate"] <= 95 * 2**30


def test_pipeline_stages_and_experts_join_the_search(write, tmp_path, run_cli_in_process):
    """A scanned MoE GPT: the pp / pp_fsdp / pp_tp / pp_fsdp_tp and ep tables are priced, with the bubble,
    the stage shifts and the all-to-all as terms; stage counts that do not divide the layers are rejected."""
    cfg = write("moe.yaml", GPT_CONFIG.replace("layers: 2}", "layers: 4, moe: {experts: 4, top_k: 2}}"))
    code, out, err = run_cli_in_process(
        "tune", cfg, "--hardware", "v5p", "--compile", "0", "--top", "3", "--json", tmp_path / "t.json"
    )
    assert code == 0, err
    search = json.loads((tmp_path / "t.json").read_text())["search"]
    results = search["ranked"] + search["rejected"]
    assert {"pp", "pp_fsdp", "pp_tp", "pp_fsdp_tp", "ep"} <= {r["rules"] for r in results}
    assert any(r["reason"] == "stages: 4 stacked layers do not split into 8 stages" for r in search["rejected"])
    staged = next(r for r in search["ranked"] if r["mesh"].get("stage") == 4 and r["microbatches"] == 8)
    assert staged["label"].endswith("M=8")
    est = staged["estimate"]
    kinds = {(c["kind"], tuple(c["axes"])) for c in est["collectives"]}
    assert ("collective-permute", ("stage",)) in kinds
    assert est["other_s"]["pipeline bubble"] == pytest.approx(
        3 / 8 * (est["compute_s"]["fwd"] + est["compute_s"]["bwd"])
    )
    experts = next(r for r in search["ranked"] if r["rules"] == "ep" and r["mesh"].get("expert") == 4)
    assert any(c["kind"] == "all-to-all" and c["axes"] == ["expert"] for c in experts["estimate"]["collectives"])
