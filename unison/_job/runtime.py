"""The job's lifecycle and topology: init, shutdown, rank/size getters, build probes and the timeline switch."""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from .._contract import ELASTIC_HOSTS_VARIABLE, host_of, parse_hosts
from ..backends import create_backend
from ..config import Settings, disagreement, job_wide_values, load_settings, process_environment
from ..engine.loop import Engine, EngineStatistics
from ..errors import (
    ConfigError,
    InvalidArgumentError,
    NotInitializedError,
    StartupError,
    UnisonNotImplementedError,
    UnnamedThreadError,
)
from ..process_sets import ProcessSet, bind, global_process_set, unbind
from . import failure as _failure
from .torch_launch import check_settings_agree, torch_backend, torch_launch, torch_launched_alone

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..engine.timeline import Timeline

__all__ = [
    "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled",
    "init", "is_homogeneous", "is_initialized", "job", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "rocm_built", "shutdown", "size",
    "start_timeline", "statistics", "stop_timeline",
]

log = logging.getLogger("unison")


@dataclasses.dataclass
class Job:
    """Everything `init()` set up; replaced on every init/shutdown cycle."""

    engine: Engine
    settings: Settings
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool
    mpi: ModuleType | None  # the mpi4py MPI module, or None for a single process without MPI
    process_sets: dict[int, ProcessSet]
    # ProcessSet objects bound by a repeated init(process_sets=[...]) to sets already registered
    rebound_sets: list[ProcessSet] = dataclasses.field(default_factory=list)
    handle_counter: int = 0
    # handle id -> (engine handles, function turning their raw results into what synchronize returns)
    handles: dict[int, tuple[list[Any], Any]] = dataclasses.field(default_factory=dict)
    names_counters: dict[Hashable, int] = dataclasses.field(default_factory=dict)
    # the one thread that may submit unnamed collectives: the thread that called init()
    unnamed_thread: threading.Thread = dataclasses.field(default_factory=threading.current_thread)
    _names_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def set_members(self, set_id: int) -> tuple[int, ...] | None:
        """The sorted global ranks of registered process set `set_id`, or None when it is not registered.

        The engine keeps the table (add_process_set and remove_process_set change it in cycle order,
        the same on every rank); everything outside the engine asks the job.
        """
        return self.engine.process_sets.get(set_id)

    def registered_sets(self) -> Mapping[int, tuple[int, ...]]:
        """The live table of registered process sets, read-only: set id -> sorted global ranks."""
        return MappingProxyType(self.engine.process_sets)

    def next_name_index(self, key: Hashable) -> int:
        """A call counter per key (e.g. a process set id): default names that match when the members
        of a set make the same calls in the same order."""
        with self._names_lock:
            self.names_counters[key] = self.names_counters.get(key, 0) + 1
            return self.names_counters[key]

    def check_unnamed_thread(self, kind: str) -> None:
        """Refuse an unnamed collective from any thread but the one that called `init()` (see
        `_submit._op_name`); the main thread takes over once that thread has ended.

        The owner must be the same thread on every rank: "the first thread to submit" would be a race
        decided differently on each rank, which is exactly the mix-up this rule prevents.
        """
        me = threading.current_thread()
        owner = self.unnamed_thread
        if owner is me:
            return
        if not owner.is_alive():
            owner = self.unnamed_thread = threading.main_thread()
            if owner is me:
                return
        raise UnnamedThreadError(
            f"Unnamed collectives must come from the thread that called init() ({owner.name!r}); {kind} "
            f"was called without a name from thread {me.name!r}. Unnamed calls are paired across "
            "ranks by their order, which differs between ranks when several threads make them, so one "
            f"thread would receive another's tensors. Pass name=... to the {kind} calls made from "
            "other threads (the same name on every rank)."
        )


_job: Job | None = None
_init_lock = threading.RLock()
_atexit_registered = False
_mpi_started_here = False  # unison called MPI_Init_thread (the application set mpi4py.rc.initialize = False)


def _make_device_plane(*args: Any, **kwargs: Any) -> Any:
    """Make the executor's GPU data plane at the first device response (CPU jobs never import it)."""
    from ..gpu.plane import create_device_plane

    return create_device_plane(*args, **kwargs)


def job() -> Job:
    """The running job, or `NotInitializedError`."""
    current = _job
    if current is None:
        raise NotInitializedError()
    return current


def _launcher_size() -> int:
    env = process_environment()
    # SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: the latter is also set for a plain `python x.py` inside
    # an `sbatch --ntasks=4` script, which is a job of one process.
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        if key in env:
            try:
                return int(env[key])
            except ValueError:
                continue
    return 1


def _torch_job_of_one() -> ConfigError | None:
    """The error for a process that torch's launcher counts as one of several while unison's job has
    only it: each would train alone on all the data and exit 0, so it is refused.

    torchrun (and Ray Train, PyTorchJob, Lightning, Accelerate) start processes with torch's env://
    variables and no MPI; `init()` without a launcher of its own then makes a job of one process.

    Example:
        >>> _torch_job_of_one() is None  # no torch launcher here
        True
    """
    env = process_environment()
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world <= 1:
        return None
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "a launcher of torch's env:// variables"
    return ConfigError(
        f"This process was started by {launcher} as rank {env.get('RANK', '?')} of WORLD_SIZE={world}, but "
        "unison's job has only this process: each process would train alone on all the data. Start unison "
        f"jobs with unisonrun or mpiexec instead (unisonrun -np {world} python <script>), or, in a torch job, "
        "use torch.distributed with its own backends."
    )


def _host_name(settings: Settings, rank: int) -> str:
    """The name this rank's host goes by in messages: in an elastic launch the elastic host it runs as
    (the driver names hosts, and several may share one machine), else the machine's name."""
    if settings.elastic_driver and settings.elastic_hosts:
        try:
            hosts = parse_hosts(settings.elastic_hosts, ELASTIC_HOSTS_VARIABLE)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return host_of(hosts, rank) or socket.gethostname()
    return socket.gethostname()


def _resolve_comm(mpi: Any, comm: Any) -> Any:
    world = mpi.COMM_WORLD
    if comm is None:
        return world
    if hasattr(comm, "Get_rank"):
        return comm
    ranks = sorted(int(r) for r in comm)
    bad = [r for r in ranks if not 0 <= r < world.Get_size()]
    if bad or not ranks:
        raise InvalidArgumentError(
            f"init(comm=[...]) needs world ranks in range({world.Get_size()}). Got {list(comm)}."
        )
    member = world.Get_rank() in ranks
    sub = world.Split(0 if member else mpi.UNDEFINED, key=world.Get_rank())
    if not member:
        raise InvalidArgumentError(
            f"This process (world rank {world.Get_rank()}) is not in init(comm={ranks}); only the "
            "listed ranks may call init()."
        )
    return sub


def _topology(mpi: ModuleType, comm: MPI.Intracomm) -> tuple[int, int, int, int, bool]:
    local = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
    local_rank, local_size = local.Get_rank(), local.Get_size()
    cross = comm.Split(local_rank, key=comm.Get_rank())
    cross_rank, cross_size = cross.Get_rank(), cross.Get_size()
    sizes = comm.allgather(local_size)
    local.Free()
    cross.Free()
    return local_rank, local_size, cross_rank, cross_size, len(set(sizes)) == 1


def _check_settings_agree(comm: MPI.Comm, settings: Settings) -> None:
    """Collective: refuse, on every rank, to start a job whose ranks differ in a job-wide setting
    (it would hang or mix up buffers later)."""
    import numpy as np

    if comm.Get_size() == 1:
        return
    mine = np.frombuffer(json.dumps(job_wide_values(settings), sort_keys=True).encode(), dtype=np.uint8)
    lengths = np.empty(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([mine.size], dtype=np.int64), lengths)
    displs = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(int).tolist()
    gathered = np.empty(int(lengths.sum()), dtype=np.uint8)
    comm.Allgatherv(mine, [gathered, (lengths.astype(int).tolist(), displs)])
    rows = [json.loads(gathered[d : d + n].tobytes()) for d, n in zip(displs, lengths.tolist())]
    problem = disagreement(rows)
    if problem:
        raise ConfigError(problem)


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Start this process's part of the job: discover ranks, start the engine thread.

    Repeated calls while initialized start nothing; one that passes process sets binds those
    ProcessSet objects to the sets already registered with the same ranks. Settings come from
    ``UNISON_*`` (or ``HOROVOD_*``) environment variables, read once here. Where the application kept
    mpi4py from starting MPI (``mpi4py.rc.initialize = False``), init() starts it, and finalizes it at
    exit; an MPI the application started is left to the application.

    Args:
        comm: None for every process of the launch; a list of world ranks; or an mpi4py communicator.
        process_sets: process sets to register now (every rank must pass the same list), or
            ``"dynamic"`` to allow `add_process_set` later.

    Raises:
        InvalidArgumentError: (a ValueError) a process set repeats the ranks of the global set or of
            an earlier one in the list. As in Horovod, the job is initialized nonetheless, with the
            other sets; the repeated ProcessSet is left unregistered. Call init() again with the
            list without it to bind the list's objects.

    Example:
        >>> import unison as hvd
        >>> hvd.init()
        >>> hvd.rank(), hvd.size()
        (0, 1)
        >>> hvd.shutdown()
    """
    global _job, _atexit_registered
    if _failure.is_forked_child():
        raise _failure.fork_error()
    with _init_lock:
        if _job is not None and _job.engine.state == "running":
            if process_sets is not None and not isinstance(process_sets, str):
                _bind_again(_job, process_sets)
            return
        the_comm: Any = None
        overrides: dict[str, Any] = {}
        if process_sets == "dynamic":
            overrides["dynamic_process_sets"] = True
            process_sets = None
        elif isinstance(process_sets, str):
            raise ConfigError(f"process_sets must be a list of ProcessSet or 'dynamic'. Got {process_sets!r}.")
        # A rank that fails on its own (a bad setting, a file it cannot write) must not leave the
        # others blocked in the collective steps below: its error travels in the start-up check.
        problem: BaseException | None = None
        try:
            settings = load_settings(**overrides)
        except ConfigError as exc:
            problem, settings = exc, Settings()
        logging.getLogger("unison").setLevel(
            {"trace": 5, "fatal": logging.CRITICAL}.get(settings.log_level, settings.log_level.upper())
        )
        mpi = None
        timeline = tune_log = None
        launch = torch_launch() if comm is None else None
        if launch is not None:  # torchrun: the store it hosts, the gloo transport; no MPI
            if problem is not None:
                raise problem
            backend: Any = torch_backend(launch, settings)
            check_settings_agree(backend, settings)
            _check_process_sets(process_sets, backend.size)
            timeline = _open_timeline(settings, backend.rank)
            tune_log = _open_tune_log(settings, backend.rank)
            _configure_logging(settings, backend.rank, backend.size)
            topology = launch.topology
        elif importlib.util.find_spec("mpi4py") is not None and (
            comm is not None or _launcher_size() > 1 or (mpi_built() and not torch_launched_alone())
        ):  # a torch launch of one process (torchrun --nproc-per-node 1) starts no MPI, as one of several
            from ..backends.mpi import import_mpi

            if settings.mpi_threads_disable:
                import mpi4py

                mpi4py.rc.thread_level = "serialized"
            from .startup import guard_mpi_start

            launched = _launcher_size()
            with guard_mpi_start(settings.start_timeout_seconds, launched):
                mpi = import_mpi()
                _start_mpi(mpi, settings.mpi_threads_disable)
            the_comm = _resolve_comm(mpi, comm)
            if comm is None and the_comm.Get_size() == 1 and (alone := _torch_job_of_one()) is not None:
                raise alone
            if comm is None and launched > 1 and the_comm.Get_size() == 1:
                raise ConfigError(
                    f"The launcher started {launched} processes, but MPI sees each as a job of size 1: "
                    "the mpiexec used belongs to a different MPI library than the one mpi4py loaded "
                    f"({mpi.Get_library_version().splitlines()[0].strip()}). Launch with the mpiexec "
                    "of that library (with the mpich wheel: the mpiexec in the same environment's bin/)."
                )
            if problem is None:
                try:
                    _check_process_sets(process_sets, the_comm.Get_size())
                    timeline = _open_timeline(settings, the_comm.Get_rank())
                    tune_log = _open_tune_log(settings, the_comm.Get_rank())
                except Exception as exc:  # noqa: BLE001 - reported to every rank, then re-raised here
                    problem = exc
            _start(the_comm, mpi, settings, problem, timeline)
            _configure_logging(settings, the_comm.Get_rank(), the_comm.Get_size())
            topology = _topology(mpi, the_comm)
            _check_settings_agree(the_comm, settings)
            backend = create_backend(settings.controller, the_comm, settings, local_size=topology[1])
        else:
            if problem is not None:
                raise problem
            if comm is not None or _launcher_size() > 1:
                from ..backends.mpi import import_mpi

                import_mpi()  # raises MissingDependencyError naming the extra
            if comm is None and (alone := _torch_job_of_one()) is not None:
                raise alone
            _check_process_sets(process_sets, 1)
            timeline = _open_timeline(settings, 0)
            tune_log = _open_tune_log(settings, 0)
            _configure_logging(settings, 0, 1)
            backend = create_backend("loopback", None, settings)
            topology = (0, 1, 0, 1, True)
        rank, size = backend.rank, backend.size
        registered = {0: tuple(range(size))}
        sets: dict[int, ProcessSet] = {0: global_process_set}
        bind(global_process_set, 0, list(range(size)), rank)
        duplicates: list[tuple[ProcessSet, int]] = []
        for ps in process_sets or []:  # checked locally by _check_process_sets
            ranks = _ranks_of(ps, mpi)
            known = _set_id_of(registered, ranks)
            if known is not None:
                # Horovod registers the other sets, then raises: the job runs, this object stays
                # unregistered (unless it is the very object registered earlier in the list).
                if sets.get(known) is not ps:
                    unbind(ps)
                duplicates.append((ps, known))
                continue
            set_id = len(registered)
            backend.add_process_set(set_id, ranks)
            registered[set_id] = tuple(ranks)
            bind(ps, set_id, ranks, rank)
            sets[set_id] = ps
        engine = Engine(backend, settings, registered, timeline, tune_log)
        engine.executor.device_plane_factory = _make_device_plane
        if getattr(backend, "control", None) is not None:  # the gRPC control plane (over MPI or gloo)
            from ..service.setup import watch_engine

            watch_engine(backend, engine)
        engine.start()
        _failure.install(engine, rank, size, mpi, settings.launcher_dir, comm=the_comm,
                         launcher_relay=settings.launcher_relay, host=_host_name(settings, rank))
        _job = Job(engine, settings, rank, size, *topology, mpi=mpi, process_sets=sets)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
        log.debug("rank %d/%d initialized with %s", rank, size, backend)
        if duplicates:
            raise _duplicate_error(duplicates, registered)


def _start_mpi(mpi: ModuleType, serialized: bool) -> None:
    """Start MPI if the application kept mpi4py from it, and finalize it at exit if so (once)."""
    global _mpi_started_here
    from ..backends.mpi import initialize_mpi

    if initialize_mpi(mpi, serialized) and not _mpi_started_here:
        _mpi_started_here = True
        # Registered before `shutdown` (at the end of the first init()), so it runs after it.
        atexit.register(_finalize_mpi, mpi)


def _finalize_mpi(mpi: ModuleType) -> None:
    """At exit: finalize the MPI that `init()` started, once unison's job has ended cleanly.

    A forked child must not act for its parent's rank. After a broken job (a rank failed, froze or
    stalled) the exit agreement of `unison._job.failure` still needs MPI, and a finalize could wait for
    a rank that will not come: the process then ends without it, as mpi4py's own exit would.
    """
    if _failure.is_forked_child():
        return
    if _job is not None:  # not yet shut down (an init() that raised after registering this)
        shutdown()
    if _failure._state.broken_reason:
        return
    from ..backends.mpi import finalize_mpi

    finalize_mpi(mpi)


def _set_id_of(registered: Mapping[int, tuple[int, ...]], ranks: Sequence[int]) -> int | None:
    """The id of the registered set with exactly these ranks, or None."""
    wanted = tuple(ranks)
    for set_id, members in registered.items():
        if tuple(members) == wanted:
            return set_id
    return None


def _duplicate_error(duplicates: list[tuple[ProcessSet, int]],
                     registered: Mapping[int, tuple[int, ...]]) -> InvalidArgumentError:
    ps, known = duplicates[0]
    where = "the global process set" if known == 0 else f"process set {known}"
    others = "; ".join(f"{set_id}: {list(ranks)}" for set_id, ranks in sorted(registered.items()))
    return InvalidArgumentError(
        f"Attempted to add a duplicate process set: {ps}; its ranks {list(registered[known])} are "
        f"{where}'s. unison is initialized with the other sets (id: ranks {others}); call "
        "init(process_sets=[...]) again with a list without duplicates to bind its ProcessSet objects."
    )


def _bind_again(current: Job, process_sets: Sequence[ProcessSet]) -> None:
    """A repeated init(process_sets=[...]): bind each object to the registered set of its ranks."""
    _check_process_sets(process_sets, current.size)
    registered = current.registered_sets()
    duplicates: list[tuple[ProcessSet, int]] = []
    bound: dict[int, ProcessSet] = {}
    for ps in process_sets:
        ranks = _ranks_of(ps, current.mpi)
        set_id = _set_id_of(registered, ranks)
        if set_id is None:
            listing = "; ".join(f"{i}: {list(r)}" for i, r in sorted(registered.items()))
            raise InvalidArgumentError(
                f"init() was called again with {ps}, whose ranks {list(ranks)} are not a registered "
                f"process set (id: ranks {listing}). Sets are registered by the first init(); add "
                "this one with add_process_set() (init(process_sets='dynamic')), or call shutdown() "
                "first."
            )
        if set_id == 0 or set_id in bound:
            if ps is not global_process_set and bound.get(set_id) is not ps:
                unbind(ps)
            duplicates.append((ps, set_id))
            continue
        bind(ps, set_id, list(ranks), current.rank)
        bound[set_id] = ps
        if current.process_sets.get(set_id) is not ps and all(p is not ps for p in current.rebound_sets):
            current.rebound_sets.append(ps)
    if duplicates:
        raise _duplicate_error(duplicates, dict(registered))


def _check_process_sets(process_sets: Sequence[ProcessSet] | None, size: int) -> None:
    """The local checks of init()'s process_sets (the communicator-based ones are resolved later)."""
    for index, ps in enumerate(process_sets or []):
        if not isinstance(ps, ProcessSet):
            raise InvalidArgumentError(
                f"process_sets must contain ProcessSet objects. Got {type(ps).__name__} at index {index}."
            )
        if ps.mpi_comm is None and ps.ranks is not None:
            bad = [r for r in ps.ranks if not 0 <= r < size]
            if bad or not ps.ranks:
                raise InvalidArgumentError(f"A process set needs ranks in range(size={size}). Got {ps.ranks}.")


def _open_timeline(settings: Settings, rank: int) -> Timeline | None:
    """Rank 0's timeline, opened now so that a path it cannot write fails init() on every rank."""
    if rank != 0 or not settings.timeline or settings.timeline.upper() == "DYNAMIC":
        return None
    from ..engine.timeline import Timeline

    try:
        return Timeline(settings.timeline, mark_cycles=settings.timeline_mark_cycles)
    except ConfigError as exc:  # the others only learn that rank 0 could not start: say it is rank 0
        raise ConfigError(f"{exc} Rank 0 (on host {_host_name(settings, 0)}) writes the timeline.") from None


def _open_tune_log(settings: Settings, rank: int) -> TextIO | None:
    """Rank 0's autotune log, opened now for the same reason as the timeline."""
    if rank != 0 or not settings.autotune or not settings.autotune_log:
        return None
    from ..engine.loop import open_tune_log

    return open_tune_log(settings.autotune_log)


def _start(comm: MPI.Comm, mpi: ModuleType, settings: Settings, problem: BaseException | None,
           timeline: Timeline | None) -> None:
    """The bounded start-up check (`unison._job.startup`): every rank arrived and set up, or all raise.

    A rank whose own set-up failed raises its own error; the others raise `StartupError` naming it.
    When a rank never arrived, the job is broken: this process must not wait for it at exit either.
    """
    from .startup import check_start

    text = ""
    if problem is not None:
        text = f"{type(problem).__name__}: {problem}"
        # Before the others hear of it (and exit, as its consequence): the launcher names this rank.
        rank = comm.Get_rank()
        _failure.mark_failed_start(rank, f"rank {rank} ({_host_name(settings, rank)}, pid {os.getpid()}) could not "
                                   f"start: {text}", settings.launcher_dir, settings.launcher_relay)
    try:
        check_start(comm, mpi, text, settings.start_timeout_seconds)
    except StartupError as exc:
        if timeline is not None:
            timeline.close()
        if exc.missing_ranks:
            _failure.job_broken(str(exc), comm)
        if problem is not None:
            raise problem from None
        raise
    if problem is not None:  # a job of one process: nobody else to tell
        if timeline is not None:
            timeline.close()
        raise problem


class _RankHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """unison's own log output, used only when the application configured no logging."""


def _configure_logging(settings: Settings, rank: int, size: int) -> None:
    """Prefix unison's log lines with the rank, so the output of many ranks stays readable.

    Applications that configure logging themselves (a handler on the root logger or on "unison")
    keep full control; otherwise unison's records go to stderr as
    ``2026-01-01 12:00:00,000 [unison rank 1/4 host] WARNING message`` (no time with
    ``UNISON_LOG_HIDE_TIME=1``).
    """
    logger = logging.getLogger("unison")
    ours = [h for h in logger.handlers if isinstance(h, _RankHandler)]
    if not ours and (logger.handlers or logging.getLogger().handlers):
        return
    handler = ours[0] if ours else _RankHandler()
    when = "" if settings.log_hide_time else "%(asctime)s "
    prefix = f"[unison rank {rank}/{size} {_host_name(settings, rank)}]"
    handler.setFormatter(logging.Formatter(f"{when}{prefix} %(levelname)s %(message)s"))
    if not ours:
        logger.addHandler(handler)
        logger.propagate = False


def _ranks_of(ps: ProcessSet, mpi: ModuleType | None) -> list[int]:
    """A process set's global ranks (a list set was range-checked by `_check_process_sets`)."""
    if ps.mpi_comm is None:
        assert ps.ranks is not None
        return list(ps.ranks)
    if mpi is None:
        raise UnisonNotImplementedError("Communicator-based process sets need MPI.")
    group = ps.mpi_comm.Get_group()
    world_group = mpi.COMM_WORLD.Get_group()
    ranks = mpi.Group.Translate_ranks(group, list(range(group.Get_size())), world_group)
    gathered = mpi.COMM_WORLD.allgather(sorted(ranks) if ps.mpi_comm != mpi.COMM_NULL else None)
    for candidate in gathered:
        if candidate is not None:
            return list(candidate)
    raise InvalidArgumentError("A communicator-based process set has no members.")


def shutdown() -> None:
    """Stop the engine on every rank; pending collectives fail with `ShutdownError`.

    Safe to call more than once, and called automatically at exit.
    """
    global _job
    elastic = sys.modules.get("unison.elastic._state")  # only if an elastic State was ever made
    if elastic is not None and _job is not None:
        elastic.settle_checks()
    with _init_lock:
        current = _job
        if current is None:
            return
        if not current.engine.shutdown():
            _failure.job_broken(f"rank {current.rank}: the other ranks did not answer shutdown within 30 s")
        _failure.mark_finished()
        _failure.uninstall()
        handoff = sys.modules.get("unison.gpu.handoff")  # only if a GPU buffer was ever submitted
        if handoff is not None:
            handoff.reset()
        for ps in [*current.process_sets.values(), *current.rebound_sets]:
            if ps is not global_process_set:
                unbind(ps)
        _job = None


def is_initialized() -> bool:
    """True between `init()` and `shutdown()` (also after the job was stopped by another rank)."""
    return _job is not None


def _get(field: str) -> Any:
    current = _job
    if current is None:
        raise NotInitializedError()
    return getattr(current, field)


def rank() -> int:
    """This process's global rank."""
    return int(_get("rank"))


def size() -> int:
    """Number of processes in the job."""
    return int(_get("size"))


def statistics() -> EngineStatistics:
    """A snapshot of this rank's counters: cycles, cache, executor, backend (and negotiation on rank 0).

    Example:
        >>> import unison as hvd
        >>> hvd.init()  # doctest: +SKIP
        >>> hvd.statistics().cache.hits  # doctest: +SKIP
        0
    """
    current = _job
    if current is None:
        raise NotInitializedError()
    return current.engine.statistics()


def local_rank() -> int:
    """Rank among the processes on this host."""
    return int(_get("local_rank"))


def local_size() -> int:
    """Number of processes on this host."""
    return int(_get("local_size"))


def cross_rank() -> int:
    """Index of this host among the hosts that have a process with this local rank."""
    return int(_get("cross_rank"))


def cross_size() -> int:
    """Number of hosts that have a process with this local rank."""
    return int(_get("cross_size"))


def is_homogeneous() -> bool:
    """True when every host runs the same number of processes."""
    return bool(_get("homogeneous"))


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (user code may call MPI from any thread)."""
    mpi = _get("mpi")
    if mpi is None:
        raise ValueError("MPI is not in use in this job (single process without mpi4py).")
    return bool(mpi.Query_thread() == mpi.THREAD_MULTIPLE)


def mpi_enabled() -> bool:
    """Whether this job uses MPI."""
    return _get("mpi") is not None


def mpi_built() -> bool:
    """Whether mpi4py is installed (callable before init; does not initialize MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def gloo_enabled() -> bool:
    """Whether this job's transport is torch's gloo (a job launched by torchrun, docs/torch.md)."""
    return _job is not None and getattr(_job.engine.backend, "name", "") == "gloo"


def gloo_built() -> bool:
    """Whether the gloo transport can be used: torch is installed (callable before init; imports nothing)."""
    return importlib.util.find_spec("torch") is not None


def nccl_built() -> int:
    """NCCL's version code as CuPy loads it (e.g. 22005 for 2.20.5), or 0 without CuPy or NCCL."""
    from ..gpu.build import nccl_built as probe

    return probe()


def ddl_built() -> bool:
    """Always False."""
    return False


def ccl_built() -> bool:
    """Always False."""
    return False


def cuda_built() -> bool:
    """True when a CUDA build of CuPy imports (the GPU data plane can run where a GPU is visible)."""
    from ..gpu.build import cuda_built as probe

    return probe()


def rocm_built() -> bool:
    """Always False."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline to `file_path` (rank 0 writes; others do nothing).

    Needs ``UNISON_TIMELINE`` (or ``HOROVOD_TIMELINE``) set at init, e.g. to ``DYNAMIC``.
    """
    current = job()
    if not current.settings.timeline:
        raise ValueError("Set UNISON_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    if current.rank != 0:
        return
    from ..engine.timeline import Timeline

    current.engine.set_timeline(Timeline(file_path, mark_cycles=mark_cycles))


def stop_timeline() -> None:
    """Stop writing the timeline and close its file."""
    current = job()
    if not current.settings.timeline:
        raise ValueError("Set UNISON_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    if current.rank == 0:
        current.engine.set_timeline(None)
