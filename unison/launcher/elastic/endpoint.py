"""The elastic driver's endpoint: answer rank 0's ``CHECK <epoch>`` about host changes, and the workers' questions.

Rank 0 asks inside ``commit()`` (`unison.elastic._environment.ask_driver`) whether the driver wants the
ranks to stop for a new host set. The answer names the epoch: ``OK <epoch> <changes>`` for the running
epoch, ``STALE <epoch>`` to a question from an epoch that has ended (that launch is being replaced).
Where the workers keep their processes across epochs, they also ask which epoch to join (``JOIN``) and
say how theirs ended (``STOPPED``, ``BROKEN``, ``LEFT``): `unison._job.launch.elastic` has the lines; the
driver's `workers` callable answers them.
Questions and answers travel as signed lines (`supervision.line_server`): the ranks get the key with the address
in ``UNISON_ELASTIC_DRIVER`` (``KEY@HOST:PORT``), so nobody else who reaches the port can ask, or
answer in the driver's place. The server listens where the epoch's ranks reach the driver (`listen`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..._job.launch.elastic import parse_question
from ..hosts.reach import address_seen_from
from ..supervision.line_server import LineServer, LineServerState

__all__ = ["MAX_QUESTION_BYTES", "Endpoint", "driver_host"]

MAX_QUESTION_BYTES = 256  # ``SIGNATURE CHECK <epoch> <nonce>``


class Endpoint:
    """Answers ``CHECK <epoch> [NONCE]`` with ``OK <epoch> <changes>`` for the running epoch, else
    ``STALE <epoch>``; served on a `LineServer` once `listen` has said where."""

    def __init__(self, workers: Callable[[str, str, int, tuple[int, ...]], bytes] | None = None) -> None:
        self.workers = workers  # answers a worker's question: (kind, worker, epoch, numbers) -> the answer
        self.lock = threading.Lock()
        self.epoch = -1
        self.changes = 0
        self.answered = 0
        self.stale = 0
        self.server: LineServer | None = None  # the one last listened on
        self.servers: dict[str, LineServer] = {}  # host -> its server

    def __repr__(self) -> str:
        where = "not listening" if self.server is None else f"{self.server.host}:{self.server.server_address[1]}"
        return f"<Endpoint {where} epoch={self.epoch} changes={self.changes}>"

    def statistics(self) -> dict[str, int]:
        """Questions answered for the running epoch and answered stale, since the start; lines the
        current server refused (unsigned, badly signed, too long, incomplete)."""
        refused = sum(server.statistics()["refused"] for server in self.servers.values())
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
        if words[:1] in ([b"JOIN"], [b"STOPPED"], [b"BROKEN"], [b"LEFT"]) and self.workers is not None:
            parsed = parse_question(question)
            return self.workers(*parsed) if parsed is not None else b"REFUSED"
        with self.lock:
            if len(words) in (2, 3) and words[0] == b"CHECK" and words[1] == str(self.epoch).encode():
                self.answered += 1
                return f"OK {self.epoch} {self.changes}".encode()
            self.stale += 1
            return f"STALE {self.epoch}".encode()

    def listen(self, host: str, keep: bool = False) -> str:
        """Serve at `host` (where the ranks reach this host); the ``KEY@HOST:PORT`` to hand them.

        The server (and its key) stays while the host stays the same; another host gets a new one,
        which replaces the first unless `keep` (workers that keep their processes were handed the
        first: both then serve).
        """
        server = self.servers.get(host)
        if server is not None and server.state is LineServerState.RUNNING:
            self.server = server
            return server.variable
        if not keep:
            self.close()
        self.server = self.servers[host] = LineServer(self.answer, host, name="elastic-endpoint",
                                                      max_line_bytes=MAX_QUESTION_BYTES)
        return self.server.variable

    def close(self) -> None:
        """Stop serving (idempotent)."""
        for server in self.servers.values():
            server.close()
        self.servers.clear()


def driver_host(local: bool, remote_hosts: Sequence[str] = ()) -> str:
    """Where the ranks reach the driver: loopback when every rank runs on this host, else this host's
    address on its route to `remote_hosts` (`address_seen_from`)."""
    return "127.0.0.1" if local else address_seen_from(remote_hosts)
