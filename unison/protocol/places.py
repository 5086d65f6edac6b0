"""Where each rank is, as it tells rank 0 in a detail cycle: a fixed-size row, and the checked reading of it.

In a cycle whose status rank 0's stall feed asked for (once a second while something waits), every
rank also sends one row of `ROW_BYTES` bytes: a JSON object of its main thread's place (its innermost
user frames), the collective it waits for there and where that collective was called, and its stack
(innermost first), and how many waits its main thread has begun (a number that changed between two
detail cycles says that its earlier wait ended). Rows are a fixed size so that every transport gathers them as it gathers status
rows; a field that does not fit is shortened, the stack first (from its outer end). Rank 0 reads
them back with `read_place`, which turns anything that is not such a row (a peer of another version,
garbage) into None: the report then says nothing of that rank's place.

Example:
    >>> row = encode_place(Place("train.py:41 in step", "allreduce.grad", "train.py:41 in step", ("a.py:1 in f",)))
    >>> len(row) == ROW_BYTES, read_place(row).waits
    (True, 'allreduce.grad')
"""

from __future__ import annotations

import dataclasses
import json

__all__ = ["ROW_BYTES", "Place", "encode_place", "origin_of", "read_place"]

ROW_BYTES = 2048  # one rank's row: 256 uint64 words
_FIELD_CHARS = 400  # the longest place, name or site kept


@dataclasses.dataclass(frozen=True)
class Place:
    """Where one rank's main thread is.

    Attributes:
        at: its innermost user frames (``train.py:41 in step <- train.py:60 in main``), '' if none.
        waits: the collective it waits for ('' when it waits for none).
        site: where that collective was called (`unison.protocol.messages.Request.site`), '' if unknown.
        stack: its frames, innermost first, from the one that called into unison (``file:line in f``).
        wait_number: how many waits (blocking calls) its main thread has begun, -1 if unknown: a main
            thread seen blocked twice with the same number waited all along, one whose number changed
            finished a call in between (`unison.protocol.stall`: a deadlock needs the former).
    """

    at: str
    waits: str = ""
    site: str = ""
    stack: tuple[str, ...] = ()
    wait_number: int = -1

    @property
    def where(self) -> str:
        """The place to name: the main thread's own, with the origin its collective's site names (DDP's
        bucket); the site where the main thread's place is unknown. The site is where the collective
        was first called with its arguments (a recurring call reuses its request), so a call made again
        from another line is named by the main thread's place, which is where it is now."""
        if not self.at:
            return self.site
        origin = origin_of(self.site)
        return f"{self.at} ({origin})" if origin else self.at


def encode_place(place: Place) -> bytes:
    """The row of `place`: its JSON, zero-padded to `ROW_BYTES` (fields shortened to fit)."""
    fields = {"at": place.at[:_FIELD_CHARS], "waits": place.waits[:_FIELD_CHARS],
              "site": place.site[:_FIELD_CHARS], "wait_number": place.wait_number}
    stack = [frame[:_FIELD_CHARS] for frame in place.stack]
    while True:
        data = json.dumps({**fields, "stack": stack}, separators=(",", ":")).encode()
        if len(data) <= ROW_BYTES or not stack:
            break
        stack.pop()  # the outermost frame first
    return data[:ROW_BYTES].ljust(ROW_BYTES, b"\0")


def read_place(row: bytes) -> Place | None:
    """The `Place` of a row made by `encode_place`, or None for anything else."""
    try:
        data = json.loads(bytes(row).rstrip(b"\0"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    text = [data.get(key, "") for key in ("at", "waits", "site")]
    stack = data.get("stack", [])
    number = data.get("wait_number", -1)
    if not all(isinstance(value, str) for value in text) or not isinstance(stack, list) or \
            not all(isinstance(frame, str) for frame in stack) or type(number) is not int:
        return None
    return Place(text[0], text[1], text[2], tuple(stack), number)


def origin_of(site: str) -> str:
    """The origin a site names in parentheses at its end (``DDP bucket 0``), else ''.

    Example:
        >>> origin_of("train.py:41 in step (DDP bucket 0)"), origin_of("train.py:41 in step")
        ('DDP bucket 0', '')
    """
    if not site.endswith(")") or " (" not in site:
        return ""
    return site[site.rindex(" (") + 2:-1]
