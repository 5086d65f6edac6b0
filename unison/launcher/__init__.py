"""Launching unison jobs: the `unisonrun` command and `run(func, num_proc=N)` for a function on N local processes.

Nothing below this package's two names is public. Its rooms, each a subpackage by what it is for:

- `cli` (``unisonrun``'s options and the launch of a plain job), `check_build` (``--check-build``) and
  `jobs` (this user's running jobs, ``--status``) at the top;
- `mpi`: starting ranks through the mpiexec of the MPI that mpi4py loads: which mpiexec, its command
  line, the variables it passes, the programs it can start, its own messages;
- `supervision`: one launch watched to its end: each rank's keeper, the order of deaths, whom to
  blame, the marker relay and its signed line server, the job's directory and its reaper, MPICH's
  shared-memory segments;
- `hosts`: host lists as users write them, and reaching hosts the way mpiexec does;
- `elastic`: the elastic driver (one launch per membership epoch) and its endpoint;
- `function`: `unison.run`: its options, the launch, and the program each rank runs;
- `pservers`: ``unisonrun --pservers N``: where the parameter servers run, starting and watching them.
"""

from .cli import main
from .function.run import run

__all__ = ["main", "run"]
