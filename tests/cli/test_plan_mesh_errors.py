"""`plan` (and every command that lays out the config's mesh) locates mesh errors at the config's file:line,
as `check` does: a shape whose product does not match the devices, and a rule naming an axis the mesh lacks."""

from pathlib import Path

import pytest

CONFIG = """\
model: {name: mlp, vocab_size: 256, embed: 32, mlp: 256, layers: 2}
mesh:
  shape: {data: 1, fsdp: 3, tensor: 1}
  devices: 8
rules: fsdp
train: {batch_size: 8, seq_len: 16}
"""

CASES = {
    "shape vs devices": (
        CONFIG,
        "run.yaml:3: mesh.shape: mesh {data: 1, fsdp: 3, tensor: 1} needs 3 devices, but there are 8; "
        "change a size or use -1 for one axis",
    ),
    "preset rule, unknown axis": (
        CONFIG.replace("fsdp: 3, tensor: 1", "fsdp: -1, tensr: 1").replace("rules: fsdp", "rules: tp"),
        "run.yaml:5: rules: presets/tp.yaml:12: rules[1]: mesh axis 'tensor' is not a mesh axis "
        "(data, fsdp, tensr); did you mean 'tensr'?",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["plan", "check", "rules explain"])
def test_mesh_errors_name_the_configs_file_and_line(tmp_path, monkeypatch, run_cli_in_process, case, command):
    monkeypatch.chdir(tmp_path)
    text, line = CASES[case]
    Path("run.yaml").write_text(text)
    r = run_cli_in_process(*command.split(), "run.yaml")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert [x for x in r.stderr.splitlines() if x.strip()] == [f"error: {line}"]
