"""A parameter server: its shard of the dense blocks and sparse tables (`shard.Shard`) served over authenticated gRPC.

The shard's state and every decision on it are `shard.Shard`'s (plain data, unit-tested without
gRPC); this module is its shell: it listens, reads each call's frames, calls the shard under one
lock, waits where a call must, and answers. One call from a trainer, through this module:

1. `rpc.gate.Gate` refuses a call without the job secret before it holds a thread; every method
   (`_methods.PARAMETER_SERVER`) reads a stream of raw frames, parsed by `rpc.handlers` and
   range-checked by the shard.
2. ``Declare`` creates blocks and tables (the same declaration from every trainer; trainer 0's
   carries the dense values); a restored server keeps what its checkpoint holds.
3. ``Pull`` answers values (a synchronous pull first waits until the step it asks for is applied,
   and fails naming the trainer that holds the step up if that trainer is gone); ``Push`` applies
   gradients at once (asynchronous) or adds them to the step's sums and applies their average once
   every trainer pushed the step (synchronous). A push carries its trainer's sequence number; one
   sent again after a lost reply is acknowledged and not applied twice. In synchronous mode, a
   trainer that last met an earlier process of this server (it restarted) goes on only if this
   process resumed at the trainer's step; otherwise its call is refused, naming both steps.
4. A refusal of the shard ends the call with its status (`_methods.PARAMETER_SERVER.refusals`):
   `RequestError` ``INVALID_ARGUMENT``, `NotDeclaredError` ``NOT_FOUND``, `ConflictError`
   ``FAILED_PRECONDITION``, `TrainerLostError` ``ABORTED``; the server counts it and goes on.
5. A thread watches the trainers (who is lost, and whether the server's work is over); a checkpoint
   thread writes the shard atomically every `checkpoint_seconds`; ``Checkpoint`` writes one on
   request; a new server with the same checkpoint directory resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from ..errors import ConfigError, TrainerLostError
from ..ops import TextEnum
from ..rpc.endpoints import serve
from ..rpc.gate import Gate
from ..rpc.handlers import handlers
from ..rpc.methods import Refused
from . import ps_pb2 as pb
from ._checkpointer import Checkpointer
from ._liveness import Liveness
from ._methods import PARAMETER_SERVER
from ._wire import DEFAULT_CHUNK_BYTES, frames
from .shard import MODES, Shard

__all__ = ["LOST_EXIT_STATUS", "ParameterServer", "ServerState"]

log = logging.getLogger(__name__)

_WAIT_SLICE_SECONDS = 0.25  # a waiting pull checks this often whether to give up
# A server process exits with this status when its job ended without every trainer finishing (some
# were lost); 0 when every trainer finished. Either is an orderly end, after the last checkpoint.
LOST_EXIT_STATUS = 3


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class ServerState(TextEnum):
    """A parameter server's lifecycle: created, serving once started, stopped for good."""

    CREATED = "created"
    SERVING = "serving"
    STOPPED = "stopped"


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
        # checks num_trainers; the incarnation tells this process from earlier and later ones of this server
        self._shard = Shard(index, num_trainers, mode, incarnation=secrets.randbits(63) | 1,
                            trainer_timeout_seconds=trainer_timeout_seconds)
        self.index, self.num_servers, self.num_trainers = index, num_servers, num_trainers
        self.mode = mode
        self.requested_address = address
        self.address = ""
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_seconds = checkpoint_seconds
        self.trainer_timeout_seconds = trainer_timeout_seconds
        self.wait_seconds = wait_seconds
        self.chunk_bytes = chunk_bytes
        self.state = ServerState.CREATED
        self._secret = secret
        self._lock = threading.Lock()  # held around every call of the shard
        self._changed = threading.Condition(self._lock)
        self._liveness = Liveness(index, self._shard.roster, self._changed)
        self._checkpoints = Checkpointer(self._shard, self._lock, checkpoint_dir, index, num_servers,
                                         checkpoint_seconds)
        self._stopping = threading.Event()
        self._counts: dict[str, int] = dict.fromkeys(("bytes_in", "bytes_out", "refused_requests"), 0)
        self._gate = Gate(secret, 4 * num_trainers + 16, service=f"parameter server {index}",
                          why="a trainer keeps a few open per step")
        self._server: grpc.Server | None = None

    def __repr__(self) -> str:
        return (f"<ParameterServer {self.index}/{self.num_servers} {self.mode} {self.state} at {self.address or '-'} "
                f"version={self.version} blocks={len(self._shard.dense)} tables={len(self._shard.tables)}>")

    @property
    def version(self) -> int:
        """Pushes applied (asynchronous mode) or steps applied (synchronous mode)."""
        return self._shard.version

    @property
    def restored(self) -> bool:
        """Whether the shard was resumed from a checkpoint."""
        return self._shard.restored

    @property
    def end_reason(self) -> str:
        """Why the server's work is over (`Roster.end_reason`), once it is; "" before."""
        return self._liveness.reason

    @property
    def incarnation(self) -> int:
        """This process of the server, told apart from earlier and later ones."""
        return self._shard.incarnation

    # ---- lifecycle

    def start(self) -> str:
        """Resume from the checkpoint if there is one, start serving, and return the ``host:port``."""
        if self.state is not ServerState.CREATED:
            raise ConfigError(f"a ParameterServer starts once; this one is {self.state}.")
        self._checkpoints.restore()
        self._server, port = serve(self._gate, self._handlers(), self.requested_address,
                                   who=f"parameter server {self.index}", thread_name_prefix="unison-ps")
        host = self.requested_address.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        self.state = ServerState.SERVING
        self._checkpoints.start(self._stopping)
        threading.Thread(target=self._liveness.run, args=(self._stopping,), name="unison-ps-trainers",
                         daemon=True).start()
        log.info("parameter server %d/%d (%s) listening on %s", self.index, self.num_servers, self.mode,
                 self.address)
        return self.address

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until the server's work is over (True), or `timeout` passed (False).

        It is over when every trainer called ``Finish``, or when the others finished or were told
        of a failed synchronous step and the rest are lost (`_steps.server_end`); `end_reason` says
        which, and `every_trainer_finished` whether all finished.
        """
        return self._liveness.finished.wait(timeout)

    @property
    def every_trainer_finished(self) -> bool:
        """Whether the work ended with every trainer finished (`wait_finished` returned True)."""
        return self._liveness.every_trainer_finished

    def end_record(self) -> dict[str, Any]:
        """Why the work ended and which trainers were lost, with their host and pid (for the launcher)."""
        return self._liveness.record()

    def stop(self, grace_seconds: float = 1.0) -> None:
        """Write a last checkpoint (with a checkpoint directory) and stop serving."""
        if self.state is not ServerState.SERVING:
            return
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self.checkpoint_dir:
            self.checkpoint()
        assert self._server is not None
        self._server.stop(grace_seconds).wait(grace_seconds + 5.0)
        self.state = ServerState.STOPPED

    def checkpoint(self) -> str:
        """Write this shard to the checkpoint directory atomically; return the file's path."""
        return self._checkpoints.write()

    # ---- statistics

    def statistics(self) -> dict[str, Any]:
        """Counters and state: calls, bytes in and out, rows, staleness, checkpoints, memory, trainers."""
        with self._lock:
            out: dict[str, Any] = self._shard.statistics()
            out.update(self._counts, **self._checkpoints.counts)
            out.update(server=self.index, num_servers=self.num_servers, mode=self.mode, state=self.state,
                       rss_bytes=_rss_bytes(), end_reason=self.end_reason)
        out.update(self._gate.statistics())
        return out

    # ---- the calls

    def _handlers(self) -> grpc.GenericRpcHandler:
        behaviours = {"Hello": self._hello, "Heartbeat": self._heartbeat, "Finish": self._finish,
                      "Declare": self._declare, "Pull": self._pull, "Push": self._push, "Status": self._status,
                      "Checkpoint": self._checkpoint_call}
        return handlers(PARAMETER_SERVER, behaviours, on_refused=self._refused,
                        on_bytes_in=lambda size: self._count("bytes_in", size),
                        on_bytes_out=lambda size: self._count("bytes_out", size))

    def _count(self, counter: str, amount: int) -> None:
        with self._lock:
            self._counts[counter] += amount

    def _refused(self, method: str, exc: Exception) -> None:
        """Count and log a call refused (it ends with the status of `exc`, and the server goes on)."""
        self._count("refused_requests", 1)
        log.info("parameter server %d refused a %s call: %s", self.index, method, exc)

    @contextlib.contextmanager
    def _deciding(self) -> Iterator[None]:
        """Hold the lock around calls of the shard; a trainer told that a step failed may end the work."""
        with self._changed:
            try:
                yield
            except TrainerLostError:
                self._liveness.check()
                raise

    def _hello(self, requests: list[pb.TrainerInfo], context: grpc.ServicerContext) -> pb.HelloReply:
        info = requests[0]
        with self._lock:
            sequence = self._shard.hello(info.trainer, num_trainers=info.num_trainers, mode=info.mode,
                                         unison_version=info.version, host=info.host, pid=info.pid)
            return pb.HelloReply(server=self.index, num_servers=self.num_servers, mode=self.mode,
                                 version=self.version, restored=self.restored, incarnation=self.incarnation,
                                 sequence=sequence)

    def _heartbeat(self, requests: list[pb.TrainerInfo], context: grpc.ServicerContext) -> pb.Ack:
        with self._lock:
            self._shard.roster.heartbeat(requests[0].trainer)
            return pb.Ack(version=self.version)

    def _finish(self, requests: list[pb.TrainerInfo], context: grpc.ServicerContext) -> pb.Ack:
        with self._changed:
            done = self._shard.roster.finish(requests[0].trainer)
            self._changed.notify_all()
            self._liveness.check()
            return pb.Ack(version=self.version, note=f"{done} of {self.num_trainers} trainers finished")

    def _status(self, requests: list[pb.StatusRequest], context: grpc.ServicerContext) -> pb.StatusReply:
        return pb.StatusReply(statistics_json=json.dumps(self.statistics()))

    def _checkpoint_call(self, requests: list[pb.CheckpointRequest],
                         context: grpc.ServicerContext) -> pb.CheckpointReply:
        try:
            path = self.checkpoint()
        except ConfigError as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        except OSError as exc:
            raise Refused(grpc.StatusCode.INTERNAL, f"writing the checkpoint failed: {exc}") from None
        return pb.CheckpointReply(path=path, version=self._checkpoints.version)

    def _declare(self, requests: list[pb.Frame], context: grpc.ServicerContext) -> pb.Ack:
        header = requests[0]
        with self._changed:
            # created: a block or table made, or a block's values completed: worth a checkpoint
            created = self._shard.declare(header.trainer, header.optimizer.kind, header.optimizer.fields,
                                          header.dense, header.tables, [p for f in requests for p in f.pieces])
            self._changed.notify_all()
            version = self.version
        if created and self.checkpoint_dir:
            # before the ack: a server restarted from its checkpoint knows every declaration it acknowledged
            # (the periodic checkpoint waits for a step, and a server lost before one forgot them)
            self.checkpoint()
        return pb.Ack(version=version)

    def _wait(self, ready: Callable[[], bool], what: Callable[[], str], context: grpc.ServicerContext,
              failure: Callable[[], str] = str) -> None:
        """Wait (holding the condition) until `ready()`; fail when `failure()` says why it never will, or after `wait_seconds`."""
        deadline = time.monotonic() + self.wait_seconds
        while not ready():
            if self._stopping.is_set():
                raise Refused(grpc.StatusCode.UNAVAILABLE, f"parameter server {self.index} is stopping")
            failed = failure()
            if failed:
                raise Refused(grpc.StatusCode.ABORTED, failed)
            if time.monotonic() > deadline:
                raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"{what()} on parameter server {self.index} within {self.wait_seconds:.0f} s.")
            if not context.is_active():
                raise Refused(grpc.StatusCode.CANCELLED, "the trainer cancelled its pull")
            self._changed.wait(_WAIT_SLICE_SECONDS)

    def _pull(self, requests: list[pb.Frame], context: grpc.ServicerContext) -> Iterator[pb.Frame]:
        header = requests[0]
        trainer, step, shard = header.trainer, int(header.step), self._shard
        keys = [k for frame in requests for k in frame.keys]
        with self._deciding():
            wanted = shard.check_pull(trainer, step=step, incarnation=header.incarnation, keys=keys,
                                      pieces=[p for frame in requests for p in frame.pieces])
            try:
                self._wait(lambda: shard.step_ready(step), lambda: f"step {shard.version} did not complete",
                           context, lambda: shard.step_failure(trainer))
            except Refused as exc:
                if exc.code == grpc.StatusCode.ABORTED:  # a trainer is lost: this job's steps are over
                    log.warning("parameter server %d: %s", self.index, exc)
                    self._liveness.check()
                raise
            self._wait(lambda: not shard.undeclared_values(keys),
                       lambda: f"the values of {shard.undeclared_values(keys)} were not declared by trainer 0", context)
            parts = shard.pull(keys, wanted)
            version = shard.version
        yield from frames(pb.Frame(step=version, incarnation=self.incarnation), parts, self.chunk_bytes)

    def _push(self, requests: list[pb.Frame], context: grpc.ServicerContext) -> pb.Ack:
        header = requests[0]
        with self._deciding():
            duplicate = self._shard.push(header.trainer, sequence=int(header.sequence), step=int(header.step),
                                         based_on=int(header.based_on), incarnation=header.incarnation,
                                         pieces=[p for frame in requests for p in frame.pieces])
            if not duplicate:
                self._changed.notify_all()
            return pb.Ack(version=self.version, incarnation=self.incarnation, duplicate=duplicate)
