"""The elastic driver's endpoint and rank 0's question to it, over signed lines."""

from __future__ import annotations

import socket

import pytest

from unison._contract import signed_line
from unison.elastic._environment import ask_driver
from unison.launcher.elastic.endpoint import Endpoint, driver_host
from unison.launcher.supervision.line_server import REFUSED

pytestmark = pytest.mark.timeout(30)


def test_rank_zero_hears_the_changes_of_its_epoch_and_stale_after_it() -> None:
    endpoint = Endpoint()
    try:
        endpoint.begin(2)
        address = endpoint.listen("127.0.0.1")
        assert ask_driver(address, 2) == 0
        endpoint.announce(2)
        assert ask_driver(address, 2) == 1
        assert ask_driver(address, 1) == 1 << 30  # an epoch that has ended: being replaced
        endpoint.begin(3)
        assert endpoint.listen("127.0.0.1") == address  # same host: same server, same key
        assert ask_driver(address, 3) == 0
        assert endpoint.statistics() == {"answered": 3, "stale": 1, "refused": 0}
    finally:
        endpoint.close()


def test_a_question_without_the_key_gets_no_answer_and_counts_as_none() -> None:
    endpoint = Endpoint()
    try:
        endpoint.begin(0)
        address = endpoint.listen("127.0.0.1")
        key, _, host_port = address.partition("@")
        host, _, port = host_port.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"CHECK 0\n")  # what anyone reaching the port could send before
            assert conn.makefile("rb").readline() == REFUSED
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(signed_line("f" * 64, b"CHECK 0 00"))
            assert conn.makefile("rb").readline() == REFUSED
        assert ask_driver(f"{'0' * 64}@{host_port}", 0) is None
        assert ask_driver(host_port, 0) is None  # no key at all: not asked
        assert endpoint.statistics() == {"answered": 0, "stale": 0, "refused": 3}
    finally:
        endpoint.close()
    assert ask_driver(address, 0) is None  # the driver is gone: no answer, as before


def test_another_host_gets_a_new_server_and_key() -> None:
    endpoint = Endpoint()
    try:
        first = endpoint.listen("127.0.0.1")
        second = endpoint.listen("127.0.0.2")
        assert second != first and "@127.0.0.2:" in second
        assert endpoint.server is not None and endpoint.server.server_address[0] == "127.0.0.2"
        endpoint.begin(0)
        # The new server answers; a question gets 2 s, which a loaded machine (CI's three test workers
        # beside Ray's jobs) once let pass before this thread was scheduled: ask up to three times.
        answers = [ask_driver(second, 0) for _ in range(3)]
        assert next((a for a in answers if a is not None), None) == 0, answers
        assert ask_driver(first, 0) is None
    finally:
        endpoint.close()


def test_the_driver_is_reached_on_loopback_when_every_rank_runs_here() -> None:
    assert driver_host(True, ["h1"]) == "127.0.0.1"
    assert driver_host(False, ["127.0.0.1"]) == socket.gethostname()  # no route away: the name, as the relay
