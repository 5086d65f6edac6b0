"""torch's launch variables and stores: where a job that torch's launchers started meets.

torchrun starts each process with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``, and hosts a store there (its agent's); Ray Train, Kubernetes'
PyTorchJob and Accelerate set the same variables. `torch_launch` reads them, `env_store` meets the
other ranks at that store (torch's own ``env://`` rendezvous), and `root_store` finds the store
under torch's prefixes, so that the job (`unison._job.launch.rendezvous`) and the test harness's
barrier (`unison.testing._barrier`) share one store whichever way they reached it.

``torch.multiprocessing.spawn`` runs the user's function inside its wrapper (``_wrap``), which catches
an exception that escapes it, hands the traceback to the parent and ends the process with
``sys.exit(1)``: the exception never reaches ``sys.excepthook``. `on_spawned_failure` lets unison's
failure handling see it there all the same (`unison._job.failure`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from types import CodeType, FrameType
from typing import Any, NoReturn

from ..config import process_environment
from ..errors import ConfigError, MissingDependencyError

__all__ = ["TorchLaunch", "env_store", "on_spawned_failure", "root_store", "spawned_by_torch", "torch_job_of_one",
           "torch_launch", "torch_launched_alone"]

log = logging.getLogger("unison")

_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MPI_LAUNCHERS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "PMI_RANK")
_SPAWN_MODULE = "torch.multiprocessing.spawn"  # where torch.multiprocessing.spawn's wrapper, `_wrap`, lives


class _SpawnFailure:
    """What `on_spawned_failure` installed in this process: the exit it wraps and whom it tells."""

    previous_exit: Callable[..., NoReturn] | None = None  # sys.exit before the wrapper
    report: Callable[[Exception], object] | None = None


_spawn_failure = _SpawnFailure()


@dataclasses.dataclass(frozen=True)
class TorchLaunch:
    """This process's place in a job described by torch's env:// variables."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    restart: int


def torch_launch(env: Mapping[str, str] | None = None) -> TorchLaunch | None:
    """The launch when torch's env:// variables describe a job of several processes and no MPI
    launcher started this one; else None.

    Example:
        >>> torch_launch({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}).rank
        1
        >>> torch_launch({"RANK": "0", "WORLD_SIZE": "2", "PMI_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    """
    env = process_environment() if env is None else env
    if any(name not in env for name in _VARIABLES) or any(name in env for name in _MPI_LAUNCHERS):
        return None
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_size = int(env.get("LOCAL_WORLD_SIZE", str(size)))
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError as exc:
        raise ConfigError(f"torch's launch variables must be integers: {exc}. Got RANK={env.get('RANK')!r}, "
                          f"WORLD_SIZE={env.get('WORLD_SIZE')!r}, LOCAL_RANK={env.get('LOCAL_RANK')!r}.") from None
    if size <= 1:
        return None
    if not 0 <= rank < size:
        raise ConfigError(f"RANK must be in range(WORLD_SIZE={size}). Got RANK={rank}.")
    return TorchLaunch(rank, size, local_rank, local_size, restart)


def torch_launched_alone(env: Mapping[str, str] | None = None) -> bool:
    """Whether torch's env:// variables describe a job of this one process (``torchrun --nproc-per-node 1``)
    and no MPI launcher started it: `init()` then makes a job of one without starting MPI.

    Example:
        >>> torch_launched_alone({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
        True
        >>> torch_launched_alone({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1", "PMI_SIZE": "1"})
        False
    """
    env = process_environment() if env is None else env
    return (all(name in env for name in _VARIABLES) and not any(name in env for name in _MPI_LAUNCHERS)
            and env["WORLD_SIZE"].strip() == "1")


def torch_job_of_one(env: Mapping[str, str] | None = None) -> ConfigError | None:
    """The error for a process that torch's variables count as one of several where no store can be
    reached (``MASTER_ADDR``, ``MASTER_PORT`` or ``RANK`` unset): a job of one process each would train
    alone on all the data, so it is refused.

    Example:
        >>> torch_job_of_one({}) is None
        True
        >>> str(torch_job_of_one({"WORLD_SIZE": "2", "LOCAL_RANK": "1"}))[80:136]
        'WORLD_SIZE=2, but RANK, MASTER_ADDR and MASTER_PORT are '
    """
    env = process_environment() if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world <= 1 or any(name in env for name in _MPI_LAUNCHERS):
        return None
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "a launcher of torch's env:// variables"
    unset = [name for name in _VARIABLES if name not in env]
    named = unset[0] if len(unset) == 1 else ", ".join(unset[:-1]) + " and " + unset[-1]
    return ConfigError(
        f"This process was started by {launcher} as rank {env.get('RANK', '?')} of WORLD_SIZE={world}, but "
        f"{named} {'is' if len(unset) == 1 else 'are'} unset, so unison cannot meet the other processes "
        "and would make a job of this process alone, training alone on all the data. Set RANK, WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT in every process, or call torch.distributed.init_process_group('unison', "
        "rank=..., world_size=...) before unison's init() (Lightning's and Accelerate's strategies do), or "
        f"start the job with unisonrun or mpiexec (unisonrun -np {world} python <script>)."
    )


def env_store(launch: TorchLaunch, timeout_seconds: float) -> Any:
    """torch's store at ``MASTER_ADDR:MASTER_PORT`` (torch's own ``env://`` rendezvous; under torchrun,
    a client of its agent's store), without the prefixes torch adds."""
    try:
        import torch.distributed as dist
    except ImportError:
        raise MissingDependencyError(
            "This process was started by torchrun (torch's env:// variables are set, no MPI launcher), which "
            "needs torch: pip install torch."
        ) from None
    timeout = timedelta(seconds=timeout_seconds or 1800.0)
    store, _, _ = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.size, timeout=timeout))
    return root_store(store)


def root_store(store: Any) -> Any:
    """The store under torch's `PrefixStore` layers (``default_pg/0/cpu/`` for the default group): the
    job's own keys then do not depend on which group or which rendezvous reached the store."""
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _spawn_wrapper_code() -> CodeType | None:
    """The code of torch.multiprocessing.spawn's wrapper of the user's function, if torch is loaded and has one."""
    module = sys.modules.get(_SPAWN_MODULE)
    code = getattr(getattr(module, "_wrap", None), "__code__", None)
    return code if isinstance(code, CodeType) else None


def spawned_by_torch() -> bool:
    """Whether this process's main thread runs inside ``torch.multiprocessing.spawn``'s wrapper of the
    user's function (``mp.spawn``, ``mp.start_processes``): the process is one that spawn started.

    Example:
        >>> spawned_by_torch()
        False
    """
    code = _spawn_wrapper_code()
    if code is None:
        return False
    main = threading.main_thread()
    frame: FrameType | None = (sys._getframe() if threading.current_thread() is main
                               else sys._current_frames().get(main.ident or -1))
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def on_spawned_failure(report: Callable[[Exception], object]) -> bool:
    """In a process that ``torch.multiprocessing.spawn`` started, call `report` with the exception that
    escapes the spawned function, before spawn's wrapper ends the process with it.

    The wrapper catches the exception, writes its traceback for the parent and calls ``sys.exit(1)``:
    ``sys.exit`` is wrapped to call `report` first, when its caller is that wrapper and an exception is
    being handled, and otherwise to exit as it always does. Elsewhere (not started by spawn, or a torch
    whose wrapper is another) nothing is installed. Calling it again replaces `report`.

    Returns:
        Whether the wrapper of ``sys.exit`` is in place (this process is one that spawn started).
    """
    code = _spawn_wrapper_code()
    if code is None or not spawned_by_torch():
        return False
    _spawn_failure.report = report
    if _spawn_failure.previous_exit is not None:
        return True
    previous = _spawn_failure.previous_exit = sys.exit

    def exit_after_report(status: str | int | None = None, /) -> NoReturn:
        handled = sys.exc_info()[1]
        caller = sys._getframe(1)
        tell = _spawn_failure.report
        if caller.f_code is code and isinstance(handled, Exception) and tell is not None:
            try:
                tell(handled)
            except Exception as exc:  # noqa: BLE001 - named here; the process must still end as spawn asked
                log.warning("unison: could not report the error that ended the function torch.multiprocessing."
                            "spawn started (%s: %s): %s: %s", type(handled).__name__, handled, type(exc).__name__, exc)
        previous(status)

    sys.exit = exit_after_report
    return True
