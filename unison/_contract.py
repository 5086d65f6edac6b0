"""The contract between unisonrun and the ranks it starts: variables, the launcher directory, markers.

Both sides take these names and formats from here: the ranks (`unison._job.failure`, `unison.service.setup`,
`unison._job.runtime`, `unison.elastic`) and the launcher (`unison.launcher`), the per-rank keeper included.
The keeper runs as ``python -I -S unison/launcher/supervision/keeper.py`` and loads this file by its
path, so it imports the standard library only, and nothing of unison.

Variables the launcher sets for every rank it starts (`unison.config` reads them as settings):
``UNISON_LAUNCHER_DIR`` (the launcher directory on unisonrun's host), ``UNISON_LAUNCHER_HOSTS`` (the
launch's ``host:slots,...`` in rank order), ``UNISON_LAUNCHER_RELAY`` (``KEY@HOST:PORT`` of the marker
relay, for ranks on other hosts) and ``UNISON_LAUNCHER_KEEP_GOING``; under the elastic driver also
``UNISON_ELASTIC_EPOCH``, ``UNISON_ELASTIC_DRIVER`` (``KEY@HOST:PORT`` of the driver's endpoint),
``UNISON_ELASTIC_STORE`` and ``UNISON_ELASTIC_HOSTS``.

The relay and the elastic driver's endpoint speak one protocol, a signed line each way over a TCP
connection (`signed_line`, `read_signed`, `ask_signed`): ``SIGNATURE PAYLOAD``, the signature a hex
HMAC-SHA256 under a key made for the job and handed to the ranks in the variable with the address.
The answer's signature also covers the question's, so an answer is good for that one question only.

The launcher directory holds one marker file per rank and event, named ``KIND-RANK``: ``started-R``
(``HOST PID``, at ``init()``), ``failed-R`` (the reason), ``finished-R`` (an orderly ``shutdown()``),
all written by the rank, and ``ended-R`` (``PID CODE``, negative for a signal) by its keeper. Ranks on
another host send them to the relay instead, one signed line each (`relay_line`). With the gRPC
controller rank 0 also leaves `SERVICE_FILE` there (address and secret, mode 0600). For `unison.run`
it also holds the call (`JOB_FILE`, pickled, with `META_FILE`: the caller's main script and
``sys.path``) and each rank's outcome, `result_file` or `error_file`, under `epoch_directory` in an
elastic job. Every file is written whole or not at all (`write_atomically`): the launcher polls the
directory while ranks write.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import locale
import os
import secrets
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "ELASTIC_DRIVER_VARIABLE", "ELASTIC_EPOCH_VARIABLE", "ELASTIC_HOSTS_VARIABLE", "ELASTIC_STORE_VARIABLE",
    "FINISHED_AFTER_PEER", "HOSTS_UPDATED_EXIT", "JOB_FILE", "LAUNCHER_DIR_VARIABLE", "LAUNCHER_HOSTS_VARIABLE",
    "LAUNCHER_KEEP_GOING_VARIABLE", "LAUNCHER_RELAY_VARIABLE", "MARKER_KINDS", "META_FILE",
    "RELAY_TIMEOUT_SECONDS", "SERVICE_FILE", "SIGNATURE_CHARS", "ask_signed", "epoch_directory",
    "error_file", "host_of", "marker_name", "parse_hosts", "parse_marker_name", "read_signed", "relay_line",
    "result_file", "send_marker", "sign", "signed_line", "split_signed_address", "untrusted_directory",
    "user_name", "write_atomically", "write_service_file",
]

LAUNCHER_DIR_VARIABLE = "UNISON_LAUNCHER_DIR"
LAUNCHER_HOSTS_VARIABLE = "UNISON_LAUNCHER_HOSTS"
LAUNCHER_RELAY_VARIABLE = "UNISON_LAUNCHER_RELAY"
LAUNCHER_KEEP_GOING_VARIABLE = "UNISON_LAUNCHER_KEEP_GOING"
ELASTIC_EPOCH_VARIABLE = "UNISON_ELASTIC_EPOCH"
ELASTIC_DRIVER_VARIABLE = "UNISON_ELASTIC_DRIVER"
ELASTIC_STORE_VARIABLE = "UNISON_ELASTIC_STORE"  # also marks every rank of the job for the store's reaper
ELASTIC_HOSTS_VARIABLE = "UNISON_ELASTIC_HOSTS"

HOSTS_UPDATED_EXIT = 75  # a rank's exit status after committing for a host change

SERVICE_FILE = "service.json"
JOB_FILE = "job.pkl"
META_FILE = "meta.json"
MARKER_KINDS = ("started", "failed", "finished", "ended")
# The text of a ``finished-R`` marker whose rank then ended with an uncaught ShutdownError: a peer's
# exit stopped it, so its non-zero status is that peer's consequence, not a failure of its own.
FINISHED_AFTER_PEER = "after a peer's shutdown"
RELAY_TIMEOUT_SECONDS = 2.0
SIGNATURE_CHARS = 64  # a hex HMAC-SHA256
ANSWER_BYTES = 4096  # the longest answer a client reads
_TEMPORARY_TRIES = 100  # names tried for a temporary file before giving up


def marker_name(kind: str, rank: int | str) -> str:
    """The file name of marker `kind` of `rank`.

    Example:
        >>> marker_name("failed", 3)
        'failed-3'
    """
    return f"{kind}-{rank}"


def parse_marker_name(name: str) -> tuple[str, int] | None:
    """The (kind, rank) a marker file `name` stands for, or None for any other file.

    Example:
        >>> parse_marker_name("ended-12"), parse_marker_name(".ended-12.tmp"), parse_marker_name("job.pkl")
        (('ended', 12), None, None)
    """
    kind, _, rank = name.partition("-")
    if kind not in MARKER_KINDS or not rank.isdigit():
        return None
    return kind, int(rank)


def result_file(rank: int) -> str:
    """The file in which `rank` leaves the pickled return value of `unison.run`'s function."""
    return f"result-{rank}.pkl"


def error_file(rank: int) -> str:
    """The file in which `rank` leaves the pickled error of `unison.run`'s function."""
    return f"error-{rank}.pkl"


def epoch_directory(number: int) -> str:
    """The subdirectory of the outcomes of elastic membership epoch `number` (a rank is another
    process in each epoch).

    Example:
        >>> epoch_directory(3)
        'epoch-3'
    """
    return f"epoch-{number}"


def parse_hosts(text: str, variable: str = LAUNCHER_HOSTS_VARIABLE) -> list[tuple[str, int]]:
    """The (host, slots) pairs of a ``host:slots,...`` list, in rank order.

    Raises:
        ValueError: an item is not ``host:slots``; the message names `variable`.

    Example:
        >>> parse_hosts("a:2,b:1")
        [('a', 2), ('b', 1)]
    """
    hosts = []
    for item in filter(None, text.split(",")):
        name, _, slots = item.rpartition(":")
        if not name or not slots.isdigit():
            raise ValueError(f"{variable} must be 'host:slots,...'. Got {item!r}.")
        hosts.append((name, int(slots)))
    return hosts


def host_of(hosts: Sequence[tuple[str, int]], rank: int) -> str | None:
    """The host `rank` runs on when ranks fill the hosts' slots in order; None past the last slot.

    Example:
        >>> host_of([("a", 2), ("b", 2)], 2)
        'b'
    """
    for name, slots in hosts:
        if rank < slots:
            return name
        rank -= slots
    return None


def write_atomically(path: Path | str, data: str | bytes, *, temporary: Path | str | None = None,
                     mode: int | None = None) -> None:
    """Write `data` to `path` whole: into `temporary` (``.NAME.tmp`` beside it by default), then rename.

    A reader polling the directory sees the old file or the new one, never a part. `mode` creates the
    temporary file with those permission bits (the service file's 0600). Text is encoded as the reader
    decodes it, in the locale's encoding, with ``backslashreplace``: any text can be written (a lone
    surrogate from an undecodable file name, a character the encoding lacks becomes its escape), and
    the file always decodes. The temporary file is made new (``O_CREAT | O_EXCL | O_NOFOLLOW``): a
    file or a symbolic link already at that name (left by a writer that died, or planted) is never
    written through; another name beside it is taken. OSError propagates: the callers decide whether
    a vanished directory matters.
    """
    path = Path(path)
    temporary = Path(temporary) if temporary is not None else path.with_name(f".{path.name}.tmp")
    payload = data if isinstance(data, bytes) else data.encode(locale.getpreferredencoding(False), "backslashreplace")
    fd, temporary = _create_new(temporary, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the error that got here is the one to report
            temporary.unlink()
        raise


def _create_new(temporary: Path, mode: int) -> tuple[int, Path]:
    """Open a file that did not exist, `temporary` or a name beside it, for writing; its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    candidate = temporary
    for _ in range(_TEMPORARY_TRIES):
        try:
            return os.open(candidate, flags, mode), candidate
        except FileExistsError:
            candidate = temporary.with_name(f"{temporary.name}.{secrets.token_hex(4)}")
    raise FileExistsError(errno.EEXIST, f"every temporary name tried beside {temporary.name} exists "
                          f"({_TEMPORARY_TRIES} tried)", str(temporary))


def write_service_file(launcher_dir: str, address: str, secret: str) -> None:
    """Rank 0: leave the service address and secret for `unisonrun --status` (0600, atomic)."""
    directory = Path(launcher_dir)
    if not launcher_dir or not directory.is_dir():
        return
    try:
        write_atomically(directory / SERVICE_FILE, json.dumps({"address": address, "secret": secret}),
                         temporary=directory / f".{SERVICE_FILE}.{os.getpid()}", mode=0o600)
    except OSError:
        pass  # the launcher directory is gone or not ours: status lookups are a convenience


def sign(key: str, payload: bytes) -> str:
    """The relay's signature of `payload` under `key` (hex HMAC-SHA256)."""
    return hmac.new(key.encode(), payload, hashlib.sha256).hexdigest()


def _marker_payload(name: str, text: str) -> bytes:
    return json.dumps({"name": name, "text": text}).encode()


def relay_line(key: str, name: str, text: str) -> bytes:
    """The line that carries marker `name` with `text` to the relay: ``SIGNATURE JSON`` and a newline."""
    return signed_line(key, _marker_payload(name, text))


def send_marker(relay: str, name: str, text: str) -> bool:
    """Send marker `name` with `text` to the relay ``KEY@HOST:PORT``; True once it is on the launcher's disk.

    False when the relay is gone, unreachable, refused the marker, or answered without the job's key.
    """
    return ask_signed(relay, _marker_payload(name, text)) == b"OK"


def _answer_input(question_signature: bytes, payload: bytes) -> bytes:
    # Apart from any question's input (a question's payload never starts so): an answer cannot pass
    # for a question, nor a question for an answer, and an answer covers the question it answers.
    return b"answer " + question_signature + b" " + payload


def signed_line(key: str, payload: bytes, *, answering: bytes = b"") -> bytes:
    """The line ``SIGNATURE PAYLOAD`` and a newline; with `answering` (the question's signature), an answer to it.

    Raises:
        ValueError: `payload` holds a newline (it would end the line early).

    Example:
        >>> question = signed_line("k", b"CHECK 3")
        >>> read_signed("k", question)
        b'CHECK 3'
        >>> answer = signed_line("k", b"OK 3 0", answering=question[:SIGNATURE_CHARS])
        >>> read_signed("k", answer, answering=question[:SIGNATURE_CHARS]), read_signed("k", answer)
        (b'OK 3 0', None)
    """
    if b"\n" in payload:
        raise ValueError(f"A signed line's payload must not hold a newline. Got {payload[:80]!r}.")
    signed = _answer_input(answering, payload) if answering else payload
    return sign(key, signed).encode() + b" " + payload + b"\n"


def read_signed(key: str, line: bytes, *, answering: bytes = b"") -> bytes | None:
    """The payload of `line` when it is signed under `key` (as an answer to `answering`, if given); else None.

    The signature is compared in constant time. A line without a signature, with one that is not the
    key's, or with bytes that are not ASCII where the signature goes, is None; nothing here raises.

    Example:
        >>> read_signed("k", signed_line("other", b"CHECK 3")) is None, read_signed("k", b"CHECK 3\\n") is None
        (True, True)
    """
    if line.endswith(b"\n"):
        line = line[:-1]
    signature, separator, payload = line.partition(b" ")
    if not separator or len(signature) != SIGNATURE_CHARS:
        return None
    expected = sign(key, _answer_input(answering, payload) if answering else payload).encode()
    # Compared as bytes: compare_digest raises TypeError on a str with non-ASCII characters.
    return payload if hmac.compare_digest(signature, expected) else None


def split_signed_address(address: str) -> tuple[str, str, int] | None:
    """The (key, host, port) of ``KEY@HOST:PORT``, or None when `address` is not of that form.

    Example:
        >>> split_signed_address("k3y@10.0.0.1:4000"), split_signed_address("10.0.0.1:4000")
        (('k3y', '10.0.0.1', 4000), None)
    """
    key, at, host_port = address.partition("@")
    host, colon, port = host_port.rpartition(":")
    if not (key and at and host and colon and port.isdigit()):
        return None
    return key, host, int(port)


def ask_signed(address: str, payload: bytes, timeout_seconds: float = RELAY_TIMEOUT_SECONDS) -> bytes | None:
    """Send `payload` signed to the line server at ``KEY@HOST:PORT``; the payload of its answer, or None.

    None when the server cannot be reached within `timeout_seconds` (each step), refuses the line, or
    answers with a line that is not signed under the key as the answer to this question.
    """
    parts = split_signed_address(address)
    if parts is None:
        return None
    key, host, port = parts
    question = signed_line(key, payload)
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds) as conn:
            conn.sendall(question)
            answer = conn.makefile("rb").readline(ANSWER_BYTES)
    except (OSError, ValueError):
        return None  # the server is gone or unreachable
    return read_signed(key, answer, answering=question[:SIGNATURE_CHARS])


def untrusted_directory(path: str | os.PathLike[str]) -> str | None:
    """Why directory `path` cannot be trusted to hold only what this user wrote, or None when it can.

    A directory that this user owns and that group and others cannot write is trusted; a symbolic link,
    a file, another user's directory, or one that group or others can write is not (another user of a
    host can make a job's predictable path first and plant files in it). The reason names the owner's
    uid and the mode.

    Raises:
        FileNotFoundError: `path` is not there.
    """
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif info.st_uid != os.getuid():
        problem = "belongs to another user"
    elif mode & 0o022:
        problem = "is writable by group or others"
    else:
        return None
    return f"{problem} (owner {user_name(info.st_uid)}, mode 0o{mode:03o})"


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` where the name cannot be looked up."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
