"""Carry the marker files of ranks on other hosts into the launcher's directory, over a signed TCP line.

The launcher names a failed rank from marker files (`_blame`): ``started-R``, ``failed-R``,
``finished-R`` from the rank and ``ended-R`` from its keeper. On unisonrun's own host they are written
straight into its directory. On another host that directory does not exist, so the rank and its keeper
send each marker here instead (`unison._contract.send_marker`): one line, ``SIGNATURE JSON``, where the
signature is an HMAC-SHA256 of the JSON under a key made for this job and handed to the ranks in
``UNISON_LAUNCHER_RELAY`` (``KEY@HOST:PORT``). The relay checks the signature, the marker's name and
size, writes the file atomically and answers ``OK``; anything else is answered ``REFUSED`` and dropped.
The sender waits for the answer, so a keeper's ``ended-R`` is on disk before mpiexec sees the rank end,
as it is on the launcher's host.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import socket
import socketserver
import threading
import time
from pathlib import Path

from .._contract import LAUNCHER_RELAY_VARIABLE as RELAY_VARIABLE
from .._contract import MARKER_KINDS, sign, write_atomically
from ..ops import TextEnum

__all__ = ["MAX_LINE_BYTES", "MarkerRelay", "RELAY_VARIABLE", "RelayState", "accept"]

MAX_LINE_BYTES = 65536
LINE_SECONDS = 5.0  # a sender has this long in all to send its line: a slow one cannot hold a thread
_NAME = re.compile(rf"({'|'.join(MARKER_KINDS)})-[0-9]{{1,7}}")


def accept(line: bytes, key: str) -> tuple[str, str] | None:
    """The marker (name, text) a relay line carries, or None when it is not a well-signed marker.

    Example:
        >>> payload = b'{"name": "ended-1", "text": "77 -9\\\\n"}'
        >>> accept(sign("k", payload).encode() + b" " + payload, "k")
        ('ended-1', '77 -9\\n')
        >>> accept(sign("other", payload).encode() + b" " + payload, "k") is None
        True
    """
    signature, _, payload = line.strip().partition(b" ")
    # Compared as bytes: compare_digest raises TypeError on a str with non-ASCII characters.
    if len(line) > MAX_LINE_BYTES or not hmac.compare_digest(signature, sign(key, payload).encode()):
        return None
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(message, dict) or set(message) != {"name", "text"}:
        return None
    name, text = message["name"], message["text"]
    if not isinstance(name, str) or not isinstance(text, str) or not _NAME.fullmatch(name):
        return None
    return name, text


class RelayState(TextEnum):
    """The relay's lifecycle: running, closing (no marker is written any more), closed."""

    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class MarkerRelay(socketserver.ThreadingTCPServer):
    """A relay writing the markers it accepts into `directory`; a context manager (``with``).

    Example:
        >>> with MarkerRelay(directory, "127.0.0.1") as relay:            # doctest: +SKIP
        ...     env[RELAY_VARIABLE] = relay.variable
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, directory: Path, advertised_host: str) -> None:
        super().__init__(("0.0.0.0", 0), _Handler)
        self.directory = Path(directory)
        self.key = secrets.token_hex(32)
        self.variable = f"{self.key}@{advertised_host}:{self.server_address[1]}"
        self.lock = threading.Lock()
        self.accepted = 0
        self.refused = 0
        self.state = RelayState.RUNNING
        self._thread = threading.Thread(target=self.serve_forever, args=(0.2,), daemon=True,
                                        name="unison-marker-relay")
        self._thread.start()

    def __repr__(self) -> str:
        return f"<MarkerRelay {self.state} port={self.server_address[1]} accepted={self.accepted}>"

    def __enter__(self) -> MarkerRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statistics(self) -> dict[str, int]:
        """Counters: markers written, lines refused."""
        return {"accepted": self.accepted, "refused": self.refused}

    def receive(self, line: bytes) -> bytes:
        """Write the marker `line` carries and answer ``OK``, or count it refused."""
        marker = accept(line, self.key)
        with self.lock:
            if marker is None or self.state is not RelayState.RUNNING:  # closed: the launcher's directory is going away
                self.refused += 1
                return b"REFUSED\n"
            name, text = marker
            try:
                write_atomically(self.directory / name, text, temporary=self.directory / f".{name}.relay")
            except OSError:
                self.refused += 1
                return b"REFUSED\n"
            self.accepted += 1
        return b"OK\n"

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self.state is RelayState.CLOSED:
            return
        with self.lock:  # waits for a marker being written; none is written after this
            self.state = RelayState.CLOSING
        self.shutdown()
        self.server_close()
        self.state = RelayState.CLOSED


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, MarkerRelay)
        try:
            self.request.sendall(self.server.receive(_read_line(self.request, time.monotonic() + LINE_SECONDS)))
        except OSError:  # the sender went away, or took too long; it gives up by itself
            pass


def _read_line(conn: socket.socket, deadline: float) -> bytes:
    """One line from `conn` (at most MAX_LINE_BYTES + 1 bytes; what came before EOF), by `deadline`."""
    line = b""
    while b"\n" not in line and len(line) <= MAX_LINE_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the sender took too long")
        conn.settimeout(left)
        chunk = conn.recv(MAX_LINE_BYTES + 1 - len(line))
        if not chunk:
            break
        line += chunk
    return line.partition(b"\n")[0] + b"\n" if b"\n" in line else line
