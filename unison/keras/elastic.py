"""Elastic training for Keras (``horovod.keras.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)                   # doctest: +SKIP
    >>> callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
    ...              hvd.elastic.CommitStateCallback(state)]                      # doctest: +SKIP
"""

from collections.abc import Callable
from typing import Any

from ..elastic._state import HostsUpdatedInterrupt, run_fn
from ..elastic._tensorflow import (
    CommitStateCallback,
    TensorFlowKerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)

KerasState = TensorFlowKerasState

__all__ = [
    "CommitStateCallback",
    "HostsUpdatedInterrupt",
    "KerasState",
    "TensorFlowKerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``train(state, ...)`` for elastic training (see `unison.elastic._state.run_fn`)."""
    return run_fn(func, _reset)


def _reset() -> None:
    """Horovod resets in place (shutdown, init); unison relaunches instead, so nothing runs here."""
