"""Elastic training for PyTorch (``horovod.torch.elastic``): run under ``unisonrun --host-discovery-script``.

Example:
    >>> import unison.torch as hvd                                               # doctest: +SKIP
    >>> state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0)  # doctest: +SKIP
    >>> @hvd.elastic.run
    ... def train(state): ...                                                    # doctest: +SKIP
"""

from ..._job.runtime import init, shutdown
from ...adapters.torch.elastic import ElasticSampler, TorchState
from ...elastic._state import HostsUpdatedInterrupt, ObjectState, State, run, run_fn
from ...errors import HorovodInternalError

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
