"""unison.run's ranks load the caller's function only from a job directory that is this user's alone."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from unison._contract import JOB_FILE, META_FILE, untrusted_directory
from unison.launcher.function import bootstrap


def _job_directory(path: Path, mode: int) -> Path:
    path.mkdir(mode=0o700)
    (path / META_FILE).write_text('{"sys_path": [], "main_path": ""}')
    (path / JOB_FILE).write_bytes(pickle.dumps({"fn": print, "args": (), "kwargs": {}}))
    path.chmod(mode)
    return path


def test_a_private_job_directory_is_loaded(tmp_path: Path) -> None:
    job = bootstrap._load(_job_directory(tmp_path / "job", 0o700))
    assert job["fn"] is print


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_job_directory_others_can_write_is_not_loaded(tmp_path: Path, mode: int) -> None:
    directory = _job_directory(tmp_path / "job", mode)
    with pytest.raises(PermissionError, match=r"is writable by group or others .*not loading it"):
        bootstrap._load(directory)


def test_a_link_in_place_of_the_job_directory_is_not_followed(tmp_path: Path) -> None:
    target = _job_directory(tmp_path / "elsewhere", 0o700)
    (tmp_path / "job").symlink_to(target)
    with pytest.raises(PermissionError, match="is a symbolic link"):
        bootstrap._load(tmp_path / "job")


def test_untrusted_directory_names_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert untrusted_directory(tmp_path / "file").startswith("is not a directory (owner ")
    with pytest.raises(FileNotFoundError):
        untrusted_directory(tmp_path / "missing")
