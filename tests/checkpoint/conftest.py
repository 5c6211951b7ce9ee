"""Shared by the checkpoint tests: the small GPT's state layout, and a pristine checkpoint to damage."""

import shutil

import pytest

from partitioning.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def gpt(ckpt_setup):
    """The checkpoint setup of the default small GPT (adamw)."""
    return ckpt_setup()


@pytest.fixture(scope="module")
def saved(tmp_path_factory, ckpt_setup, mesh_of):
    """A pristine fsdp checkpoint of the small GPT; tests copy it before damaging it."""
    s = ckpt_setup()
    root = tmp_path_factory.mktemp("pristine")
    save_checkpoint(root, 7, s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    return s, root


@pytest.fixture
def saved_copy(saved, tmp_path):
    """(setup, step dir): a copy of the pristine checkpoint under tmp_path, free to damage."""
    s, root = saved
    shutil.copytree(root, tmp_path / "ck")
    return s, tmp_path / "ck" / "7"
