"""Elastic training for PyTorch (``horovod.torch.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> import unison.torch as hvd                                               # doctest: +SKIP
    >>> state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0)  # doctest: +SKIP
    >>> @hvd.elastic.run
    ... def train(state): ...                                                    # doctest: +SKIP
"""

from collections.abc import Callable
from typing import Any

from .._runtime import init, shutdown
from ..elastic._state import HostsUpdatedInterrupt, ObjectState, State, run_fn
from ..elastic._torch import ElasticSampler, TorchState
from ..errors import HorovodInternalError

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "init",
    "run",
    "run_fn",
    "shutdown",
]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``train(state, ...)`` for elastic training (see `run_fn`)."""
    return run_fn(func, _reset)


def _reset() -> None:
    """Horovod resets in place (shutdown, init); unison relaunches instead, so nothing runs here."""
