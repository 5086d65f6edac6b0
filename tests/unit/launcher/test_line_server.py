"""The launcher's signed line server: one signed question and its signed answer per connection."""

from __future__ import annotations

import doctest
import socket
import threading
import time

import pytest

from unison._contract import SIGNATURE_CHARS, ask_signed, read_signed, sign, signed_line
from unison.launcher.supervision import line_server
from unison.launcher.supervision.line_server import REFUSED, LineServer, LineServerState, listen_address

pytestmark = pytest.mark.timeout(30)


def _exchange(server: LineServer, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as conn:
        conn.sendall(line)
        return conn.makefile("rb").readline()


def _refusals(server: LineServer) -> dict[str, int]:
    return {why: count for why, count in server.statistics().items() if count and why != "refused"}


def test_examples_in_docstrings() -> None:
    result = doctest.testmod(line_server)
    assert result.failed == 0 and result.attempted > 0


def test_a_well_signed_line_gets_the_owners_answer_signed_for_that_question() -> None:
    asked = []
    with LineServer(lambda payload: asked.append(payload) or b"ANSWER " + payload, "127.0.0.1", name="t") as server:
        assert ask_signed(server.variable, b"hello there") == b"ANSWER hello there"
        question = signed_line(server.key, b"again")
        answer = _exchange(server, question)
        assert read_signed(server.key, answer, answering=question[:SIGNATURE_CHARS]) == b"ANSWER again"
        assert read_signed(server.key, answer) is None  # not a question: an answer cannot be passed on as one
        other = signed_line(server.key, b"other")[:SIGNATURE_CHARS]
        assert read_signed(server.key, answer, answering=other) is None  # nor as the answer to another
        assert asked == [b"hello there", b"again"]
        assert _refusals(server) == {"answered": 2}


def test_a_line_under_another_key_is_refused_and_counted() -> None:
    with LineServer(lambda payload: b"OK", "127.0.0.1", name="t") as server:
        assert _exchange(server, signed_line("not the key", b"CHECK 3")) == REFUSED
        wrong = "0" * 64 + server.variable[64:]
        assert ask_signed(wrong, b"CHECK 3") is None
        assert _exchange(server, b"\xff" * 64 + b" CHECK 3\n") == REFUSED  # not even ASCII: refused, no error
        assert _refusals(server) == {"bad_signature": 2, "unsigned": 1}


def test_an_unsigned_line_is_refused_and_never_reaches_the_owner() -> None:
    asked = []
    with LineServer(lambda payload: asked.append(payload) or b"OK", "127.0.0.1", name="t") as server:
        assert _exchange(server, b"CHECK 3\n") == REFUSED
        assert _exchange(server, b" CHECK 3\n") == REFUSED
        assert asked == [] and _refusals(server) == {"unsigned": 2}


def test_a_line_longer_than_the_server_takes_is_refused_unread() -> None:
    asked = []
    with LineServer(lambda payload: asked.append(payload) or b"OK", "127.0.0.1", name="t",
                    max_line_bytes=200) as server:
        long_line = signed_line(server.key, b"x" * 200)
        assert _exchange(server, long_line) == REFUSED
        assert ask_signed(server.variable, b"x" * 100) == b"OK"  # within the limit, signature and all
        assert asked == [b"x" * 100] and _refusals(server) == {"oversized": 1, "answered": 1}


def test_a_client_that_says_nothing_blocks_nobody_and_is_cut_off_at_its_deadline() -> None:
    with LineServer(lambda payload: b"OK", "127.0.0.1", name="t", line_seconds=1.0) as server:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as silent:
            started = time.monotonic()
            assert ask_signed(server.variable, b"meanwhile") == b"OK"
            assert time.monotonic() - started < 0.9  # answered while the silent one still held its connection
            assert silent.recv(1) == b""  # closed by the server once its line time was up
            assert 0.9 < time.monotonic() - started < 5
        deadline = time.monotonic() + 5
        while server.statistics()["incomplete"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _refusals(server) == {"answered": 1, "incomplete": 1}


def test_a_declined_question_and_any_question_after_close_are_refused() -> None:
    server = LineServer(lambda payload: None if payload == b"no" else b"OK", "127.0.0.1", name="t")
    assert ask_signed(server.variable, b"no") is None
    assert server.receive(signed_line(server.key, b"yes")).endswith(b" OK\n")
    server.close()
    server.close()  # idempotent
    assert server.state is LineServerState.CLOSED
    assert server.receive(signed_line(server.key, b"yes")) == REFUSED  # a thread still running gets no answer
    assert ask_signed(server.variable, b"yes") is None  # nobody listens: no hang
    assert _refusals(server) == {"answered": 1, "declined": 2}


def test_an_answer_not_signed_for_the_question_counts_as_none() -> None:
    # A stand-in for whoever else reaches the port or the path: it answers without the key's signature
    # for this question, as a replay of another answer would be.
    key = "k" * 64
    replies = [b"OK\n", signed_line(key, b"OK"), signed_line(key, b"OK", answering=sign(key, b"other").encode())]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve() -> None:
            for reply in replies:
                conn, _ = listener.accept()
                with conn:
                    conn.makefile("rb").readline()
                    conn.sendall(reply)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        address = f"{key}@127.0.0.1:{listener.getsockname()[1]}"
        assert [ask_signed(address, b"question") for _ in replies] == [None, None, None]
        thread.join(10)


def test_the_server_listens_on_the_address_it_hands_out_when_it_can_know_it() -> None:
    with LineServer(lambda payload: b"OK", "127.0.0.1", name="t") as server:
        assert server.server_address[0] == "127.0.0.1"
        assert server.variable == f"{server.key}@127.0.0.1:{server.server_address[1]}"
        assert len(server.key) == 64 and repr(server).startswith("<LineServer t running 127.0.0.1:")
    assert listen_address("node7") == "0.0.0.0"  # a name may resolve to anything on the ranks' hosts
    assert listen_address("::1") == "0.0.0.0"
