"""The contract between unisonrun and its ranks (unison/_contract.py): names, formats, atomic writes.

Named apart from tests/unit/backends/test_contract.py (the Backend contract): pytest collects both."""

from __future__ import annotations

import doctest
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from unison import _contract
from unison._contract import (
    LAUNCHER_DIR_VARIABLE,
    SERVICE_FILE,
    host_of,
    marker_name,
    parse_hosts,
    parse_marker_name,
    relay_line,
    write_atomically,
    write_service_file,
)
from unison.launcher.supervision import keeper
from unison.launcher.supervision.relay import accept


def test_examples_in_docstrings() -> None:
    result = doctest.testmod(_contract)
    assert result.failed == 0 and result.attempted > 0


def test_every_marker_name_reads_back_and_nothing_else_does() -> None:
    for kind in _contract.MARKER_KINDS:
        assert parse_marker_name(marker_name(kind, 7)) == (kind, 7)
    for name in ("ended-", "ended-x", "aborted-1", ".failed-1.tmp", "failed-1.relay", SERVICE_FILE, "job.pkl"):
        assert parse_marker_name(name) is None


def test_a_bad_host_list_names_its_variable_and_the_item() -> None:
    with pytest.raises(ValueError, match=r"UNISON_ELASTIC_HOSTS must be 'host:slots,...'. Got 'b'\."):
        parse_hosts("a:1,b", "UNISON_ELASTIC_HOSTS")
    hosts = parse_hosts("a:2,b:1")
    assert [host_of(hosts, rank) for rank in range(4)] == ["a", "a", "b", None]


def test_write_atomically_leaves_the_file_whole_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "failed-3"
    write_atomically(target, "first\n")
    write_atomically(target, b"second\n")
    assert target.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failed-3"]
    with pytest.raises(OSError):
        write_atomically(tmp_path / "gone" / "failed-3", "x")


def test_the_service_file_is_private_and_skipped_without_a_directory(tmp_path: Path) -> None:
    write_service_file(str(tmp_path), "127.0.0.1:4000", "s3cret")
    written = tmp_path / SERVICE_FILE
    assert json.loads(written.read_text()) == {"address": "127.0.0.1:4000", "secret": "s3cret"}
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    write_service_file(str(tmp_path / "gone"), "127.0.0.1:4000", "s3cret")  # no error, nothing written
    write_service_file("", "127.0.0.1:4000", "s3cret")
    assert sorted(p.name for p in tmp_path.iterdir()) == [SERVICE_FILE]


def test_the_relay_accepts_the_line_a_rank_sends() -> None:
    line = relay_line("key", "ended-2", "77 -9\n")
    assert accept(line, "key") == ("ended-2", "77 -9\n")
    assert accept(line, "other key") is None


def test_the_keeper_run_as_a_script_loads_the_contract_by_its_path(tmp_path: Path) -> None:
    # python -I -S: no site-packages and no package around the keeper, as mpiexec starts it.
    env = {**os.environ, "PMI_RANK": "1", "PMI_SIZE": "2", LAUNCHER_DIR_VARIABLE: str(tmp_path)}
    done = subprocess.run([sys.executable, "-I", "-S", keeper.__file__, sys.executable, "-c", "raise SystemExit(3)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    pid, code = (tmp_path / "ended-1").read_text().split()
    assert int(pid) > 0 and code == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ended-1"]
