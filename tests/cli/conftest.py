"""Shared by the CLI tests: a small plannable config, and the one-line error contract for bad input."""

import pytest

SMALL_CONFIG = """\
model:
  name: mlp
  vocab_size: 64
  embed: 32
  mlp: 256
  layers: 2
mesh:
  shape: {data: 1, fsdp: -1, tensor: 1}
  devices: 8
rules: fsdp
train:
  batch_size: 8
  seq_len: 16
"""


@pytest.fixture(scope="session")
def small_config() -> str:
    """A small MLP run config (YAML text) that plans and compiles in seconds."""
    return SMALL_CONFIG


@pytest.fixture(scope="session")
def one_line_error():
    """one_line_error(result): asserts bad input exited 2 with one line on stderr (no traceback); returns the line.

    ``result`` is what run_cli_subprocess or run_cli_in_process returned.
    """

    def _one_line_error(r):
        assert r.returncode == 2, (r.stdout, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("simulating")]
        assert len(lines) == 1, r.stderr
        assert "Traceback" not in r.stderr
        return lines[0]

    return _one_line_error
