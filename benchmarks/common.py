"""What the benchmarks share: simulated devices before anything uses jax, and the JSON report.

Example::

    setup(8)                       # the repo importable, 8 simulated CPU devices
    ...
    report(results, args.json)     # printed, and written to --json when given
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def setup(devices: int) -> None:
    """The repo importable without an install, and ``devices`` simulated CPU devices (``pt.simulate_devices``)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(REPO))
    import partitioning as pt

    pt.simulate_devices(devices)


def report(results: dict[str, Any], path: str | None) -> None:
    """Prints ``results`` as JSON and writes the same text to ``path`` (``--json``) when given."""
    text = json.dumps(results, indent=2)
    print(text)
    if path:
        Path(path).write_text(text)
