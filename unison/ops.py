"""Reduce operations and collective kinds, with Horovod's numeric codes."""

from __future__ import annotations

import enum

__all__ = ["Adasum", "Average", "CollectiveKind", "Max", "Min", "Product", "ReduceOp", "Sum"]


class ReduceOp(enum.IntEnum):
    """How an allreduce or reducescatter combines the ranks' values (Horovod's codes)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


class CollectiveKind(enum.Enum):
    """What a request asks the job to do; the value is the name used in op names and the timeline."""

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

    @property
    def upper(self) -> str:
        """The upper-case spelling used in Horovod's messages and timeline (ALLREDUCE, ...)."""
        return self.value.upper()


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
