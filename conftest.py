"""Shared by the test suite and the docstring examples (``--doctest-modules``).

Everything runs on the CPU with 8 simulated devices, set here before jax
starts. Docstring examples see the names every example in the documentation
assumes — ``pt``, ``jax``, ``jnp``, ``nn``, ``np`` — and nothing else: an
example defines what else it uses, so it can be pasted after::

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import partitioning as pt

    pt.simulate_devices(8)
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# The tests' own programs are tiny and run a few steps: compiling them is most of their time, and LLVM at -O0
# compiles them in two thirds of it (steps run about 2x slower; the numbers are the same). Only this process
# and its workers: the CLI subprocesses and notebooks the tests start get no XLA_FLAGS, so they run as users'.
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# One XLA compilation cache for the whole run: the suite compiles the same tiny models again and again, in its
# workers and in the CLI subprocesses it starts (they inherit the variable). Made by the first process (pytest, or
# its xdist controller, before it starts the workers), removed when that process ends; the 0s cache everything.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _xla_cache = tempfile.mkdtemp(prefix="partitioning-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _xla_cache
    # The measured CPU profile (remat: auto, tune --hardware cpu) too: measured once per run, not read from
    # whatever an earlier run on this machine left in ~/.cache/partitioning.
    os.environ.setdefault("PARTITIONING_CACHE", os.path.join(_xla_cache, "profiles"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    atexit.register(shutil.rmtree, _xla_cache, ignore_errors=True)
# pytest-xdist workers start with COLUMNS=80 and LINES=24 in their environment: the CLI (and every CLI
# subprocess) would draw 80-column tables and fold the cells tests read. Tests that want a width set it.
for _k in ("COLUMNS", "LINES"):
    os.environ.pop(_k, None)

import importlib
from pathlib import Path

import pytest

# pytest has no public name for its doctest collector; subclassing it is the way to change how a file is imported.
from _pytest.doctest import DoctestModule

REPO = Path(__file__).resolve().parent
MODELS = REPO / "models"


class InstalledModelsModule(DoctestModule):
    """A file of the top-level ``models/`` folder, imported under its installed name ``partitioning.models.*``.

    (Imported by path, it would become a second, top-level ``models`` package.)
    """

    def _getobj(self):
        parts = self.path.relative_to(MODELS).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        return importlib.import_module(".".join(("partitioning", "models", *parts)))


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    collected = yield
    if MODELS in file_path.parents:
        return [
            InstalledModelsModule.from_parent(parent, path=file_path) if isinstance(c, DoctestModule) else c
            for c in collected
        ]
    if REPO / "tests" in file_path.parents:
        # Test files and the scripts beside them (subprocess workers) hold no docstring examples.
        return [c for c in collected if not isinstance(c, DoctestModule)]
    return collected


@pytest.fixture(scope="session")
def _doctest_names(doctest_namespace):
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    import partitioning as pt

    doctest_namespace.update(pt=pt, jax=jax, jnp=jnp, nn=nn, np=np)


@pytest.fixture(autouse=True)
def _pasteable(request, _doctest_names):
    """A docstring example sees only those names, not its module's: pasted into a session, it runs the same."""
    dtest = getattr(request.node, "dtest", None)
    if dtest is not None:
        name = dtest.globs.get("__name__")
        dtest.globs.clear()
        dtest.globs["__name__"] = name  # classes an example defines get a __module__
