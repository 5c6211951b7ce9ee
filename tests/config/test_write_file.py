"""The run's own files are written whole or not at all; a full disk or a file-size limit names the file
(partitioning.config.rundir.write_file), and a checkpoint's file-size limit is not called a full disk."""

import errno
import resource
from pathlib import Path

import pytest

from partitioning.checkpoint.space import file_too_big_error, is_disk_full, is_file_too_big
from partitioning.config.rundir import write_file
from partitioning.errors import ConfigError


def test_a_file_size_limit_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    Path("run/config.yaml").write_text("old: 1\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))  # `ulimit -f`: Python ignores SIGXFSZ, writes get EFBIG
    try:
        with pytest.raises(ConfigError) as e:
            write_file(Path("run/config.yaml"), "x: 1\n" * 100)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert (
        str(e.value) == "run/config.yaml: cannot write it: file too large (this process's file-size limit, ulimit -f)"
    )
    assert Path("run/config.yaml").read_text() == "old: 1\n"  # never a 0-byte or half-written record
    assert sorted(p.name for p in Path("run").iterdir()) == ["config.yaml"]  # no temporary left behind
    write_file(Path("run/config.yaml"), "new: 2\n")
    assert Path("run/config.yaml").read_text() == "new: 2\n"


def test_a_file_size_limit_is_not_a_full_disk():
    big = OSError(errno.EFBIG, "File too large")
    assert is_file_too_big(big) and not is_file_too_big(OSError(errno.ENOSPC, "No space left on device"))
    assert is_file_too_big(RuntimeError("RESOURCE_EXHAUSTED: writing d/3f: [OSError os_error_code=27]"))
    assert is_disk_full(big)  # still a failed save; its message is the limit's
    assert str(file_too_big_error(Path("ck/4"), 2)) == (
        "ck/4: file too large: a file reached this process's file-size limit (ulimit -f, RLIMIT_FSIZE); the latest "
        "complete checkpoint is step 2; raise the limit (ulimit -f unlimited) or run where it is larger"
    )
