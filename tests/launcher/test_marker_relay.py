"""The marker relay: markers of ranks on other hosts (no launcher directory there) reach the launcher's.

A "remote" rank is emulated by pointing ``UNISON_LAUNCHER_DIR`` at a path that does not exist, as it
would not on another host, and handing it the relay's ``UNISON_LAUNCHER_RELAY``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unison._contract import send_marker, sign
from unison.launcher.supervision import keeper
from unison.launcher.supervision.blame import read_markers
from unison.launcher.supervision.relay import RELAY_VARIABLE, MarkerRelay, accept

pytestmark = pytest.mark.timeout(60)

PYTHON = sys.executable
MPIEXEC = str(Path(PYTHON).with_name("mpiexec"))


def _line(key: str, message: object) -> bytes:
    payload = json.dumps(message).encode()
    return sign(key, payload).encode() + b" " + payload + b"\n"


def test_only_well_signed_markers_with_marker_names_are_accepted() -> None:
    assert accept(_line("k", {"name": "failed-12", "text": "boom\n"}), "k") == ("failed-12", "boom\n")
    for key, message in [("other", {"name": "ended-1", "text": "1 -9"}),   # wrong key
                         ("k", {"name": "../ended-1", "text": ""}),         # a path, not a name
                         ("k", {"name": "ended-1/x", "text": ""}),
                         ("k", {"name": "result-1", "text": ""}),           # not a marker kind
                         ("k", {"name": "ended-1", "text": 5}),             # text not a string
                         ("k", {"name": "ended-1", "text": "", "more": 1}),  # unexpected field
                         ("k", ["ended-1", ""])]:
        assert accept(_line(key, message), "k") is None, message
    assert accept(b"not a signature at all", "k") is None
    payload = b"{not json"
    assert accept(sign("k", payload).encode() + b" " + payload, "k") is None
    big = {"name": "failed-1", "text": "x" * 70000}
    assert accept(_line("k", big), "k") is None  # longer than a line may be


def test_the_relay_writes_what_it_accepts_and_refuses_the_rest(tmp_path: Path) -> None:
    with MarkerRelay(tmp_path, "127.0.0.1") as relay:
        assert send_marker(relay.variable, "started-2", "h7 4242\n")
        wrong = "0" * 64 + relay.variable[64:]
        assert not send_marker(wrong, "ended-2", "4242 -9\n")
        assert not send_marker(relay.variable, "../escape-2", "x")
        counts = relay.statistics()
        assert (counts["answered"], counts["bad_signature"], counts["declined"]) == (1, 1, 1)
    assert read_markers(tmp_path).started == {2: ("h7", 4242)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["started-2"]
    assert not send_marker(relay.variable, "ended-2", "1 0\n")  # closed: the sender gives up, no hang


def test_a_keeper_away_from_the_launcher_directory_reports_the_ranks_end_through_the_relay(tmp_path: Path) -> None:
    program = [PYTHON, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with MarkerRelay(tmp_path, "127.0.0.1") as relay:
        env = dict(os.environ, PMI_RANK="3", UNISON_LAUNCHER_DIR=str(tmp_path / "on-another-host"),
                   **{RELAY_VARIABLE: relay.variable})
        done = subprocess.run(keeper.command(program, remote=True), env=env, timeout=30)
    assert done.returncode == -9
    pid, code = read_markers(tmp_path).ended[3]
    assert code == -9 and pid > 0


def test_the_remote_form_runs_the_program_bare_where_this_python_is_missing(tmp_path: Path) -> None:
    command = keeper.command([PYTHON, "-c", "import sys; sys.exit(7)"], remote=True)
    assert command[4] == PYTHON
    command[4] = str(tmp_path / "no-python-here")
    with MarkerRelay(tmp_path, "127.0.0.1") as relay:
        env = dict(os.environ, PMI_RANK="0", UNISON_LAUNCHER_DIR=str(tmp_path / "elsewhere"),
                   **{RELAY_VARIABLE: relay.variable})
        done = subprocess.run(command, env=env, timeout=30)
        assert done.returncode == 7
        assert relay.statistics()["answered"] == 0  # no keeper ran, so nothing was reported


RANKS = """
import sys, unison
unison.init()
if unison.rank() == 1:
    raise ValueError("rank 1 gives up")
unison.barrier()
"""


def test_ranks_away_from_the_launcher_directory_relay_started_and_failed(tmp_path: Path) -> None:
    with MarkerRelay(tmp_path, "127.0.0.1") as relay:
        env = dict(os.environ, UNISON_LAUNCHER_DIR=str(tmp_path / "on-another-host"),
                   **{RELAY_VARIABLE: relay.variable})
        done = subprocess.run([MPIEXEC, "-n", "2", PYTHON, "-c", RANKS], env=env, timeout=50,
                              capture_output=True, text=True)
    assert done.returncode != 0
    markers = read_markers(tmp_path)
    assert sorted(markers.started) == [0, 1]
    assert list(markers.failed) == [1], done.stderr
    assert "ValueError: rank 1 gives up" in markers.failed[1]


def test_a_signature_that_is_not_ascii_is_refused_not_an_error(tmp_path: Path) -> None:
    import socket

    payload = b'{"name": "ended-1", "text": "1 0"}'
    assert accept(b"\xff" * 64 + b" " + payload, "k") is None
    with MarkerRelay(tmp_path, "127.0.0.1") as relay:
        with socket.create_connection(("127.0.0.1", relay.server_address[1]), timeout=10) as conn:
            conn.sendall(b"\xff" * 64 + b" " + payload + b"\n")
            assert conn.makefile("rb").readline() == b"REFUSED\n"
        assert (relay.statistics()["answered"], relay.statistics()["refused"]) == (0, 1)


def test_a_sender_trickling_its_line_is_cut_off_after_the_line_time(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import time

    from unison.launcher.supervision import line_server

    monkeypatch.setattr(line_server, "LINE_SECONDS", 1.0)
    with MarkerRelay(tmp_path, "127.0.0.1") as relay:
        with socket.create_connection(("127.0.0.1", relay.server_address[1]), timeout=10) as conn:
            started = time.monotonic()
            with pytest.raises(OSError):  # the relay closed the connection: a send or the read fails
                while time.monotonic() - started < 6:
                    conn.sendall(b"x")  # one byte every 0.2 s: each read comes well within any per-read timeout
                    time.sleep(0.2)
                    conn.settimeout(0.001)
                    try:
                        if conn.recv(1) == b"":
                            raise ConnectionResetError("closed by the relay")
                    except TimeoutError:
                        pass
                    conn.settimeout(10)
            assert time.monotonic() - started < 3
        assert send_marker(relay.variable, "started-0", "h 1\n")  # the relay still serves others


def test_no_marker_is_written_once_the_relay_is_closed(tmp_path: Path) -> None:
    relay = MarkerRelay(tmp_path, "127.0.0.1")
    relay.close()
    payload = json.dumps({"name": "ended-4", "text": "1 0\n"}).encode()
    assert relay.receive(sign(relay.key, payload).encode() + b" " + payload + b"\n") == b"REFUSED\n"
    assert list(tmp_path.iterdir()) == []
