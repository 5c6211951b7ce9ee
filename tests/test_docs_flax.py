"""docs/coming-from-flax.md: every Python block runs as written, each on its own."""

import re
import textwrap


def test_coming_from_flax_examples_run(repo, capsys):
    text = (repo / "docs" / "coming-from-flax.md").read_text()
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]
    assert len(blocks) >= 6
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/coming-from-flax.md block {i}", "exec"), {})
    assert "activation dimension 1 has logical name 'hidden' but no rule mentions it" in capsys.readouterr().out
