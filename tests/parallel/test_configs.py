"""The shipped pipeline configs: configs/pipeline.yaml trains to the quickstart's losses; plan shows the pipeline;
configs/llama3_405b_pp.yaml plans 405B in stages."""

import json

import pytest

SHORT = [
    "--set",
    "train.steps=2",
    "--set",
    "train.batch_size=16",
    "--set",
    "train.seq_len=32",
    "--set",
    "train.eval_batches=0",
    "--set",
    "train.log_every=1",
    "--no-progress",
]


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_pipeline_config_trains_to_the_quickstarts_losses(repo, tmp_path, run_cli_in_process):
    for name in ("pipeline", "quickstart"):
        r = run_cli_in_process(
            "train",
            repo / "configs" / f"{name}.yaml",
            *SHORT,
            "--set",
            f"run_dir={tmp_path / name}",
            "--set",
            "train.microbatches=4",
        )
        assert r.returncode == 0, r.stderr
    pipe, quick = _losses(tmp_path / "pipeline"), _losses(tmp_path / "quickstart")
    assert len(pipe) == 2 and pipe == pytest.approx(quick, rel=1e-4)


def test_plan_of_the_pipeline_config(repo, tmp_path, run_cli_in_process):
    r = run_cli_in_process(
        "plan",
        repo / "configs" / "pipeline.yaml",
        "--set",
        "train.batch_size=16",
        "--set",
        "train.seq_len=32",
        "--json",
        tmp_path / "p.json",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "p.json").read_text())
    p = j["parallel"]["pipeline"]
    assert (p["stages"], p["microbatches"], p["layers_per_stage"]) == (4, 8, 1)
    assert p["bubble"] == pytest.approx(3 / 11)
    # The analytic shifts are what the compiled step sends over `stage`.
    compiled = j["compiled"]["collectives_by_axis"]["stage"]["collective-permute"]["bytes"]
    assert compiled == p["collective_permute_bytes"] == 2 * 11 * (16 // 8 // 2) * 32 * 128 * 4
    assert j["axes"]["stage"]["splits"] == ["layers"]
    assert "pipeline: 4 layers in 4 stages of 1, 8 micro-batches of 2 rows: bubble (S-1)/(M+S-1) = 27.3%" in r.stdout


def test_the_405b_pipeline_config_plans(repo, tmp_path, run_cli_in_process):
    r = run_cli_in_process(
        "plan", repo / "configs" / "llama3_405b_pp.yaml", "--no-compile", "--json", tmp_path / "p.json"
    )
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "p.json").read_text())
    assert j["parameters"] == 405_853_388_800 and j["devices"] == 6144
    assert j["mesh"] == {"stage": 6, "data": 4, "fsdp": 32, "tensor": 8}
    p = j["parallel"]["pipeline"]
    assert (p["stages"], p["layers_per_stage"], p["microbatches"]) == (6, 21, 24)
    assert p["bubble"] == pytest.approx(5 / 29)
    # bf16 activations of one micro-batch on a device: 128 rows / (data 4 x fsdp 32) x 2048 x 16384.
    assert p["activation_bytes"] == 1 * 2048 * 16384 * 2
    q = next(leaf for leaf in j["leaves"] if leaf["path"] == "params/blocks/attn/q")
    assert q["spec"] == "P('stage', 'fsdp', 'tensor', None)"
    assert j["axes"]["stage"]["splits"] == ["layers"] and j["errors"] == []


# -- configs/moe.yaml -------------------------------------------------------------------------------


@pytest.mark.slow
def test_moe_config_trains_with_the_losses_of_the_same_model_without_expert_parallelism(
    repo, tmp_path, run_cli_in_process
):
    cfg = repo / "configs" / "moe.yaml"
    fsdp = ["--set", "rules=fsdp", "--set", "mesh.shape={data: 1, fsdp: -1}"]
    for name, extra in (("ep", []), ("fsdp", fsdp)):
        r = run_cli_in_process(
            "train", cfg, *SHORT, "--set", "train.steps=3", "--set", f"run_dir={tmp_path / name}", *extra
        )
        assert r.returncode == 0, r.stderr
    rows = {
        n: [json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("ep", "fsdp")
    }
    assert [r["loss"] for r in rows["ep"]] == pytest.approx([r["loss"] for r in rows["fsdp"]], rel=1e-4)
    # The router's load-balancing loss is reported: 0.01 x 4 layers x (1 when balanced, up to 8).
    aux = [r["moe_aux_loss"] for r in rows["ep"]]
    assert len(aux) == 3 and all(0.04 <= a < 0.08 for a in aux)
    assert aux == pytest.approx([r["moe_aux_loss"] for r in rows["fsdp"]], rel=1e-4)


def test_plan_of_the_moe_config(repo, tmp_path, run_cli_in_process):
    r = run_cli_in_process(
        "plan",
        repo / "configs" / "moe.yaml",
        "--set",
        "train.batch_size=16",
        "--set",
        "train.seq_len=32",
        "--json",
        tmp_path / "p.json",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "p.json").read_text())
    e = j["parallel"]["experts"]
    # 32 tokens of a sequence, top-2 of 8 experts, capacity factor 1.25: ceil(1.25 * 32 * 2 / 8) = 10 slots.
    assert (e["experts"], e["top_k"], e["capacity"], e["expert_shards"], e["layers"]) == (8, 2, 10, 4, 4)
    # The (sequences, experts, capacity, embed) buffer of one device: 16 / 8 sequences x 8 x 10 x 128 floats,
    # sent and brought back forward and backward in each of the 4 layers.
    assert e["all_to_all_count"] == 16 and e["all_to_all_bytes"] == 16 * (2 * 8 * 10 * 128 * 4)
    # The analytic all-to-all is what the compiled step runs over `expert`, and nothing else runs one.
    compiled = j["compiled"]["collectives_by_axis"]
    assert compiled["expert"]["all-to-all"] == {"count": e["all_to_all_count"], "bytes": e["all_to_all_bytes"]}
    assert sum(v["all-to-all"]["count"] for k, v in compiled.items() if k != "expert") == 0
    # Each device holds 2 of the 8 experts, split along embed over fsdp.
    # `expert` splits the experts and, outside the expert layers, is one more FSDP axis (embed over fsdp x expert).
    assert j["axes"]["expert"]["splits"] == ["embed", "expert"] and j["axes"]["fsdp"]["splits"] == ["embed"]
    assert j["totals"]["total"]["per_device"] == pytest.approx(j["totals"]["total"]["ideal"], rel=1e-5)
    wi = next(leaf for leaf in j["leaves"] if leaf["path"] == "params/blocks/mlp/wi_0")
    assert wi["spec"] == "P(None, 'expert', 'fsdp', None)"
    assert (
        "experts: 8 (top-2, capacity 10) over 4 shard(s) in 4 layers: all-to-all 16x 1.25 MiB per step and "
        "device (analytic); compiled over `expert`: 16x 1.25 MiB"
    ) in " ".join(r.stdout.split())
