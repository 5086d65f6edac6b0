"""Serve one signed question and its signed answer per TCP connection, under a key made for the job.

The launcher's marker relay and the elastic driver's endpoint both listen for the ranks this way. A
client sends one line, ``SIGNATURE PAYLOAD``, signed under the key the launcher handed the ranks
together with the address (``KEY@HOST:PORT``, `unison._contract.ask_signed` on the ranks' side); the
server checks the signature in constant time, asks its owner for the answer to the payload, and sends
that back signed as the answer to this question. Anything else gets ``REFUSED`` (unsigned) and is
counted: a line without a signature, with one that is not the key's, one longer than the server takes,
one the owner declines. Each connection has a deadline for its whole line, so a client that connects
and says nothing holds only its own thread, and only that long.

The server listens on the address it tells the ranks when that is an IPv4 address (the launcher's
address on its route to the job's hosts, or loopback when every rank runs here), not on every
interface; only an address it cannot know in advance (a host name) makes it listen everywhere.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable

from ..._contract import SIGNATURE_CHARS, read_signed, signed_line
from ...ops import TextEnum

__all__ = ["LINE_SECONDS", "MAX_LINE_BYTES", "REFUSED", "LineServer", "LineServerState", "listen_address"]

MAX_LINE_BYTES = 65536
LINE_SECONDS = 5.0  # a client has this long in all to send its line: a slow one cannot hold a thread
REFUSED = b"REFUSED\n"
_HEX = frozenset(b"0123456789abcdef")
_REFUSALS = ("unsigned", "bad_signature", "oversized", "declined", "incomplete")


def listen_address(host: str) -> str:
    """Where a server that tells clients `host` listens: that address when it is IPv4, else everywhere.

    Example:
        >>> listen_address("10.1.2.3"), listen_address("127.0.0.1"), listen_address("node7")
        ('10.1.2.3', '127.0.0.1', '0.0.0.0')
    """
    try:
        return host if ipaddress.ip_address(host).version == 4 else "0.0.0.0"
    except ValueError:  # a host name: what it resolves to on the ranks' hosts is not known here
        return "0.0.0.0"


class LineServerState(TextEnum):
    """A line server's lifecycle: running, closing (no answer is given any more), closed."""

    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class LineServer(socketserver.ThreadingTCPServer):
    """Answer each well-signed line with ``answer(payload)``, signed; a context manager (``with``).

    `answer` returns the answer's payload (one line, no newline), or None to refuse. Answers are given
    one at a time, and none once `close` has begun.

    Example:
        >>> with LineServer(lambda payload: b"OK", "127.0.0.1", name="example") as server:
        ...     ask_signed(server.variable, b"hello")                          # doctest: +SKIP
        b'OK'
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # every rank of a launch may send its first marker at once

    def __init__(self, answer: Callable[[bytes], bytes | None], host: str, *, name: str,
                 max_line_bytes: int = MAX_LINE_BYTES, line_seconds: float | None = None) -> None:
        self.listening_on = listen_address(host)
        super().__init__((self.listening_on, 0), _Handler)
        self.name = name
        self.max_line_bytes = max_line_bytes
        self.line_seconds = LINE_SECONDS if line_seconds is None else line_seconds
        self.key = secrets.token_hex(32)
        self.host = host
        self.variable = f"{self.key}@{host}:{self.server_address[1]}"  # what the ranks are handed
        self.state = LineServerState.RUNNING
        self._answer = answer
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("answered", *_REFUSALS), 0)
        self._thread = threading.Thread(target=self.serve_forever, args=(0.2,), daemon=True, name=f"unison-{name}")
        self._thread.start()

    def __repr__(self) -> str:
        counts = self.statistics()
        return (f"<LineServer {self.name} {self.state} {self.listening_on}:{self.server_address[1]} "
                f"answered={counts['answered']} refused={counts['refused']}>")

    def __enter__(self) -> LineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statistics(self) -> dict[str, int]:
        """Counters: lines answered, lines refused, and the refusals by reason (`_REFUSALS`)."""
        with self._lock:
            counts = dict(self._counts)
        return {"answered": counts["answered"], "refused": sum(counts[why] for why in _REFUSALS),
                **{why: counts[why] for why in _REFUSALS}}

    def receive(self, line: bytes) -> bytes:
        """The line to send back for `line`: the owner's answer signed under the key, or `REFUSED`."""
        if len(line) > self.max_line_bytes:
            return self._refuse("oversized")
        payload = read_signed(self.key, line)
        if payload is None:
            signature, separator, _ = line.partition(b" ")
            signed = bool(separator) and len(signature) == SIGNATURE_CHARS and set(signature) <= _HEX
            return self._refuse("bad_signature" if signed else "unsigned" if line.strip() else "incomplete")
        with self._lock:
            answer = self._answer(payload) if self.state is LineServerState.RUNNING else None
            if answer is None:
                self._counts["declined"] += 1
                return REFUSED
            self._counts["answered"] += 1
        return signed_line(self.key, answer, answering=line[:SIGNATURE_CHARS])

    def close(self) -> None:
        """Stop serving (idempotent); an answer being given is finished first, none is given after it."""
        if self.state is LineServerState.CLOSED:
            return
        with self._lock:
            self.state = LineServerState.CLOSING
        self.shutdown()
        self.server_close()
        self.state = LineServerState.CLOSED

    def _refuse(self, why: str) -> bytes:
        with self._lock:
            self._counts[why] += 1
        return REFUSED


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, LineServer)
        try:
            line = _read_line(self.request, time.monotonic() + server.line_seconds, server.max_line_bytes)
        except OSError:  # the client went away, or took too long: it gives up by itself
            server._refuse("incomplete")
            return
        try:
            self.request.sendall(server.receive(line))
        except OSError:
            pass


def _read_line(conn: socket.socket, deadline: float, max_bytes: int) -> bytes:
    """One line from `conn` (at most `max_bytes` + 1 bytes; what came before EOF), by `deadline`."""
    line = b""
    while b"\n" not in line and len(line) <= max_bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client took too long")
        conn.settimeout(left)
        chunk = conn.recv(max_bytes + 1 - len(line))
        if not chunk:
            break
        line += chunk
    return line.partition(b"\n")[0] + b"\n" if b"\n" in line else line
