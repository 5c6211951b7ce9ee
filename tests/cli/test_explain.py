"""`partitioning rules explain` (partitioning.cli.explain), in real subprocesses."""


def test_rules_explain(repo, run_cli_subprocess):
    r = run_cli_subprocess("rules", "explain", "configs/quickstart.yaml", cwd=repo)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "params/blocks/mlp/wi_0" in out
    assert "rule 1 ['embed', 'fsdp']" in out
    assert "skipped rule 3 ('mlp', 'fsdp'): mesh axis 'fsdp' already used by dim 1" in out
    assert "logical names no rule mentions (unsharded): heads, kv, kv_heads, layers" in out


def test_rules_explain_reports_rules_that_never_fire(write, run_cli_subprocess, base_config):
    path = write("run.yaml", base_config.replace("rules: fsdp", "rules:\n  - [embed, fsdp]\n  - [expert, tensor]\n"))
    r = run_cli_subprocess("rules", "explain", str(path))
    assert r.returncode == 0, r.stderr
    assert "rules that never fire on this model: rule 1 ['expert', 'tensor']" in r.stdout
