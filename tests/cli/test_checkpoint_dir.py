"""`checkpoint.dir` naming a folder of the user's own files is refused by the one pre-flight (check and train
alike, the same line, file:line of the key), before anything is written (partitioning.config.rundir)."""

from pathlib import Path

import pytest


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    Path("mine/data").mkdir(parents=True)
    Path("mine/notes.txt").write_text("my own notes")
    Path("mine/data/corpus.txt").write_text("hello")
    Path("home/checkpoints").mkdir(parents=True)
    Path("home/checkpoints/plot.png").write_bytes(b"\x89PNG")
    return tmp_path


@pytest.mark.parametrize(
    "extra, where, folder, held",
    [
        ("run_dir: runs/r\ncheckpoint: {dir: mine}\n", "run.yaml:15: checkpoint.dir", "mine", "data, notes.txt"),
        ("run_dir: home\n", "run.yaml: run_dir", "home/checkpoints", "plot.png"),  # the default, under run_dir
    ],
    ids=["checkpoint.dir", "run_dir/checkpoints"],
)
def test_a_folder_of_other_files_is_refused_by_check_and_train_with_nothing_written(
    here, small_config, run_cli_in_process, one_line_error, extra, where, folder, held
):
    Path("run.yaml").write_text(small_config.replace("vocab_size: 64", "vocab_size: 256") + extra)
    before = snapshot(here)
    checked = one_line_error(run_cli_in_process("check", "run.yaml"))
    trained = one_line_error(run_cli_in_process("train", "run.yaml", "--no-progress"))
    assert (
        checked
        == trained
        == (
            f"error: {where}: {folder} is not a checkpoints folder: it holds {held}; a run saves (and prunes) steps "
            "there: name a new or empty folder, or one with this run's checkpoints"
        )
    )
    assert snapshot(here) == before  # no run dir, no lock beside the folder, the user's files untouched
