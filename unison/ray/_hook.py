"""Register the ``unison`` backend of ``torch.distributed`` in a Ray worker process (a setup hook)."""

from __future__ import annotations

__all__ = ["register_backend"]


def register_backend() -> None:
    """Register torch.distributed's ``unison`` backend in this process (importing ``unison.torch`` does it).

    Ray calls it in every worker process when given as the job's setup hook, so that
    ``init_process_group("unison")`` works in Ray Train's workers:

    Example:
        >>> ray.init(runtime_env={"worker_process_setup_hook": "unison.ray.register_backend"})  # doctest: +SKIP
        >>> TorchTrainer(train, torch_config=ray.train.torch.TorchConfig(backend="unison"), ...)  # doctest: +SKIP
    """
    import unison.torch  # noqa: F401  (registers the backend)
