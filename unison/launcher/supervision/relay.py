"""Carry the marker files of ranks on other hosts into the launcher's directory, over a signed TCP line.

The launcher names a failed rank from marker files (`blame`): ``started-R``, ``failed-R``,
``finished-R`` from the rank and ``ended-R`` from its keeper. On unisonrun's own host they are written
straight into its directory. On another host that directory does not exist, so the rank and its keeper
send each marker here instead (`unison._contract.send_marker`): one signed line to the relay's
`LineServer`, whose key and address reach the ranks in ``UNISON_LAUNCHER_RELAY`` (``KEY@HOST:PORT``).
The relay checks the marker's name, writes the file atomically and answers ``OK`` (signed); anything
else is answered ``REFUSED``, dropped and counted. The sender waits for the answer, so a keeper's
``ended-R`` is on disk before mpiexec sees the rank end, as it is on the launcher's host.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..._contract import LAUNCHER_RELAY_VARIABLE as RELAY_VARIABLE
from ..._contract import MARKER_KINDS, read_signed, write_atomically
from .line_server import MAX_LINE_BYTES, LineServer

__all__ = ["MAX_LINE_BYTES", "MarkerRelay", "RELAY_VARIABLE", "accept", "marker_of"]

_NAME = re.compile(rf"({'|'.join(MARKER_KINDS)})-[0-9]{{1,7}}")


def marker_of(payload: bytes) -> tuple[str, str] | None:
    """The marker (name, text) a relay line's payload carries, or None when it is not one.

    Example:
        >>> marker_of(b'{"name": "ended-1", "text": "77 -9\\\\n"}'), marker_of(b'{"name": "../ended-1", "text": ""}')
        (('ended-1', '77 -9\\n'), None)
    """
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


def accept(line: bytes, key: str) -> tuple[str, str] | None:
    """The marker (name, text) a whole relay line carries, or None when it is not a well-signed marker.

    Example:
        >>> from unison._contract import relay_line
        >>> accept(relay_line("k", "ended-1", "77 -9\\n"), "k"), accept(relay_line("other", "ended-1", ""), "k")
        (('ended-1', '77 -9\\n'), None)
    """
    if len(line) > MAX_LINE_BYTES:
        return None
    payload = read_signed(key, line)
    return None if payload is None else marker_of(payload)


class MarkerRelay(LineServer):
    """A relay writing the markers it accepts into `directory`; a context manager (``with``).

    Example:
        >>> with MarkerRelay(directory, "127.0.0.1") as relay:            # doctest: +SKIP
        ...     env[RELAY_VARIABLE] = relay.variable
    """

    def __init__(self, directory: Path, advertised_host: str) -> None:
        self.directory = Path(directory)
        super().__init__(self._write, advertised_host, name="marker-relay")

    def __repr__(self) -> str:
        counts = self.statistics()
        return (f"<MarkerRelay {self.state} port={self.server_address[1]} accepted={counts['answered']} "
                f"refused={counts['refused']}>")

    def _write(self, payload: bytes) -> bytes | None:
        """Write the marker `payload` carries; ``OK`` once it is on disk, None (refused) otherwise."""
        marker = marker_of(payload)
        if marker is None:
            return None
        name, text = marker
        try:
            write_atomically(self.directory / name, text, temporary=self.directory / f".{name}.relay")
        except (OSError, ValueError):  # a full disk, a name the file system refuses: refused, not fatal
            return None
        return b"OK"
