"""Failure propagation: turn one rank's uncaught exception into a job-wide abort that names it.

`install` (called by `init()`) chains `sys.excepthook` and `threading.excepthook`. On an uncaught
exception the hook prints the traceback as before, then asks the engine to abort the job: the reason
("rank 1 (host, pid 1234) failed: ValueError: boom at train.py:88") travels to the coordinator as a
shutdown request that carries it, and the coordinator's abort response fails every pending handle on
every rank with `AbortedError(reason)`, so ``finally:`` blocks run. If the engine cannot get the abort
through within 2 s (the coordinator or a peer is unreachable), the hook falls back to
``MPI_Abort``, which ends the job without the message reaching the other ranks.

A rank that learns of an abort and is not waiting on a collective has its main thread interrupted
(``KeyboardInterrupt``, so ``finally:`` blocks still run); any rank still alive `GRACE_SECONDS` after
the abort exits with status 1. Under ``unisonrun`` the hooks also leave marker files (started,
failed, finished) in the launcher's directory, which is how the launcher names a rank that died.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import AbortedError, HorovodInternalError, ShutdownError

__all__ = ["GRACE_SECONDS", "LAUNCHER_DIR_VARIABLE", "abort_job", "describe", "install", "mark_finished",
           "uninstall"]

log = logging.getLogger("unison")

ABORT_TIMEOUT_SECONDS = 2.0
GRACE_SECONDS = 5.0  # after an abort, a rank still alive this long exits with status 1
LAUNCHER_DIR_VARIABLE = "UNISON_LAUNCHER_DIR"
_FRAMES = 3
_MAX_REASON_CHARS = 600


class _State:
    engine: Any = None
    rank = 0
    size = 1
    mpi: Any = None
    host = ""
    launcher_dir: Path | None = None
    previous_excepthook: Any = None
    previous_threading_excepthook: Any = None
    aborted_reason = ""  # set once this rank has started aborting the job
    trailer_printed = False


_state = _State()


def describe(exc: BaseException, rank: int, host: str, pid: int) -> str:
    """Render the one-line abort reason: who failed, with what, where.

    Example:
        >>> describe(ValueError("bad"), 1, "gpu07", 42)
        'rank 1 (gpu07, pid 42) failed: ValueError: bad'
    """
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)[-_FRAMES:] if exc.__traceback__ else []
    where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))
    reason = f"rank {rank} ({host}, pid {pid}) failed: {message}"
    if where:
        reason += f" at {where}"
    if len(reason) > _MAX_REASON_CHARS:
        reason = reason[: _MAX_REASON_CHARS - 3] + "..."
    return reason


def _launcher_dir(raw: str) -> Path | None:
    return Path(raw) if raw and os.path.isdir(raw) else None


def _write_marker(name: str, text: str) -> None:
    directory = _state.launcher_dir
    if directory is None:
        return
    try:
        tmp = directory / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, directory / name)
    except OSError:  # the launcher is gone or the directory was removed; nothing left to tell
        pass


def install(engine: Any, rank: int, size: int, mpi: Any, launcher_dir: str = "") -> None:
    """Chain the exception hooks and attach the abort plumbing to a freshly started engine.

    `launcher_dir` is ``UNISON_LAUNCHER_DIR``, set by unisonrun for the ranks it starts.
    """
    _state.engine = engine
    _state.rank, _state.size, _state.mpi = rank, size, mpi
    _state.host = socket.gethostname()
    _state.aborted_reason = ""
    _state.trailer_printed = False
    _state.launcher_dir = _launcher_dir(launcher_dir)
    engine.on_stop = _on_engine_stop
    if _state.previous_excepthook is None:
        _state.previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
        _state.previous_threading_excepthook = threading.excepthook
        threading.excepthook = _threading_excepthook
    _write_marker(f"started-{rank}", f"{_state.host} {os.getpid()}\n")


def uninstall() -> None:
    """Restore the hooks that were there before `install`."""
    if _state.previous_excepthook is not None:
        if sys.excepthook is _excepthook:
            sys.excepthook = _state.previous_excepthook
        if threading.excepthook is _threading_excepthook:
            threading.excepthook = _state.previous_threading_excepthook
        _state.previous_excepthook = None
        _state.previous_threading_excepthook = None
    _state.engine = None


def mark_finished() -> None:
    """Tell the launcher this rank shut unison down in order (so its exit is not a failure)."""
    if _state.engine is not None and not _state.aborted_reason:
        _write_marker(f"finished-{_state.rank}", "\n")


def abort_job(exc: BaseException) -> None:
    """Stop every rank because `exc` escaped on this one; fall back to MPI_Abort if that fails.

    Does nothing for errors that are themselves the consequence of the job stopping (an
    `AbortedError`, a `ShutdownError`), or when unison is not running here.
    """
    engine = _state.engine
    if engine is None or _state.size < 2 or engine.state != "running" or _state.aborted_reason:
        return
    if isinstance(exc, (AbortedError, ShutdownError)):
        return
    reason = describe(exc, _state.rank, _state.host, os.getpid())
    _state.aborted_reason = reason
    _write_marker(f"failed-{_state.rank}", reason + "\n")
    if engine.abort(reason, ABORT_TIMEOUT_SECONDS):
        return
    if engine.state != "running" and not isinstance(engine._stop_error, AbortedError):
        return  # the job stopped on its own (shutdown, stall) while we tried
    _stderr(f"unison: {reason}; the other ranks could not be told within {ABORT_TIMEOUT_SECONDS:.0f} s, "
            "calling MPI_Abort.")
    if _state.mpi is not None:
        _state.mpi.COMM_WORLD.Abort(1)
    os._exit(1)


def _stderr(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _trailer(exc: BaseException) -> None:
    """Print the line that says why this rank stopped (last line of its output)."""
    engine = _state.engine
    error = getattr(engine, "_stop_error", None) if engine is not None else None
    if _state.trailer_printed:
        return
    _state.trailer_printed = bool(_state.aborted_reason or error)
    if _state.aborted_reason:
        _stderr(f"unison: {_state.aborted_reason}; stopping every rank.")
    elif isinstance(error, HorovodInternalError) and not isinstance(exc, HorovodInternalError):
        _stderr(f"unison: rank {_state.rank} stopped: {error}")


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    previous = _state.previous_excepthook or sys.__excepthook__
    previous(exc_type, exc, tb)
    try:
        abort_job(exc)
    finally:
        _trailer(exc)


def _threading_excepthook(args: Any) -> None:
    previous = _state.previous_threading_excepthook or threading.__excepthook__
    previous(args)
    if args.exc_value is None or args.exc_type is SystemExit:
        return
    try:
        abort_job(args.exc_value)
    finally:
        _trailer(args.exc_value)


def _on_engine_stop(error: BaseException, waiting: bool) -> None:
    """Engine hook: after an abort, make sure this process ends within the grace period."""
    if not isinstance(error, AbortedError):
        return
    failing_here = bool(_state.aborted_reason)
    if not waiting and not failing_here:
        # The main thread is not blocked on unison, so it would not notice: interrupt it (Python
        # code gets KeyboardInterrupt and unwinds through its finally: blocks).
        _interrupt_main()
    timer = threading.Timer(GRACE_SECONDS, _exit_after_grace, args=(str(error),))
    timer.daemon = True
    timer.start()


def _interrupt_main() -> None:
    # A real SIGINT aimed at the main thread also wakes it from a blocking call such as time.sleep;
    # interrupt_main alone only takes effect at the next bytecode. Respect a user's own handler.
    main = threading.main_thread()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler and main.ident is not None:
        signal.pthread_kill(main.ident, signal.SIGINT)
    else:
        _thread.interrupt_main()


def _exit_after_grace(reason: str) -> None:
    _stderr(f"unison: rank {_state.rank} still running {GRACE_SECONDS:.0f} s after the job was aborted "
            f"({reason}); exiting with status 1.")
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(1)
