"""The elastic driver's endpoint: answer each rank 0's ``CHECK <epoch>`` question about host changes.

Rank 0 asks inside ``commit()`` (`unison.elastic._environment.ask_driver`) whether the driver wants the
ranks to stop for a new host set. The answer names the epoch: ``OK <epoch> <changes>`` for the running
epoch, ``STALE <epoch>`` to a question from an epoch that has ended (that launch is being replaced).
Questions and answers travel as signed lines (`supervision.line_server`): the ranks get the key with the address
in ``UNISON_ELASTIC_DRIVER`` (``KEY@HOST:PORT``), so nobody else who reaches the port can ask, or
answer in the driver's place. The server listens where the epoch's ranks reach the driver (`listen`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..hosts.reach import address_seen_from
from ..supervision.line_server import LineServer, LineServerState

__all__ = ["MAX_QUESTION_BYTES", "Endpoint", "driver_host"]

MAX_QUESTION_BYTES = 256  # ``SIGNATURE CHECK <epoch> <nonce>``


class Endpoint:
    """Answers ``CHECK <epoch> [NONCE]`` with ``OK <epoch> <changes>`` for the running epoch, else
    ``STALE <epoch>``; served on a `LineServer` once `listen` has said where."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.epoch = -1
        self.changes = 0
        self.answered = 0
        self.stale = 0
        self.server: LineServer | None = None

    def __repr__(self) -> str:
        where = "not listening" if self.server is None else f"{self.server.host}:{self.server.server_address[1]}"
        return f"<Endpoint {where} epoch={self.epoch} changes={self.changes}>"

    def statistics(self) -> dict[str, int]:
        """Questions answered for the running epoch and answered stale, since the start; lines the
        current server refused (unsigned, badly signed, too long, incomplete)."""
        refused = 0 if self.server is None else self.server.statistics()["refused"]
        with self.lock:
            return {"answered": self.answered, "stale": self.stale, "refused": refused}

    def begin(self, epoch: int) -> None:
        with self.lock:
            self.epoch, self.changes = epoch, 0

    def announce(self, epoch: int) -> None:
        with self.lock:
            if epoch == self.epoch and self.changes == 0:
                self.changes = 1

    def answer(self, question: bytes) -> bytes:
        """The answer to a (signature-checked) question: ``OK <epoch> <changes>`` or ``STALE <epoch>``.

        Example:
            >>> endpoint = Endpoint(); endpoint.begin(3)
            >>> endpoint.answer(b"CHECK 3 5f1e"), endpoint.answer(b"CHECK 2 5f1e")
            (b'OK 3 0', b'STALE 3')
        """
        words = question.split()
        with self.lock:
            if len(words) in (2, 3) and words[0] == b"CHECK" and words[1] == str(self.epoch).encode():
                self.answered += 1
                return f"OK {self.epoch} {self.changes}".encode()
            self.stale += 1
            return f"STALE {self.epoch}".encode()

    def listen(self, host: str) -> str:
        """Serve at `host` (where the ranks reach this host); the ``KEY@HOST:PORT`` to hand them.

        The server (and its key) stays while the host stays the same; another host gets a new one.
        """
        if self.server is None or self.server.state is not LineServerState.RUNNING or self.server.host != host:
            self.close()
            self.server = LineServer(self.answer, host, name="elastic-endpoint",
                                     max_line_bytes=MAX_QUESTION_BYTES)
        return self.server.variable

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self.server is not None:
            self.server.close()


def driver_host(local: bool, remote_hosts: Sequence[str] = ()) -> str:
    """Where the ranks reach the driver: loopback when every rank runs on this host, else this host's
    address on its route to `remote_hosts` (`address_seen_from`)."""
    return "127.0.0.1" if local else address_seen_from(remote_hosts)
