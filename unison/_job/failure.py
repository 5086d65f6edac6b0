"""Failure propagation: turn one rank's failure into a job-wide stop that names it, and bound every exit.

`install` (called by `init()`) chains `sys.excepthook` and `threading.excepthook`. On an uncaught
exception the hook prints what `stop_report` decides (the full report once per failure: the failing
rank's traceback without unison's frames, one line from every other rank; under torchrun also its
error file, `torch_error_file`), then asks the engine to abort the job: the reason
("rank 1 (host, pid 1234) failed: ValueError: boom at train.py:88") travels to the coordinator as a
shutdown request that carries it, and the coordinator's abort response fails every pending handle on
every rank with `AbortedError(reason)`, so ``finally:`` blocks run. If the engine cannot get the abort
through within 2 s (the coordinator or a peer is unreachable), the hook falls back to
``MPI_Abort``, which ends the job without the message reaching the other ranks.

The job is *broken* on this rank once its engine stopped with `AbortedError`, `StallError` or an
internal failure, or once `job_broken` was called: a peer may be frozen, dead or stuck, and MPI may
hold a control operation that will never complete. From then on the process ends within a bound:

* a main thread that is not waiting on unison is interrupted (`JobInterrupt`, a ``KeyboardInterrupt``,
  so ``finally:`` blocks still run; uncaught, it ends the process with status 1, not by SIGINT);
* a process still alive `GRACE_SECONDS` after the break exits with status 1 (a timer thread), and
  SIGALRM, when its action is the default one, ends it `ALARM_SECONDS` after the break even where
  that timer cannot run (C code holding the GIL, a hang inside ``MPI_Finalize``);
* at exit it waits, until `GRACE_SECONDS` after the break, for every rank of the job to reach its
  exit too (an ``MPI_Ibarrier`` polled), then lets MPI finalize (SIGALRM after `FINALIZE_SECONDS`);
  when some rank does not come, it calls ``MPI_Abort``, which makes the MPI launcher end every rank.

A process forked after `init()` is not a rank. An after-fork hook disowns its copy of the engine
(every collective raises `fork_error`) and ends its exit with ``os._exit`` and the status it would
have had, so the child never writes a marker, never sends a message to the peers and never enters
``MPI_Finalize`` on its parent's behalf.

In a process that ``torch.multiprocessing.spawn`` started, spawn's wrapper catches what escapes the
user's function and ends the process with ``sys.exit(1)``, so the hook never sees it: `install` also
has it reported as the hook would, without the traceback, which spawn's parent prints
(`torch_launch.on_spawned_failure`). Else the job would take this rank's exit for an orderly
shutdown, and the other ranks would fail with a `ShutdownError` that does not name the error.

Under ``unisonrun`` the hooks also leave marker files (started, failed, finished) in the launcher's
directory, which is how the launcher names a rank that died.

When the job stalls, deadlocks or a rank fails, every rank writes its flight record, the last
collectives it submitted (`flight_file`), and rank 0 says where, unless unisonrun does. Under
unisonrun, SIGUSR2 makes a rank write its stacks for ``unisonrun --status`` (`stack_dump`).
"""

from __future__ import annotations

import _thread
import atexit
import builtins
import gc
import io
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, cast

from .._contract import FINISHED_AFTER_PEER, LAUNCHER_DIR_VARIABLE, marker_name, send_marker, write_atomically
from ..backends._polling import poll
from ..config import process_environment
from ..engine.flight import record_of
from ..engine.handles import defer_interrupt
from ..errors import AbortedError, HorovodInternalError, JobInterrupt, ShutdownError, StallError
from ..protocol.stall import DEADLOCK_TITLE
from . import stack_dump
from .exit_watch import ExitWatch, watcher_text
from .flight_file import default_directory, write_record
from .stop_report import SHARED_ERRORS, Role, decide, role_of, shared_error
from .summary import describe, parse_reason, user_where, without_unison_frames
from .torch_error_file import after_the_cause, error_file_data, write_error_file
from .torch_launch import on_spawned_failure

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..engine.loop import Engine

__all__ = ["ALARM_SECONDS", "GRACE_SECONDS", "LAUNCHER_DIR_VARIABLE", "abort_job", "describe",
           "fork_error", "install", "is_forked_child", "job_broken", "mark_failed_start", "mark_finished",
           "uninstall"]

log = logging.getLogger("unison")

ABORT_TIMEOUT_SECONDS = 2.0
GRACE_SECONDS = 5.0  # after a break, a rank still alive this long exits with status 1
ALARM_SECONDS = 8  # after a break, SIGALRM ends a process that nothing else could end
FINALIZE_SECONDS = 10  # at exit after every rank arrived, MPI_Finalize gets this long (SIGALRM)
MIN_AGREEMENT_SECONDS = 0.5  # a rank that reaches exit late still waits this long for its peers
_POLL_SECONDS = 0.005
TORCH_ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"  # torchrun's path for a worker's error (JSON)
_MARKER_REPORT_CHARS = 48_000  # a stall report in rank 0's marker (the relay takes lines up to 64 KiB)
_STALL_FEED_LOG = "unison.engine.stall_feed"  # where rank 0 logs the stall inspector's reports


_ThreadingHook = Callable[[threading.ExceptHookArgs], object]


class _State:
    engine: Engine | None = None
    last_engine: Engine | None = None  # kept after uninstall(): the exit agreement asks whether its thread runs
    rank = 0
    size = 1
    mpi: ModuleType | None = None  # the mpi4py MPI module once unison initialized MPI in this process
    comm: MPI.Comm | None = None  # the job's communicator: where the exit agreement runs
    host = ""
    launcher_dir: Path | None = None
    launcher_relay = ""  # KEY@HOST:PORT: where markers go when launcher_dir is not on this host
    under_launcher = False  # unisonrun (or unison.run) started this rank and reports its failures
    after_peer = False  # the main thread ends with an uncaught ShutdownError: a peer's exit stopped it
    error_file_written = False  # torchrun's error file holds this process's first uncaught error
    failure_recorded = False  # a failed-R marker was written: the first one names the cause
    previous_excepthook: Callable[[type[BaseException], BaseException, TracebackType | None], object] | None = None
    previous_threading_excepthook: _ThreadingHook | None = None
    aborted_reason = ""  # set once this rank has started aborting the job
    trailer_printed = False
    broken_reason = ""  # set once the job is broken on this rank
    broken_at = 0.0  # time.monotonic() of the break
    grace_timer: threading.Timer | None = None
    fork_hook_registered = False
    exit_watch: ExitWatch | None = None  # under plain mpiexec: says when this rank ends without a word
    forked = False  # this process was forked from a rank after init()
    child_status: int | None = None  # forked child: the exit status it asked for
    child_interrupted = False  # forked child: ended by an uncaught KeyboardInterrupt
    interrupting = False  # unison interrupted the main thread: its SIGINT raises JobInterrupt
    reporting = False  # the main thread is in the exception hook: no interrupt may cut its report
    flight_dir: Path | None = None  # where this rank's flight record goes (`flight_file`)
    flight_written = False  # this rank wrote its record for this job's stop


_state = _State()


def _launcher_dir(raw: str) -> Path | None:
    return Path(raw) if raw and os.path.isdir(raw) else None


def _write_marker(name: str, text: str) -> None:
    """Leave marker `name` for the launcher; never raises (what comes after it, an abort above all, must run)."""
    directory = _state.launcher_dir
    if _state.forked:
        return
    if name.startswith(marker_name("failed", "")):
        _state.failure_recorded = True
    try:
        if directory is None:
            if _state.launcher_relay and not send_marker(_state.launcher_relay, name, text):
                _state.launcher_relay = ""  # unreachable once: do not make every later marker wait too
            return
        write_atomically(directory / name, text)
    except OSError:  # the launcher is gone or the directory was removed; nothing left to tell
        pass
    except Exception as exc:  # noqa: BLE001  (named here; the marker is a report, the job goes on stopping)
        log.warning("unison: rank %d could not leave its %s marker for the launcher: %s: %s", _state.rank, name,
                    type(exc).__name__, exc)


def install(engine: Engine, rank: int, size: int, mpi: ModuleType | None, launcher_dir: str = "",
            comm: MPI.Comm | None = None, launcher_relay: str = "", host: str = "") -> None:
    """Chain the exception hooks and attach the abort plumbing to a freshly started engine.

    `launcher_dir` is ``UNISON_LAUNCHER_DIR``, set by unisonrun for the ranks it starts. `comm` is the
    job's communicator (mpi4py), where the exit agreement of a broken job runs; without it,
    ``COMM_WORLD`` when the job spans it, else a broken job's exit skips MPI finalization.
    `launcher_relay` is ``UNISON_LAUNCHER_RELAY``: where the markers go when `launcher_dir` is not on
    this host. `host` is the name this rank's host goes by in messages (default: the machine's name;
    in an elastic launch, the elastic host it runs as).
    """
    _state.engine = _state.last_engine = engine
    _state.rank, _state.size, _state.mpi = rank, size, mpi
    if comm is None and mpi is not None and mpi.COMM_WORLD.Get_size() == size:
        comm = mpi.COMM_WORLD
    _state.comm = comm
    _state.host = host or socket.gethostname()
    _state.aborted_reason = ""
    _state.trailer_printed = False
    _state.launcher_dir = _launcher_dir(launcher_dir)
    _state.launcher_relay = launcher_relay if launcher_dir and _state.launcher_dir is None else ""
    _state.under_launcher = _state.launcher_dir is not None or bool(_state.launcher_relay)
    _state.failure_recorded = _state.after_peer = False
    settings = engine.settings
    record_of(engine).resize(settings.flight_records)
    if engine.stall is not None:
        engine.stall.show_stacks = settings.stall_stacks
    _state.flight_dir = default_directory(settings.flight_dir, _state.launcher_dir)
    _state.flight_written = False
    stack_dump.arm(_state.launcher_dir, rank)  # unisonrun --status asks for this rank's stacks
    _quiet_stop_reports(_state.under_launcher)
    engine.on_stop = _on_engine_stop
    if _state.previous_excepthook is None:
        _state.previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
        _state.previous_threading_excepthook = threading.excepthook
        threading.excepthook = _threading_excepthook
    _state.interrupting = _state.reporting = False
    on_spawned_failure(_spawned_function_failed)  # only where torch.multiprocessing.spawn started this process
    _take_sigint()
    if not _state.fork_hook_registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _state.fork_hook_registered = True
    # the machine's own name, whatever name messages use: the launcher finds its local ranks by it
    _write_marker(marker_name("started", rank), f"{socket.gethostname()} {os.getpid()}\n")
    _settle_exit_watch()
    if _state.launcher_dir is None and not _state.launcher_relay and mpi is not None and size > 1:
        # No launcher of unison's sees how this rank ends (plain mpiexec): a watcher outside it does.
        _state.exit_watch = ExitWatch.start(watcher_text(rank, _state.host, os.getpid()))


def mark_failed_start(rank: int, reason: str, launcher_dir: str = "", launcher_relay: str = "") -> None:
    """Leave ``failed-R`` with `reason` for the launcher: this rank's own set-up failed in ``init()``.

    Called before the rank tells the others (who then fail too, as its consequence), so that the
    launcher names this rank, not the first of them to exit.
    """
    _state.rank = rank
    _state.launcher_dir = _launcher_dir(launcher_dir)
    _state.launcher_relay = launcher_relay if launcher_dir and _state.launcher_dir is None else ""
    _write_marker(marker_name("failed", rank), reason + "\n")
    _settle_exit_watch()


def uninstall() -> None:
    """Restore the hooks that were there before `install`."""
    if _state.previous_excepthook is not None:
        if sys.excepthook is _excepthook:
            sys.excepthook = _state.previous_excepthook
        if threading.excepthook is _threading_excepthook:
            # install() saved both hooks together
            threading.excepthook = cast(_ThreadingHook, _state.previous_threading_excepthook)
        _state.previous_excepthook = None
        _state.previous_threading_excepthook = None
    stack_dump.disarm()
    _quiet_stop_reports(False)
    _state.engine = None


def mark_finished() -> None:
    """Tell the launcher this rank shut unison down in order (so its exit is not a failure).

    A rank of a broken job says so only at exit, once every rank got there (`_finish_broken_job`).
    """
    _settle_exit_watch()  # shut down, or its failure was reported: either way not a silent end
    if (_state.engine is not None and not _state.aborted_reason and not _state.broken_reason
            and not _state.failure_recorded):
        # After an uncaught ShutdownError the exit status (1) is the consequence of a peer's exit.
        _write_marker(marker_name("finished", _state.rank), (FINISHED_AFTER_PEER if _state.after_peer else "") + "\n")


def _settle_exit_watch() -> None:
    watch = _state.exit_watch
    if watch is not None:
        watch.settle()


def is_forked_child() -> bool:
    """Whether this process was forked from a rank after `init()` (it is not a rank itself)."""
    return _state.forked


def fork_error() -> HorovodInternalError:
    """The error every unison call that needs the job raises in a process forked after `init()`."""
    return HorovodInternalError(
        f"unison cannot be used in a process forked after init(): this process (pid {os.getpid()}) is a "
        f"copy of rank {_state.rank}, not a rank of the job, and its collectives would never be answered. "
        f"Run collectives in rank {_state.rank}'s own process and pass the results to the child (for "
        "example through a multiprocessing queue or pipe)."
    )


def job_broken(reason: str, comm: MPI.Comm | None = None) -> None:
    """Record that the job is broken on this rank, and bound how long this process may still live.

    Call it where a lost peer is detected (frozen, dead, stuck) or a collective step cannot complete;
    the engine's stop with `AbortedError`/`StallError` calls it already. From any thread; only the
    first call counts. Afterwards the process exits with status 1 after `GRACE_SECONDS` if still
    running, SIGALRM ends it after `ALARM_SECONDS`, and at exit it waits for every rank to reach exit
    until `GRACE_SECONDS` after the break, or ends the job with ``MPI_Abort``.

    Args:
        reason: what broke, naming the rank(s); printed if the exit agreement fails.
        comm: the job's communicator, when `install` has not run yet (a peer lost inside ``init()``).
    """
    if _state.forked or _state.broken_reason:
        return
    _state.broken_reason = reason or "the job is broken"
    _settle_exit_watch()  # the reason is printed by whoever found it: this rank's end is explained
    _state.broken_at = time.monotonic()
    if comm is not None:  # broken before install(), inside init(): this is the job
        _state.comm, _state.rank, _state.size = comm, comm.Get_rank(), comm.Get_size()
        _state.host = _state.host or socket.gethostname()
        if _state.mpi is None:
            from mpi4py import MPI  # only reached with an mpi4py communicator in hand

            _state.mpi = MPI
    timer = threading.Timer(GRACE_SECONDS, _exit_after_grace, args=(_state.broken_reason,))
    timer.daemon = True
    timer.start()
    _state.grace_timer = timer
    _arm_alarm(ALARM_SECONDS)


def _breaks_job(error: BaseException) -> bool:
    # ShutdownError is an orderly end (a peer shut down); an exact HorovodInternalError is the engine
    # thread failing, after which the peers wait for this rank's cycles in vain.
    return isinstance(error, (AbortedError, StallError)) or type(error) is HorovodInternalError


def _arm_alarm(seconds: int, replace: bool = False) -> None:
    """Make SIGALRM end the process within `seconds` (or sooner, if an earlier bound is pending and
    not `replace`), unless the application uses SIGALRM itself."""
    try:
        if signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL:
            return
        left = signal.alarm(0)
        signal.alarm(min(left, seconds) if left and not replace else seconds)
    except (ValueError, OSError):  # no alarm on this platform
        pass


def abort_job(exc: BaseException) -> None:
    """Stop every rank because `exc` escaped on this one; fall back to MPI_Abort if that fails.

    Does nothing for errors that are themselves the consequence of the job stopping (an
    `AbortedError`, a `ShutdownError`), or when unison is not running here.
    """
    engine = _state.engine
    if engine is None or engine.state != "running" or _state.aborted_reason:
        return
    if isinstance(exc, (AbortedError, ShutdownError)):
        return
    reason = describe(exc, _state.rank, _state.host, os.getpid())
    _settle_exit_watch()  # this rank's own error, reported by its hook
    if _state.size < 2:  # nobody to stop, but the launcher names this rank (an elastic driver, its host)
        if not _state.failure_recorded:
            _write_marker(marker_name("failed", _state.rank), reason + "\n")
        return
    _state.aborted_reason = reason
    _write_marker(marker_name("failed", _state.rank), reason + "\n")
    if engine.abort(reason, ABORT_TIMEOUT_SECONDS):
        return
    if engine.state != "running" and not isinstance(engine.stop_error, AbortedError):
        return  # the job stopped on its own (shutdown, stall) while we tried
    _stderr(f"unison: {reason}; the other ranks could not be told within {ABORT_TIMEOUT_SECONDS:.0f} s, "
            "calling MPI_Abort.")
    _leave_flight_record(reason)
    if _state.mpi is not None:
        from ..backends.mpi import abort_with_output

        abort_with_output(_state.mpi.COMM_WORLD)
    os._exit(1)


def _stderr(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def _trailer(exc: BaseException, role: Role) -> None:
    """Print the line that says why this rank stopped and who reports the failure (`stop_report`)."""
    if _state.trailer_printed:
        return
    engine = _state.engine or _state.last_engine
    stop = engine.stop_error if engine is not None else None
    reason, error = str(exc), shared_error(exc) or type(exc).__name__
    if isinstance(exc, JobInterrupt) or (role is Role.OWN and not _state.aborted_reason
                                         and isinstance(stop, HorovodInternalError)
                                         and not isinstance(exc, HorovodInternalError)):
        # Stopped while not waiting on unison (interrupted), or the program's own error came after
        # the job stopped: the stop is what to tell.
        reason = str(stop or _state.broken_reason or _state.aborted_reason or exc)
        error = type(stop).__name__ if stop is not None else error
        if role is Role.OWN:
            role = Role.CONSEQUENCE
    said = decide(role, rank=_state.rank, who=f"rank {_state.rank} ({_state.host}, pid {os.getpid()})",
                  where=user_where(exc), error=error, reason=reason, under_launcher=_state.under_launcher,
                  aborted_reason=_state.aborted_reason, logged=isinstance(stop or exc, StallError))
    if said.line:
        _state.trailer_printed = True
        _stderr(said.line)
    _leave_error_file(exc, role, said.line)


def _leave_error_file(exc: BaseException, role: Role, line: str) -> None:
    """Under torchrun, write its error file for this process's first uncaught error (`torch_error_file`)."""
    path = process_environment().get(TORCH_ERROR_FILE_VARIABLE, "")
    if not path or _state.error_file_written or _state.forked:
        return
    _state.error_file_written = True
    engine = _state.engine or _state.last_engine
    stop = engine.stop_error if engine is not None else None
    stalled = isinstance(stop or exc, StallError)
    consequence = after_the_cause(role, _state.rank, str(exc), stalled)
    if role is Role.CONSEQUENCE:
        callstack = line or f"{type(exc).__name__}: {exc}"
        if stalled and not consequence:  # rank 0 found the stall: its report, which rank 0 alone logged
            callstack = "\n".join(part.rstrip() for part in str(stop or exc).strip().splitlines()) + "\n" + callstack
    else:
        callstack = "".join(traceback.format_exception(type(exc), exc, without_unison_frames(exc.__traceback__)))
        if line:
            callstack += line + "\n"
    write_error_file(path, error_file_data(f"{type(exc).__name__}: {exc}", callstack, time.time(), consequence))


def _traceback_shown(role: Role) -> bool:
    """Whether this rank prints the traceback of its uncaught error (`stop_report`'s table); at the
    DEBUG log level every rank prints it whole."""
    if log.isEnabledFor(logging.DEBUG) or role is Role.OWN:
        return True
    return role is Role.SHARED and _state.rank == 0 and not _state.under_launcher


def _shortened(exc: BaseException, tb: TracebackType | None) -> TracebackType | None:
    """`tb` and the tracebacks of the errors chained to `exc` without unison's own frames (but at DEBUG)."""
    if log.isEnabledFor(logging.DEBUG):
        return tb
    seen: set[int] = set()
    chained = exc.__cause__ or exc.__context__
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        chained.__traceback__ = without_unison_frames(chained.__traceback__)
        chained = chained.__cause__ or chained.__context__
    shortened = without_unison_frames(tb)
    exc.__traceback__ = shortened  # Python's own hook prints the exception's traceback, whatever it is given
    return shortened


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    previous = _state.previous_excepthook or sys.__excepthook__

    def show_traceback(role: Role) -> None:
        if _traceback_shown(role):
            previous(exc_type, exc, _shortened(exc, tb))

    _report_uncaught(exc, show_traceback)


def _spawned_function_failed(exc: Exception) -> None:
    """torch.multiprocessing.spawn's wrapper caught `exc` from the function it ran and ends this process:
    report it as the exception hook would (the parent prints its traceback), so that the other ranks
    stop naming it instead of taking this rank's exit for a shutdown."""
    if _state.previous_excepthook is None or _state.forked:
        return  # unison's hooks are not installed here (shut down already): the hook would not have run
    _report_uncaught(exc, lambda role: None)


def _report_uncaught(exc: BaseException, show_traceback: Callable[[Role], object]) -> None:
    """What an error that ends the main thread makes this rank do: its report, then the job's abort."""
    # The main thread is ending with its own error: an abort from another rank must not interrupt
    # its report (the traceback was cut and replaced by "Error in sys.excepthook").
    _state.reporting = True
    _state.after_peer = isinstance(exc, ShutdownError) and not isinstance(exc, StallError)
    role = role_of(exc)
    if role is Role.SHARED and _state.under_launcher and _state.engine is not None and not _state.failure_recorded:
        # Every rank's own call site reaches the launcher, also where another rank's abort came first.
        _write_marker(marker_name("failed", _state.rank), describe(exc, _state.rank, _state.host, os.getpid()) + "\n")
    show_traceback(role)
    try:
        abort_job(exc)
    finally:
        _trailer(exc, role)


def _threading_excepthook(args: threading.ExceptHookArgs) -> None:
    previous = _state.previous_threading_excepthook or threading.__excepthook__
    previous(args)
    if args.exc_value is None or args.exc_type is SystemExit:
        return
    try:
        abort_job(args.exc_value)
    finally:
        _trailer(args.exc_value, role_of(args.exc_value))


def _on_engine_stop(error: BaseException, waiting: bool) -> None:
    """Engine hook: once the job is broken, make sure this process ends within the bound."""
    if not _breaks_job(error):
        return
    if not waiting and not _state.aborted_reason and not _state.reporting:
        # The main thread is not blocked on unison, so it would not notice: interrupt it (Python
        # code gets KeyboardInterrupt and unwinds through its finally: blocks). A rank stuck in its
        # own code past a stall is stopped this way too.
        _interrupt_main()
    if isinstance(error, StallError) and _state.rank == 0:
        # rank 0 found the stall; the launcher prints its report, which names the stuck ranks and where
        # each rank is (and rank 0's log leaves it out: `_quiet_stop_reports`).
        report = "\n".join(line.rstrip() for line in str(error).strip().splitlines())
        if len(report) > _MARKER_REPORT_CHARS:
            report = report[:_MARKER_REPORT_CHARS] + "\n... (cut here: the report is longer)"
        what = "deadlocked" if str(error).startswith(DEADLOCK_TITLE) else "stalled"
        _write_marker(marker_name("failed", 0), f"the job {what} (found by rank 0, {_state.host}, pid {os.getpid()}):\n"
                                  f"{report}\n")
    job_broken(str(error))
    _leave_flight_record(str(error))


def _is_stop_report(record: logging.LogRecord) -> bool:
    """A log filter: False for the stall inspector's report of a stop (`StallFeed.check` marks it)."""
    return not getattr(record, "unison_stop_report", False)


def _quiet_stop_reports(quiet: bool) -> None:
    """Under unisonrun, rank 0 leaves the report of a stall that stops the job to the launcher, which
    prints it once (from the marker); its warnings before that, which the launcher does not see, stay."""
    logger = logging.getLogger(_STALL_FEED_LOG)
    logger.removeFilter(_is_stop_report)
    if quiet:
        logger.addFilter(_is_stop_report)


def _leave_flight_record(reason: str) -> None:
    """Write this rank's flight record for a stop that broke the job; rank 0 says where, unless unisonrun
    does. Not for an error every rank raised alike (a mismatch): its message names the calls."""
    engine = _state.engine or _state.last_engine
    if engine is None or _state.flight_written or _state.forked or _state.flight_dir is None:
        return
    parsed = parse_reason(reason.strip().splitlines()[0] if reason.strip() else "")
    if parsed is not None and parsed.error in SHARED_ERRORS:
        return
    _state.flight_written = True
    path = write_record(engine, _state.flight_dir, _state.rank, _state.size, _state.host, reason)
    if path is not None and _state.rank == 0 and not _state.under_launcher and _state.size > 1:
        _stderr(f"unison: each rank's last collectives are in {path.parent} ({path.name} and the others'); "
                f"python -m unison.launcher.flight {path.parent} shows them side by side.")

def _interrupt_main() -> None:
    # A real SIGINT aimed at the main thread also wakes it from a blocking call such as time.sleep;
    # interrupt_main alone only takes effect at the next bytecode. Respect a user's own handler.
    main = threading.main_thread()
    _state.interrupting = True
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _on_sigint) and main.ident is not None:
        signal.pthread_kill(main.ident, signal.SIGINT)
    else:
        _thread.interrupt_main()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """Python's default SIGINT handler, except for unison's own interrupt of a stopped job, which raises
    `JobInterrupt`: uncaught, a plain KeyboardInterrupt ends the process by SIGINT, and MPICH's
    mpiexec then combines that signal with the others' statuses into a crash that never happened
    (SIGINT's 2 with a SIGKILL's 9 reads as signal 11, a segmentation fault). While the main thread runs
    a cycle of the job (a blocking call's own) the interrupt waits for the cycle's end: the peers could
    not finish a cycle that this rank left half way (`unison.engine.handles.defer_interrupt`)."""
    if defer_interrupt():
        return
    if _state.reporting:
        return  # the main thread is printing its own error's report; it ends right after
    if _state.interrupting:
        engine = _state.engine or _state.last_engine
        why = (engine.stop_error if engine is not None else None) or _state.broken_reason or _state.aborted_reason
        raise JobInterrupt(f"unison stopped the job: {why}")
    signal.default_int_handler(signum, frame)


def _take_sigint() -> None:
    """Install `_on_sigint` where Python's default handler is (from the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    except (ValueError, OSError):  # not the main interpreter, or no signals here
        pass


def _exit_after_grace(reason: str) -> None:
    _stderr(f"unison: rank {_state.rank} still running {GRACE_SECONDS:.0f} s after the job stopped "
            f"({reason}); exiting with status 1.")
    _flush_stdio()
    os._exit(1)


# -- exit ------------------------------------------------------------------------------------------


def _at_exit() -> None:
    """Last Python exit handler (registered at import, so it runs after `shutdown()`'s): end a forked
    child without touching the job, and bound the end of a broken job."""
    if _state.forked:
        if _state.mpi is not None:
            _end_child()
        return
    if _state.broken_reason:
        _finish_broken_job()


def _finish_broken_job() -> None:
    """Agree with every rank that all reached exit before MPI finalizes, or end the job with MPI_Abort."""
    timer = _state.grace_timer
    if timer is not None:
        timer.cancel()  # the agreement below has its own deadline, the same one
    _flush_stdio()
    deadline = max(_state.broken_at + GRACE_SECONDS, time.monotonic() + MIN_AGREEMENT_SECONDS)
    comm, mpi = _state.comm, _state.mpi
    engine_busy = _state.last_engine is not None and _state.last_engine.thread_alive
    usable = comm is not None and mpi is not None and (not engine_busy or mpi.Query_thread() == mpi.THREAD_MULTIPLE)
    if mpi is None and _state.size > 1:
        # A job without MPI (launched by torchrun): there is no MPI to finalize or abort, and the
        # error was reported (stdio is flushed above); end now, and torchrun stops the ranks left.
        os._exit(1)
    if _state.size < 2 or (usable and _everyone_arrives(cast("MPI.Comm", comm), deadline)):  # usable: a comm
        if not _state.aborted_reason and not _state.failure_recorded:
            _write_marker(marker_name("finished", _state.rank), "\n")
        # Every rank is here, so MPI_Finalize only waits for a busy machine: a fresh bound of its
        # own, not what the break's 8 s left (3 s fired on a loaded machine: exit status 14).
        _arm_alarm(FINALIZE_SECONDS, replace=True)
        return
    reason = " ".join(part.strip() for part in _state.broken_reason.splitlines())
    line = (f"rank {_state.rank} ({_state.host}, pid {os.getpid()}): the job stopped ({reason}) "
            f"and not every rank reached its exit within {GRACE_SECONDS:.0f} s (a rank is frozen, dead or "
            "stuck); ending every rank with MPI_Abort.")
    if not _state.failure_recorded:  # the first failure this rank reported is the cause
        _write_marker(marker_name("failed", _state.rank), line + "\n")
    _stderr("unison: " + line)
    if usable:
        try:
            from ..backends.mpi import abort_with_output

            abort_with_output(cast("MPI.Comm", comm))  # usable: a comm
        except Exception:  # noqa: BLE001 - os._exit below still ends this process
            pass
    os._exit(1)


def _everyone_arrives(comm: MPI.Comm, deadline: float) -> bool:
    """Nonblocking barrier over `comm`, polled until `deadline`: True once every rank entered it."""
    try:
        request = comm.Ibarrier()
        return poll(deadline, request.Test, _POLL_SECONDS, _POLL_SECONDS)
    except Exception:  # noqa: BLE001 - MPI is unusable here: treat as not arrived
        return False


# -- processes forked after init() -----------------------------------------------------------------


def _after_fork_in_child() -> None:
    if _state.mpi is None and _state.engine is None:
        return  # unison has not run in this process: nothing of the job to protect
    _state.forked = True
    watch, _state.exit_watch = _state.exit_watch, None
    if watch is not None:
        watch.forget_in_child()
    _state.launcher_dir = None
    _state.launcher_relay = ""
    _state.grace_timer = None  # timer threads do not survive fork; alarms are not inherited
    engine, _state.engine = _state.engine, None
    if engine is not None:
        engine.disown(fork_error())
    if _state.mpi is None:
        return  # no MPI (a single process): the child's normal exit is harmless
    # The child must not reach MPI_Finalize (mpi4py calls it after the exit handlers; it would act for
    # the parent's rank and hang): `_at_exit` ends it with os._exit and the status recorded here.
    original_exit = sys.exit

    def child_exit(status: str | int | None = None) -> None:
        _state.child_status = _exit_status(status)
        original_exit(status)

    sys.exit = child_exit  # type: ignore[assignment]
    for name in ("exit", "quit"):
        quitter = getattr(builtins, name, None)
        if quitter is not None:
            setattr(builtins, name, _recording(quitter))
    previous_hook = sys.excepthook

    def child_excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        _state.child_status = 1
        _state.child_interrupted = issubclass(exc_type, KeyboardInterrupt)
        previous_hook(exc_type, exc, tb)

    sys.excepthook = child_excepthook


def _recording(quitter: Callable[[str | int | None], object]) -> Callable[[str | int | None], None]:
    def call(status: str | int | None = None) -> None:
        _state.child_status = _exit_status(status)
        quitter(status)

    return call


def _exit_status(status: object) -> int:
    # As the interpreter does: None is 0, an int is itself, anything else is printed and 1.
    if status is None:
        return 0
    return status & 0xFF if isinstance(status, int) else 1


def _end_child() -> None:
    """End a forked child now, skipping MPI finalization, with the status it would have had."""
    for obj in gc.get_objects():  # what the interpreter's own teardown would have flushed
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass
    _flush_stdio()
    if _state.child_interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(_state.child_status or 0)


atexit.register(_at_exit)
