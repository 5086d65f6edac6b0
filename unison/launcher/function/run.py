"""`unison.run`: call a Python function on N local processes under mpiexec and collect the results."""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..._contract import LAUNCHER_DIR_VARIABLE
from ..._contract import LAUNCHER_HOSTS_VARIABLE as HOSTS_VARIABLE
from ...elastic.membership import Epoch
from ...errors import AbortedError, LaunchError, ShutdownError
from ..elastic.driver import ElasticOptions, run_elastic
from ..mpi.lines import rank_tags
from ..mpi.mpiexec import find_mpiexec
from ..supervision.keeper import command as keeper_command
from ..supervision.reaper import JobDirectory
from ..supervision.supervise import exit_status, report, supervise
from .options import plan

__all__ = ["run"]

_Result = TypeVar("_Result")


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised on another rank (the ``__cause__``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def run(func: Callable[..., _Result], args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None,
        num_proc: int | None = None, min_num_proc: int | None = None, max_num_proc: int | None = None,
        slots: int | None = None, reset_limit: int | None = None, cooldown_range: object = None,
        hosts: str | None = None, hostfile: str | None = None, host_discovery_script: str | None = None,
        start_timeout: float | None = None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
        disable_cache: bool | None = None, output_filename: str | None = None, verbose: int | None = None,
        use_gloo: bool | None = None, use_mpi: bool | None = None, mpi_args: str | None = None,
        network_interface: str | None = None, network_interfaces: object = None, executable: str | None = None,
        np: int | None = None, min_np: int | None = None, max_np: int | None = None, *,
        timeout: float | None = None, env: Mapping[str, str] | None = None, mpiexec: str = "",
        elastic_timeout: float | None = None) -> list[_Result]:
    """Run ``func(*args, **kwargs)`` on `num_proc` local processes; return the results in rank order.

    Each process is an MPI rank started by the mpiexec that matches mpi4py (as `unisonrun` does);
    `func` calls ``unison.init()`` itself, like a training script would. `func`, its arguments and its
    result travel by pickle through files in a private temporary directory: this is meant for local
    processes of the same user, never for untrusted data. `func` must therefore be importable by name:
    a module-level function. A function defined in the script you run works too, because each rank
    re-imports that script under the name ``__mp_main__``, so guard the script's entry point with
    ``if __name__ == "__main__":`` (the rule of `multiprocessing`'s spawn mode).

    If `func` raises on any rank, every rank is stopped and the first failing rank's exception is
    re-raised here, with a note naming the rank and its traceback chained as the cause.

    It takes every argument of ``horovod.run``, in the same order. Those that concern Gloo or other
    machines are refused with an error that says what to do; those that only matter for other
    machines or for Horovod's own launcher are accepted and change nothing
    (docs/migrating-from-horovod.md has the table).

    `host_discovery_script` makes the job elastic, run by the same driver as ``unisonrun
    --host-discovery-script`` (docs/elastic.md): one launch per membership epoch, relaunched from the
    last commit when a rank fails or the hosts change. `func` then trains inside a
    ``hvd.elastic.run``-decorated function with an elastic state, as in Horovod's elastic examples, and
    the results are those of the ranks of the last epoch. The hosts the script prints must be names
    of this machine (`unison.run` collects the results from local files). The elastic arguments with
    `hosts` (``hosts="localhost:1,127.0.0.1:1", min_num_proc=1``, as in ``horovod.run``) make an
    elastic job on those fixed hosts: a failed host leaves it (for good, or for its cooldown).

    Args:
        func: the function to run on every rank.
        args: positional arguments for `func`.
        kwargs: keyword arguments for `func`.
        num_proc: number of processes (default: the slots of `hosts`/`hostfile`, else 2).
        min_num_proc: fewest processes of an elastic job (default: `num_proc`); `min_np` is its alias.
        max_num_proc: most processes of an elastic job (default: every slot discovered); alias `max_np`.
        slots: slots of a host the discovery script prints without ``:slots``.
        reset_limit: stop (LaunchError) when an elastic job would be reset more than this many times.
        cooldown_range: (low, high): a host whose rank failed stays out low * 2**n seconds plus up to low
            of jitter after its n-th failure, at most high (Horovod's backoff; default: for good).
        host_discovery_script: a program printing the available hosts, ``host:slots`` per line;
            polled every second; makes the job elastic.
        hosts: ``"localhost:N"``; every host named must be this machine (use `unisonrun -H` for others).
        hostfile: a file of such hosts, ``host:N`` or ``host slots=N`` per line.
        start_timeout: seconds each rank's ``init()`` waits for the others to arrive.
        ssh_port, ssh_identity_file, disable_cache, verbose, network_interface, network_interfaces:
            accepted; no effect on processes of this machine.
        output_filename: a directory for each rank's output files, instead of this process's streams.
        use_gloo: must not be true (unison has no Gloo backend).
        use_mpi: accepted: the ranks always run under mpiexec (False means "no preference", as in Horovod).
        mpi_args: extra mpiexec arguments, as one string.
        executable: the Python that runs each rank (default: this one); unison must be installed there.
        np: Horovod's deprecated name for `num_proc`.
        timeout: stop the job and raise `LaunchError` after this many seconds.
        env: extra environment variables for the ranks.
        mpiexec: path of the mpiexec to use (default: the one matching mpi4py).
        elastic_timeout: seconds an elastic job waits for `min_num_proc` slots (default:
            ``HOROVOD_ELASTIC_TIMEOUT``, else 600).

    Raises:
        InvalidArgumentError: an argument that unison.run cannot honour.
        LaunchError: the job could not start, timed out, or a rank died without a result; an elastic
            job also when it stopped (reset limit, every host blacklisted, elastic_timeout).

    Example:
        >>> def work(scale):                                   # in mymodule.py
        ...     import unison, numpy as np
        ...     unison.init()
        ...     return float(unison.allreduce(np.ones(1) * scale, op=unison.Sum)[0])
        >>> unison.run(work, args=(2.0,), num_proc=2)          # doctest: +SKIP
        [4.0, 4.0]
    """
    import shlex

    elastic = {"min_num_proc": min_num_proc, "max_num_proc": max_num_proc, "slots": slots,
               "reset_limit": reset_limit, "cooldown_range": cooldown_range,
               "host_discovery_script": host_discovery_script, "min_np": min_np, "max_np": max_np}
    decided = plan(num_proc=num_proc, np=np, hosts=hosts, hostfile=hostfile, start_timeout=start_timeout,
                   output_filename=output_filename, use_gloo=use_gloo, use_mpi=use_mpi,
                   executable=executable, elastic=elastic, elastic_timeout=elastic_timeout)
    np = decided.num_proc
    found = find_mpiexec(mpiexec)
    fn = func
    main = sys.modules.get("__main__")
    main_path = ""
    if getattr(fn, "__module__", None) == "__main__":
        main_path = os.path.abspath(getattr(main, "__file__", "") or "")
        if not main_path or not os.path.exists(main_path):
            raise LaunchError(
                f"unison.run needs an importable function; {getattr(fn, '__qualname__', fn)!r} was defined "
                "interactively. Put it in a module (or a script file) and import it."
            )
    if decided.output_dir:
        os.makedirs(decided.output_dir, exist_ok=True)
    with JobDirectory("unison-run-") as job_directory:
        job = job_directory.path
        directory = str(job)
        (job / "meta.json").write_text(json.dumps({"main_path": main_path, "sys_path": list(sys.path)}))
        with open(job / "job.pkl", "wb") as f:
            pickle.dump({"fn": fn, "args": tuple(args), "kwargs": dict(kwargs or {})}, f)
        run_env = dict(os.environ)
        run_env.update(decided.env)
        run_env.update(env or {})
        run_env[LAUNCHER_DIR_VARIABLE] = directory
        run_env[HOSTS_VARIABLE] = decided.hosts or f"localhost:{np}"  # horovod.run's default hosts: localhost
        python = decided.executable or sys.executable
        if decided.elastic is not None:
            return _run_elastic(decided.elastic, [python, "-m", "unison.launcher.function.bootstrap", directory], job,
                                {**decided.env, **(env or {})}, mpiexec=mpiexec, mpi_args=mpi_args or "",
                                output_dir=decided.output_dir, timeout=timeout)
        program = keeper_command([python, "-m", "unison.launcher.function.bootstrap", directory])
        extra = shlex.split(mpi_args or "")
        tags = rank_tags(found.vendor, decided.output_dir, extra)  # each rank's lines whole through the relay
        cmd = found.command(np, program, extra=extra, output_dir=decided.output_dir,
                            env=run_env, env_names=[*decided.env, *(env or {})], tags=tags)
        outcome = supervise(cmd, job, run_env, timeout=timeout, keepers=True, tags=tags)
        results: list[_Result] = []
        if outcome.timed_out:  # the ranks' KeyboardInterrupts (the stop is a Ctrl-C) are its consequence
            raise LaunchError(f"unison.run: the job ran past timeout={timeout:g} s; stopped every rank.")
        errors = _read_errors(job, np)
        if errors:
            _raise_first(errors, np)
        if outcome.interrupted:
            raise KeyboardInterrupt
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


def _read_errors(directory: Path, np: int) -> dict[int, dict[str, Any]]:
    errors: dict[int, dict[str, Any]] = {}
    for rank in range(np):
        error_file = directory / f"error-{rank}.pkl"
        if error_file.exists():
            with open(error_file, "rb") as f:
                errors[rank] = pickle.load(f)
    return errors


def _run_elastic(options: ElasticOptions, program: list[str], job: Path, env: dict[str, str], *,
                 mpiexec: str, mpi_args: str, output_dir: str, timeout: float | None) -> list[Any]:
    """Run the pickled call in `job` as an elastic job; the results of the last epoch's ranks."""
    epochs: list[Epoch] = []
    status = run_elastic(options, program, mpiexec=mpiexec, mpi_args=mpi_args, env_pairs=sorted(env.items()),
                         timeout=timeout, output_dir=output_dir, on_epoch=epochs.append)
    if status in (130, 143):  # Ctrl-C or SIGTERM
        raise KeyboardInterrupt
    if status == 124:  # the ranks' KeyboardInterrupts (the stop is a Ctrl-C) are its consequence
        raise LaunchError(f"unison.run: the elastic job ran past timeout={timeout:g} s; stopped every rank.")
    if status != 0 or not epochs:
        # The newest epoch whose function raised says why; else the driver's reason, printed above.
        for epoch in reversed(epochs):
            errors = _read_errors(job / f"epoch-{epoch.number}", epoch.np)
            if errors:
                _raise_first(errors, epoch.np)
        raise LaunchError(f"unison.run: the elastic job stopped with exit status {status}; the elastic "
                          "driver's reason is printed above (unisonrun: elastic: ...).")
    last = epochs[-1]
    results: list[Any] = []
    for rank in range(last.np):
        result_file = job / f"epoch-{last.number}" / f"result-{rank}.pkl"
        if not result_file.exists():
            raise LaunchError(f"unison.run: rank {rank} of {last.np} of the elastic job's last epoch "
                              f"({last.number}) returned no result.")
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
