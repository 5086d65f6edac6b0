"""``horovod.common.exceptions``: the errors Horovod's training loops catch."""

from ..elastic._state import HostsUpdatedInterrupt
from ..errors import HorovodInternalError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
