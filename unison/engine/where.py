"""Where a rank's code is: the user's frame a call came from, and where the main thread is now.

A frame is the user's when it is neither unison's, nor a framework's internals (torch, TensorFlow,
Keras, tf_keras under site-packages, autograph's generated files), nor the standard library's (a
thread's start, ``runpy``): the place a report names is the
user's own line (``train.py:41 in step``, and its caller's), not a collective's insides. The caller
shown is one outside any installed package: a test runner's or a trainer's loop that called the
user's function (pytest's ``pytest_pyfunc_call``) is not the user's line. `call_site` is read once per
request that goes to the coordinator (a call seen for the first time or changed, never a call the
response cache answers), so it costs nothing in the steady state; `main_thread` is read only in the
cycles where rank 0's stall feed asks every rank where it is (once a second while something waits).

A framework adapter may add an *origin* (`add_origin`): what, between the user's frame and unison, made
the call (torch's DDP bucket N, FSDP's all-gather of a module). The site then reads
``train.py:41 in step (DDP bucket 0)``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from .handles import Handle

__all__ = ["STACK_FRAMES", "USER_FRAMES", "Origin", "add_origin", "call_site", "installed", "internal", "main_thread",
           "place"]

STACK_FRAMES = 40  # frames of the main thread's stack kept, innermost first
USER_FRAMES = 2  # user frames a place shows: the call's and its caller's
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # unison/
_FRAMEWORKS = frozenset({"tensorflow", "keras", "tf_keras", "torch"})
_INSTALL_DIRS = frozenset({"site-packages", "dist-packages"})
_AUTOGRAPH_PREFIX = "__autograph_generated_file"
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep  # the standard library's own files
_MAIN_THREAD = threading.main_thread().ident
_WAIT = Handle.wait.__code__
_STEADY_CALLS = frozenset({"run_steady", "steady"})  # `Engine.run_steady`, `Cycles.steady`: a `request` local

Origin = Callable[[Sequence[FrameType], str], str]
"""What made a call: given the frames from the submission out to the user's frame (innermost first,
the user's own left out) and the collective's kind (``allreduce``...), a few words or ''."""

_origins: list[Origin] = []


def add_origin(origin: Origin) -> None:
    """Have `call_site` ask `origin` what made each call it reads (once per function)."""
    if origin not in _origins:
        _origins.append(origin)


@functools.lru_cache(maxsize=4096)
def internal(filename: str) -> bool:
    """Whether a frame's file is unison's, a framework's internals or the standard library's, not the user's.

    Example:
        >>> internal(__file__), internal("/home/me/train.py")
        (True, False)
    """
    if os.path.basename(filename).startswith(_AUTOGRAPH_PREFIX) or filename.startswith("<frozen "):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR):
        return True
    parts = path.split(os.sep)
    installed = [i for i, part in enumerate(parts[:-1]) if part in _INSTALL_DIRS]
    if not installed:
        return path.startswith(_STDLIB)  # threading, runpy, contextlib: a thread's or a launch's frames
    return any(parts[i + 1] in _FRAMEWORKS for i in installed)


@functools.lru_cache(maxsize=4096)
def installed(filename: str) -> bool:
    """Whether a frame's file belongs to an installed package (under site-packages or dist-packages).

    Example:
        >>> installed("/opt/venv/lib/python3.11/site-packages/_pytest/python.py"), installed("/home/me/train.py")
        (True, False)
    """
    return any(part in _INSTALL_DIRS for part in os.path.abspath(filename).split(os.sep)[:-1])


def place(frame: FrameType) -> str:
    """``file:line in function`` of `frame` (the file's base name)."""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _user_frame(frame: FrameType | None) -> tuple[FrameType | None, list[FrameType]]:
    """The innermost user frame at or outside `frame`, and the frames inside it (innermost first)."""
    inner: list[FrameType] = []
    while frame is not None:
        if not internal(frame.f_code.co_filename):
            return frame, inner
        inner.append(frame)
        frame = frame.f_back
    return None, inner


def _places(user: FrameType | None) -> str:
    """``file:line in f`` of `user` and of up to `USER_FRAMES` - 1 user frames outside it, joined by
    `` <- `` (innermost first; the frameworks' frames between them left out, and, after `user`, those
    of installed packages: a test runner that called the user's test is not the user's code)."""
    shown: list[str] = []
    frame = user
    while frame is not None and len(shown) < USER_FRAMES:
        filename = frame.f_code.co_filename
        if not internal(filename) and not (shown and installed(filename)):
            shown.append(place(frame))
        frame = frame.f_back
    return " <- ".join(shown)


def call_site(kind: str = "", depth: int = 1) -> str:
    """Where the call being submitted comes from: the user's frame, and its origin where one is known.

    Called by the submit path for a request it makes afresh. On a thread with no user frame (a
    framework's own thread, as torch's autograd threads on a GPU), the main thread's user frame.

    Args:
        kind: the collective's kind, for the origins (``allreduce``, ``allgather``...).
        depth: frames to skip: 1 starts at the caller of `call_site`.

    Returns:
        ``train.py:41 in step <- train.py:60 in main`` (the call's user frame and its caller's, see
        `USER_FRAMES`), with `` (DDP bucket 0)`` where an origin is known; '' with no user frame at all.
    """
    user, inner = _user_frame(sys._getframe(depth))
    if user is None:
        main = sys._current_frames().get(_MAIN_THREAD) if threading.get_ident() != _MAIN_THREAD else None  # type: ignore[arg-type]
        user = _user_frame(main)[0]
    origin = ""
    for describe in _origins:
        try:
            origin = describe(inner, kind)
        except Exception:  # noqa: BLE001 - an origin is a courtesy: the call goes on without it
            origin = ""
        if origin:
            break
    if user is None:
        return origin
    return _places(user) + (f" ({origin})" if origin else "")


def main_thread(stack: bool = True) -> tuple[str, str, object, list[str]]:
    """Where the main thread is now: (its user frame's place, the collective it waits for, the
    request of a steady call it runs, its stack).

    The collective is the name of the handle it waits on ('' when it waits on none); the request is
    that of an allreduce it runs on its own thread in the steady state (`Engine.run_steady`), else None.
    The stack is ``file:line in function`` per frame, innermost first, at most `STACK_FRAMES`, from the
    frame that called into unison (unison's own frames inside it are left out).
    """
    frame = sys._current_frames().get(_MAIN_THREAD)  # type: ignore[arg-type]
    if frame is None:
        return "", "", None, []
    user, inner = _user_frame(frame)
    waits, request = "", None
    for candidate in inner:
        code = candidate.f_code
        if code is _WAIT:
            owner = candidate.f_locals.get("self")
            waits = owner.name if isinstance(owner, Handle) else ""
            break
        if code.co_name in _STEADY_CALLS and code.co_filename.startswith(_PACKAGE_DIR):
            request = candidate.f_locals.get("request")
            break
    frames: list[str] = []
    if stack:
        walk: FrameType | None = frame
        while walk is not None and walk.f_code.co_filename.startswith(_PACKAGE_DIR):
            walk = walk.f_back  # unison's own frames, from the wait in: not the program's
        while walk is not None and len(frames) < STACK_FRAMES:
            frames.append(place(walk))
            walk = walk.f_back
    return _places(user), waits, request, frames
