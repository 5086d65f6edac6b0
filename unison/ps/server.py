"""A parameter server: one shard of the dense blocks and sparse tables, served over authenticated gRPC.

One call from a trainer, through this module:

1. `Gate` (shared with the coordinator service) refuses a call without the job secret before it
   holds a thread; every method reads a stream of raw frames, parsed and range-checked here.
2. ``Declare`` creates blocks and tables (the same declaration from every trainer; trainer 0's
   carries the dense values); a restored server keeps what its checkpoint holds.
3. ``Pull`` answers values (a synchronous pull first waits until the step it asks for is applied,
   and fails naming the trainer that holds the step up if that trainer is gone); ``Push`` applies
   gradients at once (asynchronous) or adds them to the step's sums and applies their average once
   every trainer pushed the step (synchronous). A push carries its trainer's sequence number; one
   sent again after a lost reply is acknowledged and not applied twice. In synchronous mode, a
   trainer that last met an earlier process of this server (it restarted) goes on only if this
   process resumed at the trainer's step; otherwise its call is refused, naming both steps.
4. A checkpoint thread writes the shard atomically every `checkpoint_seconds`; ``Checkpoint`` writes
   one on request; a new server with the same checkpoint directory resumes from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from .._version import __version__
from ..errors import ConfigError, InvalidArgumentError
from ..service.calls import Gate
from ..service.server import CHANNEL_OPTIONS
from . import _checkpoint
from . import ps_pb2 as pb
from ._steps import (
    TrainerSeen,
    is_duplicate,
    lost_trainers,
    push_refusal,
    resume_refusal,
    server_end,
    staleness,
    step_blockers,
    step_complete,
)
from ._wire import DEFAULT_CHUNK_BYTES, MAX_KEY_CHARS, Part, floats, frames, ids_of, sum_rows
from .optim import Optimizer, from_fields
from .table import INITIALIZERS, Initializer, TableShard

__all__ = ["LOST_EXIT_STATUS", "MAX_DIM", "MAX_ELEMENTS", "MODES", "SERVICE_NAME", "ParameterServer"]

log = logging.getLogger(__name__)

SERVICE_NAME = "unison.ps.v1.ParameterServer"
MODES = ("async", "sync")
MAX_DIM = 1 << 16  # widest table row
MAX_ELEMENTS = 1 << 34  # largest dense block, and most rows a table may declare
_WAIT_SLICE_SECONDS = 0.25
# A server process exits with this status when its job ended without every trainer finishing (some
# were lost); 0 when every trainer finished. Either is an orderly end, after the last checkpoint.
LOST_EXIT_STATUS = 3


class _Refused(Exception):
    """A call the server answers with an error status; `code` says which."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _bad(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclasses.dataclass
class _Dense:
    values: np.ndarray  # (1, size)
    slots: dict[str, np.ndarray]
    steps: np.ndarray
    optimizer: Optimizer
    filled: int = 0  # elements of initial values received; ready when == size

    @property
    def size(self) -> int:
        return int(self.values.shape[1])

    @property
    def ready(self) -> bool:
        return self.filled >= self.size


@dataclasses.dataclass
class _Pending:
    """One synchronous step's gradients, summed over the trainers that pushed it."""

    contributors: set[int] = dataclasses.field(default_factory=set)
    sequences: dict[int, int] = dataclasses.field(default_factory=dict)  # each contributor's push number
    dense: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.dense.values()) + sum(
            i.nbytes + r.nbytes for parts in self.sparse.values() for i, r in parts)


def _optimizer_fields(optimizer: Optimizer) -> dict[str, Any]:
    return {"kind": optimizer.kind, "fields": optimizer.fields()}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class ParameterServer:
    """Serve one shard of a parameter-server job.

    Args:
        index: this server's index, in range(num_servers).
        num_servers: servers of the job.
        num_trainers: trainers of the job.
        secret: the job secret every call must carry.
        mode: ``"async"`` (apply each push at once) or ``"sync"`` (average each step over all trainers).
        address: ``host:port`` to listen on (port 0: any free port).
        checkpoint_dir: where to keep this shard's checkpoint ("" for none); resumed from at `start`.
        checkpoint_seconds: write a checkpoint this often when something changed (0: only on request).
        trainer_timeout_seconds: a trainer not heard for this long is gone (it fails a synchronous step).
        wait_seconds: the longest a pull waits for a step or for values to be declared.
        chunk_bytes: tensor bytes per reply frame.

    Example:
        >>> server = ParameterServer(0, 1, 2, secret="s" * 32)        # doctest: +SKIP
        >>> address = server.start(); server.wait_finished(); server.stop()  # doctest: +SKIP
    """

    def __init__(self, index: int, num_servers: int, num_trainers: int, secret: str, *, mode: str = "async",
                 address: str = "127.0.0.1:0", checkpoint_dir: str = "", checkpoint_seconds: float = 0.0,
                 trainer_timeout_seconds: float = 10.0, wait_seconds: float = 300.0,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}. Got mode={mode!r}.")
        if not 0 <= index < num_servers:
            raise ConfigError(f"server index must be in range(num_servers={num_servers}). Got {index}.")
        if num_trainers < 1:
            raise ConfigError(f"num_trainers must be at least 1. Got {num_trainers}.")
        self.index, self.num_servers, self.num_trainers = index, num_servers, num_trainers
        self.mode = mode
        self.requested_address = address
        self.address = ""
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_seconds = checkpoint_seconds
        self.trainer_timeout_seconds = trainer_timeout_seconds
        self.wait_seconds = wait_seconds
        self.chunk_bytes = chunk_bytes
        self.state = "created"
        self._secret = secret
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._dense: dict[str, _Dense] = {}
        self._tables: dict[str, TableShard] = {}
        self._pending: dict[int, _Pending] = {}
        self._trainers: dict[int, TrainerSeen] = {}
        # the last push number taken from each trainer, and of those applied (sync: the step completed);
        # the checkpoint keeps the applied ones, as it keeps no pending sums
        self._sequences: dict[int, int] = {}
        self._applied_sequences: dict[int, int] = {}
        self.version = 0
        self.restored = False
        # this process, told apart from earlier and later processes of the same server
        self.incarnation = secrets.randbits(63) | 1
        self._finished = threading.Event()
        self.end_reason = ""  # why the server's work is over (`server_end`), once it is
        self._failure = ""  # synchronous mode: the step that failed, with the trainer lost
        self._told: set[int] = set()  # trainers that got `_failure`
        self._lost_named: set[int] = set()  # trainers logged as lost (and not heard from since)
        self._stopping = threading.Event()
        self._checkpoint_lock = threading.Lock()
        self._checkpointed_version = -1
        self._counts: dict[str, int] = dict.fromkeys(
            ("pulls", "pushes", "declares", "bytes_in", "bytes_out", "rows_pulled", "rows_pushed",
             "dense_elements_pulled", "dense_elements_pushed", "refused_requests", "staleness_sum",
             "staleness_max", "duplicate_pushes", "checkpoints", "checkpoint_bytes"), 0)
        self._staleness: dict[int, int] = {}
        self._gate = Gate(secret, 4 * num_trainers + 16, service=f"parameter server {index}",
                          why="a trainer keeps a few open per step")
        self._server: grpc.Server | None = None
        self._ticker: threading.Thread | None = None

    def __repr__(self) -> str:
        return (f"<ParameterServer {self.index}/{self.num_servers} {self.mode} {self.state} at {self.address or '-'} "
                f"version={self.version} blocks={len(self._dense)} tables={len(self._tables)}>")

    # ---- lifecycle

    def start(self) -> str:
        """Resume from the checkpoint if there is one, start serving, and return the ``host:port``."""
        if self.state != "created":
            raise ConfigError(f"a ParameterServer starts once; this one is {self.state}.")
        self._restore()
        workers = 4 * self.num_trainers + 16
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="unison-ps"),
                             interceptors=[self._gate], options=CHANNEL_OPTIONS + [("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers([self._handlers()])
        port = server.add_insecure_port(self.requested_address)
        if port == 0:
            raise ConfigError(f"parameter server {self.index} could not listen on {self.requested_address}.")
        server.start()
        self._server = server
        host = self.requested_address.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        self.state = "serving"
        if self.checkpoint_dir and self.checkpoint_seconds > 0:
            self._ticker = threading.Thread(target=self._tick, name="unison-ps-checkpoint", daemon=True)
            self._ticker.start()
        threading.Thread(target=self._watch, name="unison-ps-trainers", daemon=True).start()
        log.info("parameter server %d/%d (%s) listening on %s", self.index, self.num_servers, self.mode,
                 self.address)
        return self.address

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until the server's work is over (True), or `timeout` passed (False).

        It is over when every trainer called ``Finish``, or when the others finished or were told
        of a failed synchronous step and the rest are lost (`_steps.server_end`); `end_reason` says
        which, and `every_trainer_finished` whether all finished.
        """
        return self._finished.wait(timeout)

    @property
    def every_trainer_finished(self) -> bool:
        return self.end_reason == "every trainer finished"

    def end_record(self) -> dict[str, Any]:
        """Why the work ended and which trainers were lost, with their host and pid (for the launcher)."""
        with self._lock:
            lost = lost_trainers(self._trainers, self.num_trainers, time.monotonic(), self.trainer_timeout_seconds,
                                 self.mode == "sync")
            return {"server": self.index, "reason": self.end_reason,
                    "lost": {str(t): {"host": self._trainers[t].host, "pid": self._trainers[t].pid, "why": why}
                             for t, why in sorted(lost.items()) if t in self._trainers}}

    def _watch(self) -> None:
        """Note trainers that are lost (and found again), and end the server's work by `server_end`'s rule."""
        while not self._stopping.is_set() and not self._finished.is_set():
            with self._changed:
                self._check_end()
            self._stopping.wait(_WAIT_SLICE_SECONDS)

    def _check_end(self) -> None:
        """(Under the lock.) Log changes in the lost trainers; set `end_reason` once the work is over."""
        if self._finished.is_set():
            return
        now = time.monotonic()
        lost = lost_trainers(self._trainers, self.num_trainers, now, self.trainer_timeout_seconds,
                             self.mode == "sync")
        for trainer in sorted(set(lost) - self._lost_named):
            log.info("parameter server %d counts %s", self.index, lost[trainer])
        for trainer in sorted(self._lost_named - set(lost)):
            log.info("parameter server %d hears from trainer %d again", self.index, trainer)
        self._lost_named = set(lost)
        reason = server_end(sync=self.mode == "sync", trainers=self._trainers, num_trainers=self.num_trainers,
                            now=now, timeout_seconds=self.trainer_timeout_seconds, failure=self._failure,
                            told=self._told)
        if reason:
            self.end_reason = reason
            self._finished.set()
            self._changed.notify_all()

    def stop(self, grace_seconds: float = 1.0) -> None:
        """Write a last checkpoint (with a checkpoint directory) and stop serving."""
        if self.state != "serving":
            return
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self.checkpoint_dir:
            self.checkpoint()
        assert self._server is not None
        self._server.stop(grace_seconds).wait(grace_seconds + 5.0)
        self.state = "stopped"

    def _tick(self) -> None:
        while not self._stopping.wait(self.checkpoint_seconds):
            if self.version != self._checkpointed_version:
                try:
                    self.checkpoint()
                except OSError as exc:
                    log.error("parameter server %d could not write its checkpoint: %s", self.index, exc)

    # ---- checkpoints

    def checkpoint(self) -> str:
        """Write this shard to the checkpoint directory atomically; return the file's path."""
        if not self.checkpoint_dir:
            raise ConfigError("this parameter server has no checkpoint directory (UNISON_PS_CHECKPOINT_DIR).")
        with self._checkpoint_lock:
            arrays: dict[str, np.ndarray] = {}
            with self._lock:
                version = self.version
                sequences = {str(t): n for t, n in sorted(self._applied_sequences.items())}
                dense = {}
                for key, block in self._dense.items():
                    if not block.ready:
                        continue
                    dense[key] = {"size": block.size, "optimizer": _optimizer_fields(block.optimizer)}
                    arrays[f"dense/{key}/values"] = block.values.copy()
                    arrays[f"dense/{key}/steps"] = block.steps.copy()
                    arrays.update({f"dense/{key}/slot.{n}": a.copy() for n, a in block.slots.items()})
                tables = {}
                for name, table in self._tables.items():
                    tables[name] = {"dim": table.dim, "capacity": table.capacity,
                                    "declared_capacity": table.declared_capacity,
                                    "initializer": dataclasses.asdict(table.initializer),
                                    "optimizer": _optimizer_fields(table.optimizer)}
                    arrays.update({f"table/{name}/{k}": a for k, a in table.state().items()})
            header = {"version": version, "mode": self.mode, "num_trainers": self.num_trainers,
                      "dense": dense, "tables": tables, "sequences": sequences}
            path = _checkpoint.checkpoint_path(self.checkpoint_dir, self.index, self.num_servers)
            size = _checkpoint.save(path, header, arrays)
            self._checkpointed_version = version
            with self._lock:
                self._counts["checkpoints"] += 1
                self._counts["checkpoint_bytes"] = size
            log.info("parameter server %d wrote its checkpoint at version %d (%d bytes)", self.index, version, size)
            return str(path)

    def _restore(self) -> None:
        if not self.checkpoint_dir:
            return
        path = _checkpoint.checkpoint_path(self.checkpoint_dir, self.index, self.num_servers)
        found = _checkpoint.load(path)
        if found is None:
            return
        header, arrays = found
        if header.get("mode") != self.mode:
            raise ConfigError(f"{path} was written in {header.get('mode')} mode; this server runs in {self.mode}.")
        for key, meta in header["dense"].items():
            optimizer = from_fields(meta["optimizer"]["kind"], meta["optimizer"]["fields"])
            slots = {n: arrays[f"dense/{key}/slot.{n}"] for n in optimizer.slot_names}
            self._dense[key] = _Dense(arrays[f"dense/{key}/values"], slots, arrays[f"dense/{key}/steps"],
                                      optimizer, filled=int(meta["size"]))
        for name, meta in header["tables"].items():
            table = TableShard(name, int(meta["dim"]), int(meta["capacity"]), Initializer(**meta["initializer"]),
                               from_fields(meta["optimizer"]["kind"], meta["optimizer"]["fields"]),
                               declared_capacity=int(meta.get("declared_capacity", 0)))
            prefix = f"table/{name}/"
            table.restore({k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)})
            self._tables[name] = table
        self.version = int(header["version"])
        self._applied_sequences = {int(t): int(n) for t, n in header.get("sequences", {}).items()}
        self._sequences = dict(self._applied_sequences)
        self._checkpointed_version = self.version
        self.restored = True
        log.info("parameter server %d resumed from %s at version %d", self.index, path, self.version)

    # ---- statistics

    def statistics(self) -> dict[str, Any]:
        """Counters and state: calls, bytes in and out, rows, staleness, checkpoints, memory, trainers."""
        now = time.monotonic()
        with self._lock:
            lost = lost_trainers(self._trainers, self.num_trainers, now, self.trainer_timeout_seconds,
                                 self.mode == "sync")
            out: dict[str, Any] = dict(self._counts)
            memory = sum(b.values.nbytes + b.steps.nbytes + sum(a.nbytes for a in b.slots.values())
                         for b in self._dense.values())
            memory += sum(t.nbytes for t in self._tables.values())
            memory += sum(p.nbytes for p in self._pending.values())
            out.update(
                server=self.index, num_servers=self.num_servers, mode=self.mode, state=self.state,
                version=self.version, restored=self.restored, dense_blocks=len(self._dense),
                dense_elements=sum(b.size for b in self._dense.values()),
                tables={name: {"rows": len(t), "capacity": t.capacity, "declared_capacity": t.declared_capacity,
                               "dim": t.dim}
                        for name, t in self._tables.items()},
                staleness_histogram={str(k): v for k, v in sorted(self._staleness.items())},
                memory_bytes=memory, rss_bytes=_rss_bytes(), pending_steps=sorted(self._pending),
                trainers={str(t): {"host": s.host, "pid": s.pid, "pushed": s.pushed, "finished": s.finished,
                                   "seconds_since_seen": round(now - s.last_seen, 3), "lost": lost.get(t, "")}
                          for t, s in sorted(self._trainers.items())},
                lost_trainers={str(t): why for t, why in sorted(lost.items())},
                failure=self._failure, end_reason=self.end_reason,
            )
        out.update(self._gate.statistics())
        return out

    # ---- the calls

    def _handlers(self) -> grpc.GenericRpcHandler:
        methods: dict[str, tuple[Any, Callable[..., Any], bool]] = {
            "Hello": (pb.TrainerInfo, self._hello, False),
            "Heartbeat": (pb.TrainerInfo, self._heartbeat, False),
            "Finish": (pb.TrainerInfo, self._finish, False),
            "Declare": (pb.Frame, self._declare, False),
            "Pull": (pb.Frame, self._pull, True),
            "Push": (pb.Frame, self._push, False),
            "Status": (pb.StatusRequest, self._status, False),
            "Checkpoint": (pb.CheckpointRequest, self._checkpoint_call, False),
        }
        handlers = {}
        for method, (request_type, behaviour, streaming) in methods.items():
            def call(raw: Iterable[bytes], context: grpc.ServicerContext, method: str = method,
                     request_type: Any = request_type, behaviour: Any = behaviour) -> Any:
                with self._answering(method, context):
                    return behaviour(self._read(method, request_type, raw), context)

            def stream(raw: Iterable[bytes], context: grpc.ServicerContext, method: str = method,
                       request_type: Any = request_type, behaviour: Any = behaviour) -> Any:
                with self._answering(method, context):
                    yield from behaviour(self._read(method, request_type, raw), context)

            if streaming:
                handlers[method] = grpc.stream_stream_rpc_method_handler(stream, response_serializer=self._out)
            else:
                handlers[method] = grpc.stream_unary_rpc_method_handler(call, response_serializer=self._out)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    @contextlib.contextmanager
    def _answering(self, method: str, context: grpc.ServicerContext) -> Iterator[None]:
        """End the call with the status of a refusal raised inside (and count it)."""
        try:
            yield
        except (_Refused, InvalidArgumentError) as exc:  # InvalidArgumentError: a table full, a bad optimizer
            code = exc.code if isinstance(exc, _Refused) else grpc.StatusCode.INVALID_ARGUMENT
            with self._lock:
                self._counts["refused_requests"] += 1
            log.info("parameter server %d refused a %s call: %s", self.index, method, exc)
            context.abort(code, str(exc))

    def _out(self, message: Any) -> bytes:
        data = bytes(message.SerializeToString())
        with self._lock:
            self._counts["bytes_out"] += len(data)
        return data

    def _read(self, method: str, request_type: Any, raw: Iterable[bytes]) -> list[Any]:
        """Every message of the call, parsed; the call's bytes counted."""
        messages, total = [], 0
        for index, data in enumerate(raw):
            total += len(data)
            try:
                messages.append(request_type.FromString(data))
            except DecodeError as exc:
                raise _bad(f"{method}: message {index} ({len(data)} bytes) is not a valid "
                           f"{request_type.DESCRIPTOR.name} ({exc}); every process of a job must run the same "
                           "unison version.") from None
        with self._lock:
            self._counts["bytes_in"] += total
        if not messages:
            raise _bad(f"{method}: the call ended without a {request_type.DESCRIPTOR.name} message.")
        return messages

    def _trainer(self, trainer: int) -> int:
        if not 0 <= trainer < self.num_trainers:
            raise _bad(f"trainer must be in range(num_trainers={self.num_trainers}). Got trainer={trainer}.")
        return trainer

    def _seen(self, trainer: int, **changes: Any) -> None:
        """Note that `trainer` was heard from (under the lock)."""
        seen = self._trainers.get(trainer, TrainerSeen())
        now = time.monotonic()
        self._trainers[trainer] = dataclasses.replace(seen, last_seen=now, first_seen=seen.first_seen or now,
                                                      **changes)

    def _hello(self, requests: list[pb.TrainerInfo], context: grpc.ServicerContext) -> pb.HelloReply:
        info = requests[0]
        trainer = self._trainer(info.trainer)
        if info.num_trainers != self.num_trainers:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                           f"trainer {trainer} counts {info.num_trainers} trainers; parameter server {self.index} "
                           f"was started for {self.num_trainers}. Give every process the same number.")
        if info.mode != self.mode:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                           f"trainer {trainer} trains in {info.mode!r} mode; parameter server {self.index} runs "
                           f"in {self.mode!r} mode. Give every process the same UNISON_PS_MODE.")
        if info.version != __version__:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                           f"trainer {trainer} runs unison {info.version}; parameter server {self.index} runs "
                           f"{__version__}.")
        with self._lock:
            self._seen(trainer, host=info.host[:256], pid=info.pid, finished=False)
            return pb.HelloReply(server=self.index, num_servers=self.num_servers, mode=self.mode,
                                 version=self.version, restored=self.restored, incarnation=self.incarnation,
                                 sequence=self._sequences.get(trainer, 0))

    def _heartbeat(self, requests: list[pb.TrainerInfo], context: grpc.ServicerContext) -> pb.Ack:
        trainer = self._trainer(requests[0].trainer)
        with self._lock:
            self._seen(trainer)
            return pb.Ack(version=self.version)

    def _finish(self, requests: list[pb.TrainerInfo], context: grpc.ServicerContext) -> pb.Ack:
        trainer = self._trainer(requests[0].trainer)
        with self._changed:
            self._seen(trainer, finished=True)
            self._changed.notify_all()
            done = sum(1 for s in self._trainers.values() if s.finished)
            self._check_end()
            return pb.Ack(version=self.version, note=f"{done} of {self.num_trainers} trainers finished")

    def _status(self, requests: list[pb.StatusRequest], context: grpc.ServicerContext) -> pb.StatusReply:
        return pb.StatusReply(statistics_json=json.dumps(self.statistics()))

    def _checkpoint_call(self, requests: list[pb.CheckpointRequest],
                         context: grpc.ServicerContext) -> pb.CheckpointReply:
        try:
            path = self.checkpoint()
        except ConfigError as exc:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        except OSError as exc:
            raise _Refused(grpc.StatusCode.INTERNAL, f"writing the checkpoint failed: {exc}") from None
        return pb.CheckpointReply(path=path, version=self._checkpointed_version)

    def _declare(self, requests: list[pb.Frame], context: grpc.ServicerContext) -> pb.Ack:
        header = requests[0]
        trainer = self._trainer(header.trainer)
        optimizer = from_fields(header.optimizer.kind, dict(header.optimizer.fields))
        for decl in header.dense:
            _check_key(decl.key, dense=True)
            if not 0 < decl.size <= MAX_ELEMENTS:
                raise _bad(f"dense block {decl.key!r}: size must be in [1, {MAX_ELEMENTS}]. Got {decl.size}.")
        for t in header.tables:
            _check_key(t.name, dense=False)
            if not 0 < t.dim <= MAX_DIM:
                raise _bad(f"table {t.name!r}: dim must be in [1, {MAX_DIM}]. Got dim={t.dim}.")
            if not 0 < t.capacity <= MAX_ELEMENTS or not 0 <= t.declared <= MAX_ELEMENTS:
                raise _bad(f"table {t.name!r}: capacity must be in [1, {MAX_ELEMENTS}]. Got capacity="
                           f"{t.declared or t.capacity} ({t.capacity} rows on this server).")
            if t.initializer not in INITIALIZERS:
                raise _bad(f"table {t.name!r}: initializer must be one of {INITIALIZERS}. Got {t.initializer!r}.")
        sizes = {d.key: int(d.size) for d in header.dense}
        pieces = [p for frame in requests for p in frame.pieces]
        created = False  # a block or table made, or a block's values completed: worth a checkpoint
        with self._changed:
            self._seen(trainer)
            for key, size in sizes.items():
                block = self._dense.get(key)
                if block is None:
                    values = np.zeros((1, size), np.float32)
                    self._dense[key] = _Dense(values, optimizer.new_slots(values.shape), np.zeros(1, np.int64),
                                              optimizer)
                    created = True
                else:
                    _agree(f"dense block {key!r}", {"size": block.size, "optimizer": block.optimizer},
                           {"size": size, "optimizer": optimizer}, trainer)
            for t in header.tables:
                initializer = Initializer(t.initializer, t.scale, t.seed)
                table = self._tables.get(t.name)
                if table is None:
                    self._tables[t.name] = TableShard(t.name, t.dim, t.capacity, initializer, optimizer,
                                                      declared_capacity=t.declared)
                    created = True
                else:
                    _agree(f"table {t.name!r}", {"dim": table.dim, "capacity": table.declared_capacity,
                                                 "initializer": table.initializer, "optimizer": table.optimizer},
                           {"dim": t.dim, "capacity": t.declared or t.capacity, "initializer": initializer,
                            "optimizer": optimizer}, trainer)
            for piece in pieces:
                block = self._dense.get(piece.key)
                if block is None or piece.key not in sizes:
                    raise _bad(f"Declare carries values for {piece.key!r}, which this call does not declare.")
                if block.ready:
                    continue  # values already set (by an earlier trainer 0, or restored): the server's win
                data = floats(piece.data, f"values of {piece.key!r}")
                if piece.offset + len(data) > block.size:
                    raise _bad(f"values of {piece.key!r} at offset {piece.offset} run past its {block.size} "
                               "elements.")
                block.values[0, piece.offset:piece.offset + len(data)] = data
                block.filled += len(data)
                created = created or block.ready
            self._counts["declares"] += 1
            self._changed.notify_all()
            version = self.version
        if created and self.checkpoint_dir:
            # before the ack: a server restarted from its checkpoint knows every declaration it acknowledged
            # (the periodic checkpoint waits for a step, and a server lost before one forgot them)
            self.checkpoint()
        return pb.Ack(version=version)

    def _wait(self, ready: Callable[[], bool], what: Callable[[], str], context: grpc.ServicerContext,
              blockers: Callable[[], list[str]] = list) -> None:
        """Wait (holding the condition) until `ready()`; fail when a blocker is gone or after `wait_seconds`."""
        deadline = time.monotonic() + self.wait_seconds
        while not ready():
            if self._stopping.is_set():
                raise _Refused(grpc.StatusCode.UNAVAILABLE, f"parameter server {self.index} is stopping")
            gone = blockers()
            if gone:
                raise _Refused(grpc.StatusCode.ABORTED, f"{what()} on parameter server {self.index}: "
                               + "; ".join(gone) + ".")
            if time.monotonic() > deadline:
                raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"{what()} on parameter server {self.index} within {self.wait_seconds:.0f} s.")
            if not context.is_active():
                raise _Refused(grpc.StatusCode.CANCELLED, "the trainer cancelled its pull")
            self._changed.wait(_WAIT_SLICE_SECONDS)

    def _pull(self, requests: list[pb.Frame], context: grpc.ServicerContext) -> Iterator[pb.Frame]:
        header = requests[0]
        trainer = self._trainer(header.trainer)
        keys = [k for frame in requests for k in frame.keys]
        wanted: dict[str, list[np.ndarray]] = {}
        for frame in requests:
            for piece in frame.pieces:
                wanted.setdefault(piece.key, []).append(ids_of(piece.ids, f"ids of table {piece.key!r}"))
        parts: list[Part] = []
        step = int(header.step)
        with self._changed:
            self._seen(trainer)
            self._check_resume(header, trainer, step)
            for key in keys:
                if key not in self._dense:
                    raise _Refused(grpc.StatusCode.NOT_FOUND, f"dense block {key!r} is not declared on parameter "
                                   f"server {self.index}; declare it before pulling.")
            for table in wanted:
                if table not in self._tables:
                    raise _Refused(grpc.StatusCode.NOT_FOUND, f"unknown table {table!r} on parameter server "
                                   f"{self.index}; declared tables: {sorted(self._tables)}.")
            if self.mode == "sync":
                self._check_failure(trainer)
                try:
                    self._wait(lambda: self.version >= step,
                               lambda: f"step {self.version} did not complete",
                               context, lambda: self._blockers(self.version))
                except _Refused as exc:
                    if exc.code == grpc.StatusCode.ABORTED:  # a trainer is lost: this job's steps are over
                        self._failure = self._failure or str(exc)
                        self._told.add(trainer)
                        log.warning("parameter server %d: %s", self.index, exc)
                        self._check_end()
                    raise
            self._wait(lambda: all(self._dense[k].ready for k in keys),
                       lambda: f"the values of {[k for k in keys if not self._dense[k].ready]} were not declared "
                       "by trainer 0", context)
            for key in keys:
                parts.append(Part(key, self._dense[key].values[0].copy()))
                self._counts["dense_elements_pulled"] += self._dense[key].size
            for table, chunks in wanted.items():
                ids = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
                parts.append(Part(table, self._tables[table].lookup(ids).reshape(-1)))
                self._counts["rows_pulled"] += len(ids)
            self._counts["pulls"] += 1
            version = self.version
        yield from frames(pb.Frame(step=version, incarnation=self.incarnation), parts, self.chunk_bytes)

    def _check_resume(self, header: pb.Frame, trainer: int, step: int) -> None:
        """Refuse a synchronous call from a trainer that met an earlier process of this server, unless the steps agree."""
        if self.mode != "sync" or header.incarnation == self.incarnation:
            return
        refusal = resume_refusal(server=self.index, version=self.version, restored=self.restored, trainer=trainer,
                                 step=step)
        if refusal:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        log.info("parameter server %d: trainer %d goes on at step %d with this process", self.index, trainer, step)

    def _check_failure(self, trainer: int) -> None:
        """(Under the lock.) After a failed synchronous step, answer every call of `trainer` with the failure."""
        if self._failure:
            self._told.add(trainer)
            self._check_end()
            raise _Refused(grpc.StatusCode.ABORTED, self._failure)

    def _blockers(self, step: int) -> list[str]:
        pending = self._pending.get(step)
        contributors = pending.contributors if pending else set()
        return step_blockers(step, contributors, self._trainers, self.num_trainers, time.monotonic(),
                             self.trainer_timeout_seconds)

    def _push(self, requests: list[pb.Frame], context: grpc.ServicerContext) -> pb.Ack:
        header = requests[0]
        trainer = self._trainer(header.trainer)
        dense: dict[str, list[pb.Piece]] = {}
        sparse: dict[str, list[pb.Piece]] = {}
        for frame in requests:
            for piece in frame.pieces:
                (sparse if piece.ids else dense).setdefault(piece.key, []).append(piece)
        sequence = int(header.sequence)
        with self._changed:
            self._seen(trainer)
            if is_duplicate(sequence, self._sequences.get(trainer, 0)):
                self._counts["duplicate_pushes"] += 1
                log.info("parameter server %d: trainer %d sent push %d again; it was taken before", self.index,
                         trainer, sequence)
                return pb.Ack(version=self.version, incarnation=self.incarnation, duplicate=True)
            grads = {key: self._dense_gradient(key, pieces) for key, pieces in dense.items()}
            rows = {table: self._sparse_gradient(table, pieces) for table, pieces in sparse.items()}
            if self.mode == "async":
                lag = staleness(self.version, int(header.based_on))
                self._apply(grads, rows, 1.0)
                self._counts["staleness_sum"] += lag
                self._counts["staleness_max"] = max(self._counts["staleness_max"], lag)
                bucket = min(lag, 16)
                self._staleness[bucket] = self._staleness.get(bucket, 0) + 1
                self.version += 1
                if sequence:
                    self._sequences[trainer] = self._applied_sequences[trainer] = sequence
            else:
                step = int(header.step)
                self._check_failure(trainer)
                self._check_resume(header, trainer, step)
                pending = self._pending.get(step)
                refusal = push_refusal(step=step, version=self.version, trainer=trainer,
                                       already=pending is not None and trainer in pending.contributors)
                if refusal:
                    raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, refusal)
                pending = self._pending.setdefault(step, _Pending())
                for key, grad in grads.items():
                    if key in pending.dense:
                        pending.dense[key] += grad
                    else:
                        pending.dense[key] = grad.copy()
                for table, (ids, values) in rows.items():
                    pending.sparse.setdefault(table, []).append((ids, values))
                pending.contributors.add(trainer)
                if sequence:
                    pending.sequences[trainer] = self._sequences[trainer] = sequence
                self._seen(trainer, pushed=step)
                while self.version in self._pending and step_complete(self._pending[self.version].contributors,
                                                                      self.num_trainers):
                    done = self._pending.pop(self.version)
                    summed = {t: sum_rows(np.concatenate([i for i, _ in parts]),
                                          np.concatenate([r for _, r in parts]))
                              for t, parts in done.sparse.items()}
                    self._apply(done.dense, summed, 1.0 / self.num_trainers)
                    self._applied_sequences.update(done.sequences)
                    self.version += 1
            self._counts["pushes"] += 1
            self._changed.notify_all()
            return pb.Ack(version=self.version, incarnation=self.incarnation)

    def _dense_gradient(self, key: str, pieces: list[pb.Piece]) -> np.ndarray:
        block = self._dense.get(key)
        if block is None:
            raise _Refused(grpc.StatusCode.NOT_FOUND, f"dense block {key!r} is not declared on parameter server "
                           f"{self.index}; declare it before pushing.")
        grad = np.zeros(block.size, np.float32)
        covered = 0
        for piece in pieces:
            data = floats(piece.data, f"gradient of {key!r}")
            if piece.offset + len(data) > block.size:
                raise _bad(f"gradient of {key!r} at offset {piece.offset} runs past its {block.size} elements.")
            grad[piece.offset:piece.offset + len(data)] = data
            covered += len(data)
        if covered != block.size:
            raise _bad(f"gradient of {key!r} carries {covered} elements; the block has {block.size}. Push whole "
                       "blocks.")
        if not np.isfinite(grad).all():
            raise _bad(f"gradient of {key!r} holds NaN or infinity; nothing of this push was applied.")
        self._counts["dense_elements_pushed"] += block.size
        return grad

    def _sparse_gradient(self, name: str, pieces: list[pb.Piece]) -> tuple[np.ndarray, np.ndarray]:
        table = self._tables.get(name)
        if table is None:
            raise _Refused(grpc.StatusCode.NOT_FOUND, f"unknown table {name!r} on parameter server {self.index}; "
                           f"declared tables: {sorted(self._tables)}.")
        ids = np.concatenate([ids_of(p.ids, f"ids of table {name!r}") for p in pieces])
        data = np.concatenate([floats(p.data, f"gradient of table {name!r}") for p in pieces])
        if len(data) != len(ids) * table.dim:
            per_row = len(data) / max(len(ids), 1)
            raise _bad(f"gradient of table {name!r} carries {per_row:g} values per row for {len(ids)} ids; the "
                       f"table's rows have dim={table.dim}.")
        if not np.isfinite(data).all():
            raise _bad(f"gradient of table {name!r} holds NaN or infinity; nothing of this push was applied.")
        self._counts["rows_pushed"] += len(ids)
        return sum_rows(ids, data.reshape(len(ids), table.dim))

    def _apply(self, dense: dict[str, np.ndarray], sparse: dict[str, tuple[np.ndarray, np.ndarray]],
               scale: float) -> None:
        """Apply gradients scaled by `scale` (under the lock); a full table refuses before anything changes."""
        for name, (ids, _) in sparse.items():
            self._tables[name].positions(ids)  # makes missing rows, or raises TableFullError first
        for key, grad in dense.items():
            block = self._dense[key]
            block.optimizer.apply(block.values, block.slots, block.steps, np.zeros(1, np.int64),
                                  (grad * np.float32(scale))[None, :])
        for name, (ids, rows) in sparse.items():
            self._tables[name].apply(ids, rows * np.float32(scale))


def _check_key(key: str, *, dense: bool) -> None:
    what = "dense block" if dense else "table"
    if not key or len(key) > MAX_KEY_CHARS:
        raise _bad(f"a {what} name must have 1 to {MAX_KEY_CHARS} characters. Got {len(key)}.")
    if ("#" in key) != dense:
        raise _bad(f"a dense block key is '<parameter>#<block>' and a table name has no '#'. Got {what} {key!r}.")


def _agree(what: str, held: dict[str, Any], declared: dict[str, Any], trainer: int) -> None:
    differ = [f"{name}: {held[name]!r} here, {declared[name]!r} from trainer {trainer}"
              for name in held if held[name] != declared[name]]
    if differ:
        raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                       f"{what} was declared differently before; " + "; ".join(differ)
                       + ". Every trainer must declare the same parameters.")
