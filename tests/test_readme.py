"""The README's five-minute tour runs as written, and its printed output is true."""

import re
import subprocess
import sys


def test_tour_code_blocks_run(repo, tmp_path):
    text = (repo / "README.md").read_text()
    tour = text.split("## Five-minute tour", 1)[1].split("### 4.", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", tour, flags=re.S)
    assert len(blocks) == 3
    script = "\n".join(blocks)
    script += "\nassert y.shape == (8, 64)\nprint('SPEC', params['params']['wi'].value.sharding.spec)\n"
    (tmp_path / "tour.py").write_text(script)
    r = subprocess.run([sys.executable, str(tmp_path / "tour.py")], capture_output=True, text=True,
                       timeout=300, cwd=repo)
    assert r.returncode == 0, r.stderr[-3000:]
    # The comment in the README shows what the loop prints for params/wi.
    expected = re.search(r"# (params/wi .*)", tour).group(1)
    assert expected in r.stdout
    assert "SPEC P('fsdp', 'tensor')" in r.stdout
