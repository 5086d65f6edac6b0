"""The lines between an elastic worker and the driver, and the worker's questions over the signed endpoint."""

from __future__ import annotations

import os
import threading

import pytest

from unison._job.launch.elastic import ElasticWorker, Joined, format_answer, parse_question, worker_name
from unison.config import Settings
from unison.launcher.elastic.endpoint import Endpoint

pytestmark = pytest.mark.timeout(60)


def test_questions_parse_and_anything_else_is_refused() -> None:
    assert parse_question(b"JOIN w12 -1 4242 ab") == ("JOIN", "w12", -1, (4242,))
    assert parse_question(b"STOPPED w3 5 ab") == ("STOPPED", "w3", 5, ())
    assert parse_question(b"BROKEN w3 5 - ab") == ("BROKEN", "w3", 5, ())
    assert parse_question(b"BROKEN w3 5 0,2 ab") == ("BROKEN", "w3", 5, (0, 2))
    for bad in (b"JOIN x3 0 1 ab", b"JOIN w3 zero 1 ab", b"BROKEN w3 5 a,b ab", b"STOPPED w3", b"CHECK 0 ab",
                b"JOIN w3 0 ab"):
        assert parse_question(bad) is None, bad


def test_answers_are_what_the_worker_reads() -> None:
    assert format_answer("EPOCH", 3, 1, "127.0.0.1:5", "a:1,b:1") == b"EPOCH 3 1 127.0.0.1:5 a:1,b:1"
    assert format_answer("WAIT") == b"WAIT" and format_answer("LEAVE", why="host-left") == b"LEAVE host-left"
    joined = Joined(3, 1, "127.0.0.1:5", "a:2,b:1")
    assert joined.ranks_hosts == ["a", "a", "b"] and joined.size == 3


def test_only_a_worker_launcher_directory_names_a_worker() -> None:
    assert worker_name(Settings(elastic_driver="k@h:1", launcher_dir="/tmp/unisonrun-x/w0/")) == "w0"
    assert worker_name(Settings(launcher_dir="/tmp/unisonrun-x/w0")) is None  # no driver
    assert worker_name(Settings(elastic_driver="k@h:1", launcher_dir="/tmp/w0x")) is None


def test_a_worker_waits_until_the_driver_names_its_epoch_and_reports_how_it_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UNISON_ELASTIC_EPOCH", "UNISON_ELASTIC_HOSTS"):  # the worker sets them: restored after
        monkeypatch.delenv(name, raising=False)
    told: list[tuple[str, str, int, tuple[int, ...]]] = []
    answers = iter([b"WAIT", b"WAIT", b"EPOCH 0 1 127.0.0.1:9 a:2"])
    lock = threading.Lock()

    def workers(kind: str, name: str, epoch: int, numbers: tuple[int, ...]) -> bytes:
        with lock:
            told.append((kind, name, epoch, numbers))
            return next(answers) if kind == "JOIN" else b"OK"

    endpoint = Endpoint(workers=workers)
    try:
        worker = ElasticWorker("w5", endpoint.listen("127.0.0.1"))
        worker._start_watcher = lambda: None  # type: ignore[method-assign]  # no store to watch here
        assert worker.next_epoch() == Joined(0, 1, "127.0.0.1:9", "a:2")
        assert worker.epoch == 0
        assert os.environ["UNISON_ELASTIC_EPOCH"] == "0" and os.environ["UNISON_ELASTIC_HOSTS"] == "a:2"
        worker.report_broken((1,))
        worker.report_stopped()
        assert [t[0] for t in told] == ["JOIN", "JOIN", "JOIN", "BROKEN", "STOPPED"]
        assert told[0][:3] == ("JOIN", "w5", -1) and told[3] == ("BROKEN", "w5", 0, (1,))
    finally:
        endpoint.close()


def test_a_worker_told_to_leave_ends_with_status_zero() -> None:
    endpoint = Endpoint(workers=lambda *question: b"LEAVE host-left")
    try:
        worker = ElasticWorker("w1", endpoint.listen("127.0.0.1"))
        with pytest.raises(SystemExit) as stop:
            worker.next_epoch()
        assert stop.value.code == 0
    finally:
        endpoint.close()
