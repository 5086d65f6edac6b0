"""``horovod.ray``: run a unison job on a Ray cluster (`RayExecutor`), and the backend in Ray Train (`TorchConfig`).

The workers are Ray actors that meet through torch's ``env://`` rendezvous at rank 0's worker and
run the job on the gloo transport: no MPI and no ssh on the cluster (docs/ray.md).

Example:
    >>> from unison.ray import RayExecutor                                 # doctest: +SKIP
    >>> executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4)  # doctest: +SKIP
    >>> executor.start()                                                   # doctest: +SKIP
    >>> ranks = executor.run(lambda: __import__("unison.torch").torch.init())  # doctest: +SKIP
"""

from typing import Any

from ._executor import RayExecutor
from ._hook import register_backend
from ._placement import PlacementGroupTimeoutError
from ._settings import MiniSettings
from ._worker import BaseHorovodWorker

__all__ = ["BaseHorovodWorker", "MiniSettings", "PlacementGroupTimeoutError", "RayExecutor", "TorchConfig",
           "register_backend"]


def __getattr__(name: str) -> Any:
    """Load the Ray Train pieces on first use: ``ray.train`` and torch take a second or two to import."""
    if name == "TorchConfig":
        from ._train import TorchConfig

        globals()[name] = TorchConfig
        return TorchConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"TorchConfig"})
