"""The elastic driver's endpoint: answer each rank 0's ``CHECK <epoch>`` question about host changes.

Rank 0 asks inside ``commit()`` (`unison.elastic._environment.ask_driver`) whether the driver wants the
ranks to stop for a new host set. The answer names the epoch: ``OK <epoch> <changes>`` for the running
epoch, ``STALE <epoch>`` to a question from an epoch that has ended (that launch is being replaced).
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Sequence

from ._host_exec import address_seen_from

__all__ = ["Endpoint", "driver_address"]


class Endpoint(socketserver.ThreadingTCPServer):
    """Answers ``CHECK <epoch>`` with ``OK <epoch> <changes>`` for the running epoch, else ``STALE <epoch>``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("0.0.0.0", 0), _Handler)
        self.lock = threading.Lock()
        self.epoch = -1
        self.changes = 0
        self.answered = 0
        self.refused = 0
        self.thread = threading.Thread(target=self.serve_forever, args=(0.2,), daemon=True,
                                       name="unison-elastic-endpoint")
        self.thread.start()

    def __repr__(self) -> str:
        return f"<Endpoint port={self.server_address[1]} epoch={self.epoch} changes={self.changes}>"

    def statistics(self) -> dict[str, int]:
        """Questions answered for the running epoch and refused as stale, since the start."""
        with self.lock:
            return {"answered": self.answered, "refused": self.refused}

    def begin(self, epoch: int) -> None:
        with self.lock:
            self.epoch, self.changes = epoch, 0

    def announce(self, epoch: int) -> None:
        with self.lock:
            if epoch == self.epoch and self.changes == 0:
                self.changes = 1

    def answer(self, line: str) -> str:
        words = line.split()
        with self.lock:
            if len(words) == 2 and words[0] == "CHECK" and words[1] == str(self.epoch):
                self.answered += 1
                return f"OK {self.epoch} {self.changes}\n"
            self.refused += 1
            return f"STALE {self.epoch}\n"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0  # a connection that says nothing does not keep its thread

    def handle(self) -> None:
        assert isinstance(self.server, Endpoint)
        try:
            line = self.rfile.readline(200).decode(errors="replace")
            self.wfile.write(self.server.answer(line).encode())
        except OSError:  # it went away or timed out: nothing to answer
            pass


def driver_address(endpoint: Endpoint, local: bool, remote_hosts: Sequence[str] = ()) -> str:
    """The endpoint's address for the ranks: loopback when every rank runs on this host, else this
    host's address on its route to `remote_hosts` (`address_seen_from`)."""
    host = "127.0.0.1" if local else address_seen_from(remote_hosts)
    return f"{host}:{endpoint.server_address[1]}"
