"""Every notebook under notebooks/ executes top to bottom (so the tutorials cannot rot)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert any(p.name == "01_quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
    # The notebook sets its own device count before importing jax; don't hand it ours.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    nb = nbformat.read(path, as_version=4)
    # "python3" resolves to this interpreter (jupyter_client swaps `python` for sys.executable).
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code" and c.source.strip())


# The public API: `import partitioning as pt`, the reference models and the CLI entry point.
PUBLIC = {"partitioning", "partitioning.models", "partitioning.cli"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_only_the_public_api(path):
    import ast

    nb = nbformat.read(path, as_version=4)
    used = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        src = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                used |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                used.add(node.module)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pt":
                assert not node.attr.startswith("_"), f"{path.name}: pt.{node.attr} is private"
    private = sorted(m for m in used if m.split(".")[0] == "partitioning" and m not in PUBLIC)
    assert private == [], f"{path.name} imports {private}; use `import partitioning as pt`"
