"""Tests run on the CPU with 8 simulated devices, set before jax starts (by the repository's conftest.py).

Fixtures used across test folders live here: paths and files, the base run
config, the two ways of running the CLI, a Flax module with annotated
weights, and the checkpoint helpers (the real Trainer's state on any mesh).
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.boxes import is_box
from partitioning.checkpoint import CheckpointManager, abstract_target
from partitioning.models import GPT
from partitioning.train import Trainer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def write(tmp_path):
    """Writes a text file under tmp_path and returns its path."""

    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    return _write


# -- the base run config ---------------------------------------------------------------

BASE_CONFIG = """\
model:
  name: gpt
  embed: 64
  heads: 4
  mlp: 128
  layers: 2
mesh:
  shape: {data: 1, fsdp: -1, tensor: 1}
  devices: 8
rules: fsdp
"""


PRESET_MESHES = {
    "dp": {"data": 8},
    "fsdp": {"data": 1, "fsdp": 8},
    "tp": {"data": 2, "tensor": 4},
    "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2},
    "seq": {"data": 1, "fsdp": 4, "tensor": 2},
}


@pytest.fixture(scope="session")
def meshes() -> dict:
    """The five presets, each with an 8-device mesh shape it fits."""
    return PRESET_MESHES


@pytest.fixture(scope="session")
def base_config() -> str:
    """A small valid run config (YAML text); tests edit it to make the case they need."""
    return BASE_CONFIG


# -- running the CLI ---------------------------------------------------------------------


class CliResult(NamedTuple):
    """What an in-process CLI run gives: the same fields as a finished subprocess."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def run_cli_subprocess():
    """run_cli_subprocess(*args, cwd=REPO): ``python -m partitioning ARGS`` in a real subprocess.

    The subprocess does not inherit the tests' XLA_FLAGS: the CLI decides the
    device count itself. Returns the ``subprocess.CompletedProcess`` (text output).
    """

    def _run(*args, cwd=None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        return subprocess.run(
            [sys.executable, "-m", "partitioning", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            env=env,
            timeout=300,
        )

    return _run


@pytest.fixture
def run_cli_in_process(capsys):
    """run_cli_in_process(*args): ``partitioning.cli.main(ARGS)`` in this process (8 simulated devices).

    Returns a CliResult (returncode, stdout, stderr) holding what that call printed.
    """

    def _run(*args) -> CliResult:
        from partitioning.cli import main

        # The backend is up (8 devices from XLA_FLAGS): the CLI's one-time "simulating 8 CPU devices" line
        # belongs to a fresh process, not to whichever in-process test happens to run first.
        jax.devices()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return _run


# -- a Flax module with annotated weights ---------------------------------------------------


class Dense(nn.Module):
    """One weight annotated ("embed", "mlp") through pt.with_logical_partitioning."""

    features: int

    @nn.compact
    def __call__(self, x):
        w = self.param(
            "w",
            pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
            (x.shape[-1], self.features),
        )
        return x @ w


@pytest.fixture(scope="session")
def dense_module():
    """The Dense module class: ``dense_module(features)``, weight (in, features) named ("embed", "mlp")."""
    return Dense


# -- checkpoints of the real Trainer's state ---------------------------------------------------


def mesh_of(shape, n=None):
    """A mesh of ``shape`` on the first ``n`` devices (all devices when n is None)."""
    return pt.make_mesh(shape, devices=jax.devices()[:n] if n else None)


def _strip(tree):
    return jax.tree.map(lambda v: v.value if is_box(v) else v, tree, is_leaf=is_box)


class CheckpointSetup:
    """The real Trainer's TrainState layout for a model, on any mesh and rules.

    ``state`` fills it with random values placed directly in their shards
    (no compile, so the many layouts in the tests stay fast); ``target`` is what a
    resuming run restores into.
    """

    def __init__(self, model=None, tx=None):
        self.model = model or GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2)
        self.tx = tx or optax.adamw(1e-3)
        self.abstract = self.trainer(mesh_of({"data": 1, "fsdp": 1}, 1), "fsdp").abstract_state

    def trainer(self, m, rules, **kw):
        return Trainer(self.model, self.tx, m, rules, batch_size=8, seq_len=8, **kw)

    def state(self, m, rules, seed=0, step=7):
        tr = self.trainer(m, rules)
        rng = np.random.default_rng(seed)

        def value(a, s):
            if a.shape == ():  # the step and optax counts
                return jax.device_put(np.asarray(step, a.dtype), s)
            return jax.device_put(rng.standard_normal(a.shape).astype(a.dtype), s)

        return jax.tree.map(value, _strip(tr.abstract_state), tr.state_shardings)

    def target(self, m, rules, **kw):
        tr = self.trainer(m, rules)
        return abstract_target(tr.abstract_state, shardings=tr.state_shardings, **kw)


def gathered(tree):
    """Host copies of every leaf (tests only: never gather a real state)."""
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_bit_exact(a, b):
    la, lb = gathered(a), gathered(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


# The YAML model section of CheckpointSetup's default GPT.
CKPT_MODEL_YAML = "model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 2}\n"


@pytest.fixture(scope="session")
def ckpt_setup():
    """The CheckpointSetup class: ``ckpt_setup(model=None, tx=None)`` (default: a small GPT, adamw)."""
    return CheckpointSetup


@pytest.fixture(scope="session")
def ckpt_model_yaml() -> str:
    """The ``model:`` line of a run config for CheckpointSetup's default GPT."""
    return CKPT_MODEL_YAML


@pytest.fixture(scope="session", name="mesh_of")
def mesh_of_fixture():
    """mesh_of(shape, n=None): a mesh of ``shape`` on the first ``n`` devices."""
    return mesh_of


@pytest.fixture(scope="session", name="gathered")
def gathered_fixture():
    """gathered(tree): host copies of every leaf."""
    return gathered


@pytest.fixture(scope="session", name="assert_bit_exact")
def assert_bit_exact_fixture():
    """assert_bit_exact(a, b): same leaves, same dtypes, same bits."""
    return assert_bit_exact


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """(CheckpointSetup(), run dir): fsdp checkpoints at steps 3 and 6 (with metadata) and one unfinished save."""
    s = CheckpointSetup()
    root = tmp_path_factory.mktemp("run")
    m = mesh_of({"data": 1, "fsdp": 8})
    tr = s.trainer(m, "fsdp")
    with CheckpointManager(
        root / "checkpoints",
        every=3,
        rules="fsdp",
        model_name="gpt",
        abstract=tr.abstract_state,
        config={"model": {"name": "gpt"}},
    ) as mngr:
        mngr.save(3, s.state(m, "fsdp", step=3), metrics={"loss": 2.5})
        mngr.save(6, s.state(m, "fsdp", step=6), metrics={"loss": 2.25, "eval_loss": 2.75})
    (root / "checkpoints" / "9.orbax-checkpoint-tmp-1234").mkdir()
    return s, root


@pytest.fixture
def free_port():
    """free_port(): a TCP port on 127.0.0.1 that is free now (for a jax.distributed coordinator)."""
    import socket

    def _port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    return _port


# -- order: long modules first -------------------------------------------------------------------

# Under `pytest -n 2` workers take tests in collection order; a long module collected last runs alone
# while the other worker idles. Modules with long tests go first (each module's tests stay together
# and in order, so module-scoped fixtures are built once).
LONG_MODULES = ("test_notebooks.py", "test_multihost.py", "test_multihost_data.py", "parallel/", "byom/")


def pytest_collection_modifyitems(config, items):
    def long(item) -> bool:
        path = item.nodeid.split("::")[0]
        return any(m in path for m in LONG_MODULES) or item.get_closest_marker("slow") is not None

    first = {item.nodeid.split("::")[0] for item in items if long(item)}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in first)
