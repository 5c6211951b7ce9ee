"""The command line's entry point (partitioning.cli.main): usage errors, in real subprocesses."""

import pytest


@pytest.mark.parametrize("argv", [["nope"], ["check"]])
def test_usage_errors_exit_2(argv, run_cli_subprocess):
    r = run_cli_subprocess(*argv)
    assert r.returncode == 2
    assert "usage: partitioning" in r.stderr
