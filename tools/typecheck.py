"""Type-checks the package as it is installed: ``partitioning/`` with ``models/`` as ``partitioning.models``.

The reference models live in the repository's top-level ``models/`` folder and are installed as
``partitioning.models`` (setuptools' ``package-dir``). Type checkers don't follow setuptools' editable
finder, so this builds a view of the installed package out of symbolic links (in ``.typecheck/``,
git-ignored, reused so mypy's cache stays warm), runs mypy on it with the configuration in
``pyproject.toml``, and prints every message with the path of the real file.

    python tools/typecheck.py            # what .ci/run runs
    python tools/typecheck.py --pretty   # extra arguments go to mypy
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / ".typecheck"


def stage() -> Path:
    """``.typecheck/partitioning``: a link per entry of ``partitioning/``, and ``models`` -> ``models/``."""
    pkg = STAGE / "partitioning"
    pkg.mkdir(parents=True, exist_ok=True)
    want = {p.name: p for p in (REPO / "partitioning").iterdir() if p.name != "__pycache__"}
    want["models"] = REPO / "models"
    for link in pkg.iterdir():
        if link.name not in want or not link.is_symlink() or link.resolve() != want[link.name].resolve():
            link.unlink()
    for name, target in want.items():
        if not (pkg / name).is_symlink():
            (pkg / name).symlink_to(os.path.relpath(target, pkg))
    return pkg


def real_paths(line: str) -> str:
    """A message about ``.typecheck/partitioning/...`` names the file in the repository."""
    line = line.replace(".typecheck/partitioning/models/", "models/")
    return line.replace(".typecheck/partitioning/", "partitioning/")


def main(argv: list[str]) -> int:
    pkg = stage()
    cmd = [sys.executable, "-m", "mypy", *argv, os.path.relpath(pkg, REPO)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    for stream, text in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        stream.write("".join(real_paths(line) for line in text.splitlines(keepends=True)))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
