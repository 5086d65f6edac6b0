"""`unison.run`: call a Python function on N local processes under mpiexec and collect the results."""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._failure import LAUNCHER_DIR_VARIABLE
from ..errors import AbortedError, LaunchError, ShutdownError
from ._keeper import command as keeper_command
from ._mpiexec import find_mpiexec
from ._reaper import JobDirectory
from ._supervise import exit_status, report, supervise

__all__ = ["run"]


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised on another rank (the ``__cause__``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
        np: int = 2, *, timeout: float | None = None, env: Mapping[str, str] | None = None,
        mpiexec: str = "", mpi_args: str = "") -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on `np` local processes; return the results in rank order.

    Each process is an MPI rank started by the mpiexec that matches mpi4py (as `unisonrun` does);
    `fn` calls ``unison.init()`` itself, like a training script would. `fn`, its arguments and its
    result travel by pickle through files in a private temporary directory: this is meant for local
    processes of the same user, never for untrusted data. `fn` must therefore be importable by name:
    a module-level function. A function defined in the script you run works too, because each rank
    re-imports that script under the name ``__mp_main__``, so guard the script's entry point with
    ``if __name__ == "__main__":`` (the rule of `multiprocessing`'s spawn mode).

    If `fn` raises on any rank, every rank is stopped and the first failing rank's exception is
    re-raised here, with a note naming the rank and its traceback chained as the cause.

    Args:
        fn: the function to run on every rank.
        args: positional arguments for `fn`.
        kwargs: keyword arguments for `fn`.
        np: number of processes.
        timeout: stop the job and raise `LaunchError` after this many seconds.
        env: extra environment variables for the ranks.
        mpiexec: path of the mpiexec to use (default: the one matching mpi4py).
        mpi_args: extra mpiexec arguments, as one string.

    Raises:
        LaunchError: the job could not start, timed out, or a rank died without a result.

    Example:
        >>> def work(scale):                                   # in mymodule.py
        ...     import unison, numpy as np
        ...     unison.init()
        ...     return float(unison.allreduce(np.ones(1) * scale, op=unison.Sum)[0])
        >>> unison.run(work, args=(2.0,), np=2)                # doctest: +SKIP
        [4.0, 4.0]
    """
    import shlex

    if np < 1:
        raise LaunchError(f"np must be at least 1. Got np={np}.")
    found = find_mpiexec(mpiexec)
    main = sys.modules.get("__main__")
    main_path = ""
    if getattr(fn, "__module__", None) == "__main__":
        main_path = os.path.abspath(getattr(main, "__file__", "") or "")
        if not main_path or not os.path.exists(main_path):
            raise LaunchError(
                f"unison.run needs an importable function; {getattr(fn, '__qualname__', fn)!r} was defined "
                "interactively. Put it in a module (or a script file) and import it."
            )
    with JobDirectory("unison-run-") as job_directory:
        job = job_directory.path
        directory = str(job)
        (job / "meta.json").write_text(json.dumps({"main_path": main_path, "sys_path": list(sys.path)}))
        with open(job / "job.pkl", "wb") as f:
            pickle.dump({"fn": fn, "args": tuple(args), "kwargs": dict(kwargs or {})}, f)
        run_env = dict(os.environ)
        run_env.update(env or {})
        run_env[LAUNCHER_DIR_VARIABLE] = directory
        program = keeper_command([sys.executable, "-m", "unison.launcher._bootstrap", directory])
        cmd = found.command(np, program, extra=shlex.split(mpi_args))
        outcome = supervise(cmd, job, run_env, timeout=timeout, keepers=True)
        results: list[Any] = []
        errors: dict[int, dict[str, Any]] = {}
        for rank in range(np):
            error_file = job / f"error-{rank}.pkl"
            if error_file.exists():
                with open(error_file, "rb") as f:
                    errors[rank] = pickle.load(f)
        if errors:
            _raise_first(errors, np)
        if outcome.interrupted:
            raise KeyboardInterrupt
        if outcome.timed_out:
            raise LaunchError(f"unison.run: the job ran past timeout={timeout:g} s; stopped every rank.")
        status = exit_status(outcome)
        for rank in range(np):
            result_file = job / f"result-{rank}.pkl"
            if not result_file.exists():
                report(outcome)
                why = "; ".join(outcome.failures.values()) or f"the job ended with exit status {status}"
                raise LaunchError(f"unison.run: rank {rank} of {np} returned no result: {why}")
            with open(result_file, "rb") as f:
                results.append(pickle.load(f))
        return results


def _raise_first(errors: dict[int, dict[str, Any]], np: int) -> None:
    def consequence(item: tuple[int, dict[str, Any]]) -> bool:
        return item[1]["type"] in (AbortedError.__name__, ShutdownError.__name__)

    rank, info = sorted(errors.items(), key=lambda item: (consequence(item), item[0]))[0]
    exc = info.get("exception")
    if not isinstance(exc, BaseException):
        exc = LaunchError(f"{info['type']}: {info['message']}")
    note = f"(raised by unison.run's function on rank {rank} of {np}; its traceback is above)"
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(note)
    raise exc from RemoteTraceback(f"\n\nTraceback on rank {rank}:\n{info['traceback']}")
