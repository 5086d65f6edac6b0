"""The one-line summary of a failure: who failed, with what message, at which of the user's lines.

Frames inside unison and inside the frameworks' internals (TensorFlow, Keras, torch, autograph's
generated files) are left out, so the line shows the user's call site rather than unison's own
frames; when nothing else is left, the innermost frame is shown. `parse_reason` reads such a line
back (the launcher groups the ranks that raised one error), and `without_unison_frames` shortens a
traceback to the frames that are not unison's own.
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback
from types import TracebackType

__all__ = ["CALLBACK_PREFIX", "Reason", "describe", "parse_reason", "user_where", "without_unison_frames"]

_FRAMES = 3
_MAX_REASON_CHARS = 600
# Frames that are not the user's: unison itself, and the frameworks' internals (found under
# site-packages); TensorFlow's autograph runs user functions from generated files.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # unison/, not unison/_job/
_FRAMEWORKS = frozenset({"tensorflow", "keras", "tf_keras", "torch"})
_INSTALL_DIRS = frozenset({"site-packages", "dist-packages"})
_AUTOGRAPH_PREFIX = "__autograph_generated_file"
_USER_CODE_HEADER = "in user code:"  # TensorFlow's rewritten message for errors inside tf.function
_USER_CODE_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def describe(exc: BaseException, rank: int, host: str, pid: int) -> str:
    """Render the one-line abort reason: who failed, with what, where (the user's innermost frames).

    Frames inside unison and inside the frameworks' internals (TensorFlow, Keras, torch, autograph's
    generated files) are left out; when nothing else is left, the innermost frame is shown. For an
    error TensorFlow rewrote as "in user code: ...", the message and the user's frames come from it.

    Example:
        >>> describe(ValueError("bad"), 1, "gpu07", 42)
        'rank 1 (gpu07, pid 42) failed: ValueError: bad'
    """
    message, inner = _message(exc)
    where = _where(exc, inner)
    reason = f"rank {rank} ({host}, pid {pid}) failed: {message}"
    if where:
        reason += f" at {where}"
    if len(reason) > _MAX_REASON_CHARS:
        reason = reason[: _MAX_REASON_CHARS - 3] + "..."
    return reason


def user_where(exc: BaseException) -> str:
    """Where `exc` was raised in the user's code: ``file:line in function`` of up to three of the user's
    innermost frames, innermost first, joined by `` <- `` ('' without a traceback).

    Example:
        >>> user_where(ValueError("no traceback"))
        ''
    """
    return _where(exc, _message(exc)[1])


def _where(exc: BaseException, inner: list[tuple[str, int, str]]) -> str:
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    frames += inner  # outermost first, like a traceback
    shown = ([f for f in frames if not _internal(f[0])] or frames[-1:])[-_FRAMES:]
    return " <- ".join(f"{os.path.basename(file)}:{line} in {name}" for file, line, name in reversed(shown))


@dataclasses.dataclass(frozen=True)
class Reason:
    """A failure line of `describe`, read back: who failed, with what, where."""

    rank: int
    host: str
    pid: int
    error: str  # the exception's type name
    message: str  # "Type: first line of the message"
    where: str  # "file:line in function <- ..." ('' when the line has none)

    @property
    def who(self) -> str:
        return f"rank {self.rank} ({self.host}, pid {self.pid})"


# torch's autograd re-raises an error of a DDP communication hook as a RuntimeError with this prefix
CALLBACK_PREFIX = "Got the following error when running the callback: "
_REASON = re.compile(r"^rank (?P<rank>\d+) \((?P<host>.*), pid (?P<pid>\d+)\) failed: "
                     r"(?P<message>(?P<error>[A-Za-z_][\w.]*)(?::.*)?)$", re.DOTALL)
_WHERE = re.compile(r"^[^\n]+?:\d+ in [^\s]+(?: <- [^\n]+?:\d+ in [^\s]+)*$")


def parse_reason(text: str) -> Reason | None:
    """Read back a line of `describe` (None for any other text, or one cut short at its length limit).

    An error torch's autograd re-raised from a DDP communication hook (``RuntimeError: Got the following
    error when running the callback: MismatchError: ...``) reads back as the hook's own error.

    Example:
        >>> parse_reason("rank 1 (gpu07, pid 42) failed: ValueError: bad at train.py:3 in step <- train.py:9 in main")
        Reason(rank=1, host='gpu07', pid=42, error='ValueError', message='ValueError: bad', where='train.py:3 in step <- train.py:9 in main')
    """
    match = _REASON.match(text.strip())
    if match is None or text.endswith("..."):
        return None
    message, where, error = match["message"], "", match["error"]
    head, separator, tail = message.rpartition(" at ")
    if separator and _WHERE.match(tail):
        message, where = head, tail
    inner = message.removeprefix(f"RuntimeError: {CALLBACK_PREFIX}")
    if inner != message and re.match(r"^[A-Za-z_]\w*: ", inner):  # the hook's own error, as every rank raised it
        message, error = inner, inner.split(":", 1)[0]
    return Reason(int(match["rank"]), match["host"], int(match["pid"]), error, message, where)


def without_unison_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback `tb` less the frames of unison's own package (the user's and the frameworks' stay);
    `tb` itself when every frame is unison's."""
    kept, first = [], tb
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR):
            kept.append(tb)
        tb = tb.tb_next
    if not kept:
        return first
    rebuilt: TracebackType | None = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _message(exc: BaseException) -> tuple[str, list[tuple[str, int, str]]]:
    """The exception's type and first line, and the frames its message lists (TensorFlow's rewrite)."""
    name = type(exc).__name__
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    if not lines:
        return name, []
    if lines[0] != _USER_CODE_HEADER:
        return f"{name}: {lines[0]}", []
    frames = []
    for line in lines:
        match = _USER_CODE_FRAME.match(line)
        if match:
            frames.append((match["file"], int(match["line"]), match["name"]))
    last = next(line for line in reversed(lines) if line)
    message = last if last == name or last.startswith(f"{name}:") else f"{name}: {last}"
    return message, frames


def _internal(filename: str) -> bool:
    """Whether a frame's file belongs to unison or to a framework's internals, not to the user."""
    if os.path.basename(filename).startswith(_AUTOGRAPH_PREFIX):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR):
        return True
    parts = path.split(os.sep)
    return any(part in _INSTALL_DIRS and parts[i + 1] in _FRAMEWORKS for i, part in enumerate(parts[:-1]))
