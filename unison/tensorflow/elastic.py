"""Elastic training for TensorFlow (``horovod.tensorflow.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0)     # doctest: +SKIP
    >>> @hvd.elastic.run
    ... def train(state): ...                                                   # doctest: +SKIP
"""

from .._job.runtime import init, rank, shutdown
from ..adapters.tensorflow.elastic import TensorFlowKerasState, TensorFlowState
from ..adapters.tensorflow.functions import broadcast_object, broadcast_object_fn, broadcast_variables
from ..elastic._state import HostsUpdatedInterrupt, ObjectState, State, run, run_fn
from ..errors import HorovodInternalError

__all__ = [
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "TensorFlowState",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "init",
    "rank",
    "run",
    "run_fn",
    "shutdown",
]
