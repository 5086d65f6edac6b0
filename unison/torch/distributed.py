"""torch.distributed's ``"unison"`` backend: importing this (or ``unison.torch``) registers it.

Example:
    >>> import torch.distributed as dist, unison.torch                      # doctest: +SKIP
    >>> dist.init_process_group("unison")      # under unisonrun, mpiexec  # doctest: +SKIP
    >>> model = torch.nn.parallel.DistributedDataParallel(model)           # doctest: +SKIP
"""

from ..adapters.torch.process_group import BACKEND_NAME, UnisonProcessGroup, UnisonWork, job_store, register

__all__ = ["BACKEND_NAME", "UnisonProcessGroup", "UnisonWork", "job_store", "register"]

register()
