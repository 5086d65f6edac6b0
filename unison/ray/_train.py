"""Ray Train's ``TorchConfig`` with the ``unison`` backend: each worker registers it before its process group starts.

Ray Train starts one actor per worker, sets torch's ``env://`` variables in each (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and calls
``init_process_group(backend, init_method="env://", rank=..., world_size=...)`` there. A backend
name torch does not know fails there, so `TorchConfig`'s backend first imports ``unison.torch`` in
every worker (`register_backend`), then lets Ray Train's own torch backend do the rest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import MissingDependencyError
from ._hook import register_backend

try:
    from ray.train.torch import TorchConfig as _RayTorchConfig
    from ray.train.torch.config import _TorchBackend
except ImportError as exc:
    raise MissingDependencyError(f"unison.ray.TorchConfig extends Ray Train's, which cannot be imported ({exc}): "
                                 "pip install 'ray[train]' torch") from None

__all__ = ["TorchConfig", "register_backend"]


class _UnisonTorchBackend(_TorchBackend):  # type: ignore[misc]
    """Ray Train's torch backend, with unison's registered in every worker before the process group starts."""

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        worker_group.execute(register_backend)
        super().on_start(worker_group, backend_config)


@dataclasses.dataclass
class TorchConfig(_RayTorchConfig):  # type: ignore[misc]
    """``ray.train.torch.TorchConfig`` whose backend defaults to ``unison`` and is registered in every worker.

    Example:
        >>> from unison.ray import TorchConfig                             # doctest: +SKIP
        >>> trainer = TorchTrainer(train, torch_config=TorchConfig(),      # doctest: +SKIP
        ...                        scaling_config=ScalingConfig(num_workers=2))
    """

    backend: str | None = "unison"

    @property
    def backend_cls(self) -> type:
        return _UnisonTorchBackend
