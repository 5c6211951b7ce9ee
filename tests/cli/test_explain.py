"""`partitioning rules explain` (partitioning.cli.explain), in real subprocesses."""


def test_rules_explain(repo, run_cli_subprocess):
    r = run_cli_subprocess("rules", "explain", "configs/quickstart.yaml", cwd=repo)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "params/blocks/mlp/wi_0" in out
    assert "rule 1 [embed, fsdp]" in out
    assert "skipped rule 3 [mlp, fsdp]: mesh axis 'fsdp' already used by dim 1" in out
    # Activations count too: `length` is only ever an activation name.
    assert "logical names no rule mentions (unsharded): heads, kv, kv_heads, layers, length\n" in out
    # The compute layout: FSDP params are used gathered over the batch axes; the table shows the compute spec.
    assert (
        "compute layout: parameters are gathered over the batch axes (data, fsdp; from rule 0 "
        "[batch, [data, fsdp]]) before use"
    ) in out
    # Every rule printed as the YAML tables write it, none as a Python tuple or a quoted list.
    assert not [n for n in ("rule 0 (", "['", "('embed', ") if n in out]
    # The quickstart's own table is clean: fsdp's fallbacks ([vocab, fsdp], [mlp, fsdp]) found every array split.
    assert "never fire" not in out
    row = next(line for line in out.splitlines() if "params/blocks/mlp/wi_0" in line)
    assert row.rstrip(" │").endswith("P(None, None, None)")


def test_rules_explain_with_declared_batch_axes(write, run_cli_subprocess, base_config):
    rules = "rules:\n  preset: fsdp_tp\n  batch_axes: [data]\n"
    path = write("run.yaml", base_config.replace("rules: fsdp", rules).replace("tensor: 1", "tensor: 2"))
    r = run_cli_subprocess("rules", "explain", str(path))
    assert r.returncode == 0, r.stderr
    assert "compute layout: parameters are gathered over the batch axes (data; declared (batch_axes))" in r.stdout
    # fsdp no longer splits the batch, so FSDP-sharded weights are computed with as stored.
    row = next(line for line in r.stdout.splitlines() if "params/blocks/mlp/wi_0" in line)
    assert row.rstrip(" │").endswith("P(None, 'fsdp', 'tensor')")


def test_rules_explain_reports_rules_that_never_fire(write, run_cli_subprocess, base_config):
    path = write("run.yaml", base_config.replace("rules: fsdp", "rules:\n  - [embed, fsdp]\n  - [expert, tensor]\n"))
    r = run_cli_subprocess("rules", "explain", str(path))
    assert r.returncode == 0, r.stderr
    assert "rules that never fire on this model: rule 1 [expert, tensor]" in r.stdout
