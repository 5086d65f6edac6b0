"""The job's lifecycle and topology: init, shutdown, rank/size getters, build probes and the timeline switch.

`init()` is the same four steps for every launch (`unison._job.launch`): detect the launch and join
it, the bounded start-up check, the settings agreement, then the engine on the launch's transport.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
import threading
from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from ..config import Settings, load_settings, settings_despite_errors
from ..engine.loop import Engine, EngineStatistics
from ..errors import ConfigError, NotInitializedError, UnnamedThreadError
from ..process_sets import ProcessSet, global_process_set, unbind
from . import failure as _failure
from .launch import Launch, Request, agree_settings, detect
from .launch.hosts import host_name as _host_name
from .outputs import configure_logging, open_timeline, open_tune_log
from .probes import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built
from .sets import bind_again, check_process_sets, register_sets

if TYPE_CHECKING:
    from ..engine.timeline import Timeline
    from ..protocol.messages import Request as CollectiveRequest
    from .calls import Call

__all__ = [
    "Job", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled",
    "init", "is_homogeneous", "is_initialized", "job", "join_job", "local_rank", "local_size", "mpi_built",
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
    launch: str = ""  # the launch that made the job (`unison._job.launch`): "mpi", "torch" or "single"
    store: Any = None  # the torch store the ranks met at (a torch rendezvous launch), else None
    # ProcessSet objects bound by a repeated init(process_sets=[...]) to sets already registered
    rebound_sets: list[ProcessSet] = dataclasses.field(default_factory=list)
    handle_counter: int = 0
    # Horovod's integer handles: id -> the call it stands for (`unison._job.submit.handle_of`)
    handles: dict[int, Call[Any]] = dataclasses.field(default_factory=dict)
    # the requests of calls that recur, made once (`unison._job.submit`): key -> request
    requests: dict[tuple[object, ...], CollectiveRequest] = dataclasses.field(default_factory=dict)
    # blocking NumPy allreduces seen before, by their arguments (`unison._job.submit.steady_allreduce`)
    steady: dict[tuple[object, ...], CollectiveRequest] = dataclasses.field(default_factory=dict)
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
    _init(comm, process_sets, None)


def join_job(request: Request) -> None:
    """Start the job from what ``init_process_group("unison")`` handed its factory (an MPI rank keeps its place)."""
    _init(None, None, request)


def _init(comm: Any, process_sets: Sequence[ProcessSet] | str | None, request: Request | None) -> None:
    global _job, _atexit_registered
    if _failure.is_forked_child():
        raise _failure.fork_error()
    with _init_lock:
        if _job is not None and _job.engine.state == "running":
            if process_sets is not None and not isinstance(process_sets, str):
                bind_again(_job, process_sets)
            return
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
            # What does parse still counts (the launcher's directory above all: the marker that names
            # this rank as the one that could not start goes there), so the failure is reported as this rank's.
            problem, settings = exc, settings_despite_errors(**overrides)
        logging.getLogger("unison").setLevel(
            {"trace": 5, "fatal": logging.CRITICAL}.get(settings.log_level, settings.log_level.upper())
        )
        launch = detect(comm, request, _shutdown_before_finalize, settings)
        launch.join(settings)
        timeline = tune_log = None
        if problem is None:
            try:
                check_process_sets(process_sets, launch.size)  # type: ignore[arg-type]
                timeline = open_timeline(settings, launch.rank)
                tune_log = open_tune_log(settings, launch.rank)
            except Exception as exc:  # noqa: BLE001 - reported to every rank, then re-raised here
                problem = exc
        try:
            launch.check_start(problem, settings)
        except BaseException:
            if timeline is not None:
                timeline.close()
            raise
        configure_logging(settings, launch.rank, launch.size)
        place = launch.place()
        agree_settings(launch.exchange, settings)
        backend = launch.connect(settings, place)
        _job = _start_engine(launch, backend, settings, place, process_sets, timeline, tune_log,  # type: ignore[arg-type]
                             comm)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def _start_engine(launch: Launch, backend: Any, settings: Settings, place: Any,
                  process_sets: Sequence[ProcessSet] | None, timeline: Timeline | None,
                  tune_log: TextIO | None, comm: Any = None) -> Job:
    """Register the process sets, start the engine on `backend` and hand it to the failure handling."""
    registered, sets, duplicates = register_sets(backend, process_sets, launch.mpi, comm)
    engine = Engine(backend, settings, registered, timeline, tune_log)
    engine.executor.device_plane_factory = _make_device_plane
    if getattr(backend, "control", None) is not None:  # the gRPC control plane (over MPI or gloo)
        from ..service.setup import watch_engine

        watch_engine(backend, engine)
    engine.start()
    rank, size = backend.rank, backend.size
    _failure.install(engine, rank, size, launch.mpi, settings.launcher_dir, comm=launch.comm,
                     launcher_relay=settings.launcher_relay, host=_host_name(settings, rank))
    if getattr(launch, "reforms_in_place", False):
        # An elastic worker outlives its epoch: a lost peer ends the epoch, not this process (no interrupt,
        # no exit timer); its `run` wrapper re-forms the job, and the elastic driver names the failure.
        engine.on_stop = None
    current = Job(engine, settings, rank, size, place.local_rank, place.local_size, place.cross_rank,
                  place.cross_size, place.homogeneous, mpi=launch.mpi, process_sets=sets, launch=launch.name,
                  store=launch.store)
    log.debug("rank %d/%d initialized with %s (%r)", rank, size, backend, launch)
    if duplicates is not None:
        global _job
        _job = current
        raise duplicates
    return current


def _shutdown_before_finalize() -> None:
    """At exit, before MPI_Finalize: the job's own shutdown, if an init() that raised left it running."""
    if _job is not None:
        shutdown()


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


def leave_job() -> None:
    """End this process's part of the job at once, without the shutdown exchange (its peers are gone or
    re-forming): the transport abandons its waits, the engine stops and fails what is pending. For an
    elastic worker between two epochs; `init()` then joins the next."""
    global _job
    with _init_lock:
        current = _job
        if current is None:
            return
        current.engine.backend.abandon()
        current.engine.shutdown(timeout=2.0)  # its exchange ends at once (abandoned); the thread closes the backend
        # The failure hooks stay (the next epoch's init() points them at its engine): between epochs an
        # uncaught error is still reported, and SIGUSR2 still writes the stacks (unisonrun --status).
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
    current = job()
    mpi = current.mpi
    if mpi is None:
        how = {"torch": f"its {current.size} processes met at a torch store and run on gloo",
               "elastic": f"its {current.size} processes are an elastic epoch on gloo",
               "single": "it is a single process"}.get(current.launch, "it runs without MPI")
        raise ValueError(f"MPI is not in use in this job: {how}. mpi_threads_supported() is about MPI's "
                         "thread level, which only a job launched by unisonrun or mpiexec has.")
    return bool(mpi.Query_thread() == mpi.THREAD_MULTIPLE)


def mpi_enabled() -> bool:
    """Whether this job uses MPI."""
    return _get("mpi") is not None


def gloo_enabled() -> bool:
    """Whether this job's data moves on torch's gloo (its ranks met at a torch store: torchrun,
    ``init_process_group("unison")`` started by mp.spawn, Lightning or Accelerate; docs/torch.md)."""
    return _job is not None and _job.launch in ("torch", "elastic")


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
