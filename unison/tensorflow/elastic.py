"""Elastic training for TensorFlow (``horovod.tensorflow.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0)     # doctest: +SKIP
    >>> @hvd.elastic.run
    ... def train(state): ...                                                   # doctest: +SKIP
"""

from collections.abc import Callable
from typing import Any

from .._runtime import init, rank, shutdown
from ..adapters.tensorflow.functions import broadcast_object, broadcast_object_fn, broadcast_variables
from ..elastic._state import HostsUpdatedInterrupt, ObjectState, State, run_fn
from ..elastic._tensorflow import TensorFlowKerasState, TensorFlowState
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


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``train(state, ...)`` for elastic training (see `unison.elastic._state.run_fn`)."""
    return run_fn(func, _reset)


def _reset() -> None:
    """Horovod resets in place (shutdown, init); unison relaunches instead, so nothing runs here."""
