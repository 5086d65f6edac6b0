"""A TCP relay between trainers and a server that can withhold the server's replies and then cut the connections.

It stands for a network that delivers a request but loses its reply: the test holds the replies,
waits until the server has acted on the request, then cuts, and the trainer sees its call fail and
sends it again over a new connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Listen on 127.0.0.1 and relay each connection to `target` (``host:port``)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._holding = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0
        self.withheld_bytes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def hold_replies(self) -> None:
        """From now on, keep what the server sends instead of passing it on."""
        self._holding.set()

    def cut(self) -> None:
        """Close every open connection (the withheld replies are lost) and relay normally again."""
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()
            self.cuts += 1
        self._holding.clear()

    def close(self) -> None:
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:  # the server is not up (yet): the trainer's call fails and is tried again
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies and self._holding.is_set():
                    self.withheld_bytes += len(data)
                    continue
                sink.sendall(data)
        except OSError:
            pass
        # one side is gone: end the whole connection, as a broken TCP connection would
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
