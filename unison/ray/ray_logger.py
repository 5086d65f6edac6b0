"""``horovod.ray.ray_logger``: send dictionaries from the workers to the callbacks of ``run``/``execute``."""

from ._logger import configure, log

__all__ = ["configure", "log"]
