"""``hvd.mpi_ops._basics``: the process-set table as Horovod's basics object shows it.

Horovod's framework modules hold a `HorovodBasics` object whose methods read its C++ core; scripts
and Horovod's own tests read the process-set table through it
(``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``). This object answers those reads from
unison's job, with Horovod's return values and errors.
"""

from __future__ import annotations

from ..._job.runtime import job

__all__ = ["Basics", "basics"]

_NOT_REGISTERED = "Process set does not exist or has not been registered."


class Basics:
    """The registered process sets, read from the job (which raises before `init()`)."""

    def __repr__(self) -> str:
        return "<unison basics: the process-set table of unison.tensorflow>"

    def _get_process_set_ids_and_ranks(self) -> dict[int, list[int]]:
        """Every registered process set: id -> its sorted global ranks (0 is the global set).

        Example:
            >>> hvd.mpi_ops._basics._get_process_set_ids_and_ranks()   # doctest: +SKIP
            {0: [0, 1], 1: [0], 2: [1]}
        """
        return {set_id: list(ranks) for set_id, ranks in sorted(job().registered_sets().items())}

    def _process_set_size(self, process_set_id: int) -> int:
        """The number of ranks in a registered set; `ValueError` for an unknown id."""
        members = job().set_members(process_set_id)
        if members is None:
            raise ValueError(f"{_NOT_REGISTERED} Got process_set_id={process_set_id}.")
        return len(members)

    def _process_set_rank(self, process_set_id: int) -> int:
        """This process's rank inside a registered set; `ValueError` if unknown or not a member."""
        current = job()
        members = current.set_members(process_set_id)
        if members is None:
            raise ValueError(f"{_NOT_REGISTERED} Got process_set_id={process_set_id}.")
        if current.rank not in members:
            raise ValueError(
                f"Process is not part of provided process set: rank {current.rank} is not in "
                f"process set {process_set_id} (ranks {list(members)})."
            )
        return list(members).index(current.rank)


basics = Basics()
