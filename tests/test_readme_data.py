"""The Data guide (docs/data.md): its pre-tokenizing example writes .npy files that its config accepts."""

import os
import re
import subprocess
import sys

STUB_TIKTOKEN = """
class _Encoding:
    eot_token = 50256

    def encode_ordinary(self, text):
        return [b + 200 * (i % 200) for i, b in enumerate(text.encode())]   # ids up to 40,055


def get_encoding(name):
    assert name == "gpt2"
    return _Encoding()
"""


def test_pretokenizing_example_makes_data_the_config_accepts(repo, tmp_path):
    section = (repo / "docs" / "data.md").read_text()
    python = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    config = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0]
    (tmp_path / "stub").mkdir()
    (tmp_path / "stub" / "tiktoken.py").write_text(STUB_TIKTOKEN)  # the real one downloads its BPE file
    (tmp_path / "my_text").mkdir()
    for i in range(4):
        (tmp_path / "my_text" / f"doc{i}.txt").write_text(f"document {i}: " + "some words here. " * 300)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(
        [sys.executable, "-c", python],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONPATH": str(tmp_path / "stub")},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (tmp_path / "run.yaml").write_text(
        config + "mesh: {shape: {data: 1, fsdp: -1}, devices: 8}\nrules: fsdp\ntrain: {batch_size: 8, seq_len: 16}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "partitioning", "check", "run.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(repo)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("OK: run.yaml: model gpt")
