"""Reduce operations and the kinds of collective, with Horovod's numeric codes."""

from __future__ import annotations

import enum

__all__ = [
    "Adasum",
    "Average",
    "COLLECTIVE_KINDS",
    "CollectiveKind",
    "Kind",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "TextEnum",
]


class ReduceOp(enum.IntEnum):
    """How an allreduce or reducescatter combines the ranks' values (Horovod's codes)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


class TextEnum(str, enum.Enum):
    """An enum whose members are their string values: they compare equal to, print and format as
    the value (on every Python version; 3.12 changed how mixed-in enums format)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Kind(TextEnum):
    """What a request asks the job to do, and what a response tells every rank to do.

    The first ten members are the collectives a rank can request (`COLLECTIVE_KINDS`); a response
    runs one of them, or fails some tensors (``ERROR``), stops the job (``ABORT``, ``STALL``), or
    applies the autotuner's next parameters at the end of the cycle (``TUNE``, see
    `unison.protocol.autotune`). ``CollectiveKind`` and ``ResponseKind`` are this enum under the
    names requests and responses use. The value is the name used in op names, on the wire and in
    the timeline.

    A `str` mixin, so a kind compares equal to its value (``Kind.ALLREDUCE == "allreduce"``) and
    formats as it.

    Example:
        >>> Kind.ALLREDUCE == "allreduce", f"{Kind.BROADCAST}", Kind.BROADCAST.upper
        (True, 'broadcast', 'BROADCAST')
    """

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"
    ADD_PROCESS_SET = "add_process_set"
    REMOVE_PROCESS_SET = "remove_process_set"
    SHUTDOWN = "shutdown"
    ERROR = "error"
    ABORT = "abort"
    STALL = "stall"
    TUNE = "tune"

    # A property, not `str.upper()`: Horovod's messages are written ``f"{kind.upper} of ..."``.
    @property
    def upper(self) -> str:  # type: ignore[override]
        """The upper-case spelling used in Horovod's messages and timeline (ALLREDUCE, ...)."""
        return self.value.upper()

    @property
    def is_collective(self) -> bool:
        """Whether a rank may request this kind (the ten collectives, not a response-only kind)."""
        return self in COLLECTIVE_KINDS


CollectiveKind = Kind
"""The name requests use for `Kind` (one enum: a request's kind is a response's kind)."""

COLLECTIVE_KINDS: frozenset[Kind] = frozenset(tuple(Kind)[:10])
"""The kinds a rank may request; the others (error, abort, stall, tune) exist only in responses."""

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
