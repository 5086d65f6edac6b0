"""``horovod.common.util``: `gpu_available`, the one name of it that training scripts call."""

from .._job.gpu_available import gpu_available

__all__ = ["gpu_available"]
