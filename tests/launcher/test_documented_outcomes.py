"""docs/launcher.md and docs/troubleshooting.md state the bounds and exit statuses a user meets; these
tests hold the texts to the constants and decisions the code uses, so that neither drifts alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from unison._job import failure as _failure
from unison._job.stop_report import UNEVEN_DATA
from unison.backends._liveness import probe_window
from unison.config import load_settings
from unison.launcher.mpi.lines import HOLD_SECONDS
from unison.launcher.supervision import supervise
from unison.launcher.supervision.blame import Markers, finished_early
from unison.launcher.supervision.supervise import JobOutcome, exit_status

DOCS = Path(__file__).resolve().parents[2] / "docs"
LAUNCHER = (DOCS / "launcher.md").read_text()
TROUBLESHOOTING = (DOCS / "troubleshooting.md").read_text()
DEFAULTS = load_settings({})


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_stop_bounds_are_the_code_s() -> None:
    text = _flat(LAUNCHER)
    assert f"still alive {_failure.GRACE_SECONDS:g} s after the abort prints why and exits with status 1" in text
    assert f"If the abort does not get through within {_failure.ABORT_TIMEOUT_SECONDS:g} s" in text
    assert f"anything left after {supervise.GRACE_SECONDS:g} s is killed" in text
    assert f"whatever is left after {supervise.INTERRUPT_GRACE_SECONDS:g} s is killed" in text
    assert f"after `UNISON_DEADLOCK_SECONDS` ({DEFAULTS.deadlock_seconds:g} s)" in text
    peer = DEFAULTS.peer_timeout_seconds
    ends = peer + probe_window(peer) + _failure.GRACE_SECONDS
    assert (f"a liveness probe of {probe_window(peer):g} s (as long as the timeout, if shorter), then end the job "
            f"with `MPI_Abort` {_failure.GRACE_SECONDS:g} s later: with the default {peer:g} s, the job ends "
            f"{ends:g} s after the fault") in text
    assert ends <= 20.0  # the bound the docs promise for a frozen rank under the default settings


# (row of the "Exit status" table, the outcome the supervisor builds for it, the status in the row)
ROWS = [
    ("every rank succeeded", JobOutcome(0, {}), "0"),
    ("a rank raised (an uncaught exception; every rank stops)", JobOutcome(11, {1: "failed"}, ended={1: 1, 0: -9}), "1"),
    ("a stall or a deadlock (`StallError` on every rank)", JobOutcome(1, {0: "stalled"}, ended={0: 1}), "1"),
    ("a rank exited with status n > 0 while the job ran (`os._exit(n)`)", JobOutcome(9, {1: "x"}, ended={1: 3}), "n"),
    ("a rank exited with status n > 0 after shutting unison down (`sys.exit(n)` while the others still run "
     "collectives)", JobOutcome(5, {1: "x"}, ended={1: 3, 0: 1}), "n"),
    ("a rank finished (exit status 0, without `hvd.join()`) while the others still ran collectives",
     JobOutcome(1, {}, ended={1: 0, 0: 1}, early="rank 1 finished"), "1"),
    ("a rank ended with `os._exit(0)` while the job ran", JobOutcome(9, {1: "x"}, ended={1: 0}), "1"),
    ("a rank killed by signal N (the OOM killer's SIGKILL)", JobOutcome(9, {1: "x"}, ended={1: -9}), "128 + N (137)"),
    ("`--timeout` passed", JobOutcome(9, {}, timed_out=True), "124"),
    ("Ctrl-C", JobOutcome(2, {}, interrupted=True), "130"),
    ("SIGTERM to the launcher (a batch system's stop)", JobOutcome(15, {}, interrupted=True, signal=15), "143"),
    ("the job could not start (a bad program, a bad setting in `init()`)",
     JobOutcome(1, {1: "rank 1 (h, pid 11) could not start: ConfigError: X must be a number. Got X='abc'."},
                ended={0: 1, 1: 1}), "2"),
]


@pytest.mark.parametrize(("row", "outcome", "column"), ROWS, ids=[r[0][:30] for r in ROWS])
def test_the_exit_status_table_is_what_unisonrun_returns(row: str, outcome: JobOutcome, column: str) -> None:
    cells = next((line.split("|")[1:-1] for line in LAUNCHER.splitlines() if line.startswith(f"| {row} |")), None)
    assert cells is not None, f"docs/launcher.md has no exit-status row {row!r}"
    assert cells[1].strip() == column
    expected = {"n": 3, "128 + N (137)": 137}.get(column)
    assert exit_status(outcome) == (int(column) if expected is None else expected)


def test_troubleshooting_says_the_same_statuses() -> None:
    text = _flat(TROUBLESHOOTING)
    assert ("`unisonrun` exits 0 when every rank succeeded, 1 when a rank raised, the job stalled or deadlocked, "
            "or a rank froze; n when a rank exited with status n while the job ran, also after shutting unison "
            "down (`sys.exit(4)`: `unisonrun: rank 1 (...) exited with status 4 after shutting unison down.`, and "
            "each rank that still waited in a collective says in one line `ShutdownError: rank(s) [1] shut unison "
            "down (or exited) while this rank had collectives pending`); 128 + N when a rank was killed by signal N (137: SIGKILL, often the OOM killer); 124 after "
            "`--timeout`; 130 after Ctrl-C; 143 after SIGTERM to unisonrun; 2 when the job could not start.") in text


def test_the_reports_of_a_rank_that_finished_early_are_the_code_s() -> None:
    early = finished_early(Markers(started={0: ("host", 1), 1: ("host", 2)}, finished={0, 1}, after_peer={0},
                                   ended={0: (1, 1), 1: (2, 0)}))
    assert early is not None
    quoted = early.replace("(host, pid 2)", "(host, pid P)")
    assert f"`unisonrun: {quoted}`" in _flat(LAUNCHER)
    assert early.replace("(host, pid 2)", "(vm, pid 2500)") in TROUBLESHOOTING
    assert f"ending `{UNEVEN_DATA}`" in _flat(LAUNCHER) and f"ending `{UNEVEN_DATA}`" in _flat(TROUBLESHOOTING)
    assert f"{HOLD_SECONDS:g} s later" in _flat(LAUNCHER)


def test_the_parameter_server_and_elastic_bounds_are_the_code_s() -> None:
    import inspect

    from unison.launcher.elastic.driver import DEFAULT_ELASTIC_TIMEOUT_SECONDS
    from unison.ps.client import Client

    ps = _flat((DOCS / "ps.md").read_text())
    heartbeat = inspect.signature(Client.__init__).parameters["heartbeat_seconds"].default
    assert heartbeat == 1.0  # "heartbeats every second"
    assert (f"`UNISON_PS_TRAINER_TIMEOUT_SECONDS` ({DEFAULTS.ps_trainer_timeout_seconds:g} s; heartbeats every "
            "second)") in ps
    assert f"`UNISON_PS_RECONNECT_SECONDS`, {DEFAULTS.ps_reconnect_seconds:g} s" in ps
    assert f"UNISON_PS_RECONNECT_SECONDS ({DEFAULTS.ps_reconnect_seconds:g} s)" in ps
    elastic = _flat((DOCS / "elastic.md").read_text())
    assert f"else {DEFAULT_ELASTIC_TIMEOUT_SECONDS:g} s" in elastic
