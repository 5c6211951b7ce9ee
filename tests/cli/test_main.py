"""The command line's entry point (partitioning.cli.main): usage errors, in real subprocesses."""

import pytest


@pytest.mark.parametrize("argv", [["nope"], ["check"]])
def test_usage_errors_exit_2(argv, run_cli_subprocess):
    r = run_cli_subprocess(*argv)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].endswith("see 'partitioning --help'") or lines[0].endswith("see 'partitioning check --help'")
