"""``horovod.common.process_sets``: process sets and their registration."""

from .._job.objects import add_process_set, remove_process_set
from ..process_sets import ProcessSet, global_process_set

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
