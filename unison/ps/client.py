"""A trainer's connection to the parameter servers: declare, pull and push dense parameters and table rows.

Example:
    >>> client = Client(["127.0.0.1:5000"], secret, trainer=0, num_trainers=1)   # doctest: +SKIP
    >>> client.connect()                                                          # doctest: +SKIP
    >>> client.declare_dense({"w": np.zeros((4, 3), np.float32)}, SGD(0.1))       # doctest: +SKIP
    >>> client.declare_table("emb", dim=8, capacity=1000)                         # doctest: +SKIP
    >>> rows = client.pull_sparse("emb", np.array([3, 99, 3]))                    # doctest: +SKIP
    >>> client.push(dense={"w": grad_w}, sparse={"emb": (ids, grad_rows)})        # doctest: +SKIP
    >>> client.finish()                                                           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
import numpy as np

from .._version import __version__
from ..errors import ConfigError
from ..ops import TextEnum
from ..rpc.endpoints import open_channel
from ..rpc.heartbeat import every
from ..rpc.security import token_metadata
from ..rpc.stub import Cancelled, Retry, Stub
from . import ps_pb2 as pb
from ._ids import table_ids
from ._methods import PARAMETER_SERVER
from ._reach import Unreached, gave_up, unavailable_message
from ._requests import MAX_DIM, MAX_ELEMENTS
from ._wire import DEFAULT_CHUNK_BYTES, Part, floats, frames, sum_rows
from .errors import RequestError, ServerUnavailableError, TableFullError, TrainerLostError
from .optim import SGD, Optimizer
from .plan import DEFAULT_SLICE_ELEMENTS, DensePlan, Placement, plan_dense, split_rows
from .shard import MODES
from .table import Initializer

__all__ = ["Client", "ClientState", "shard_capacity", "table_refusal"]

_Reply = TypeVar("_Reply")

log = logging.getLogger(__name__)

# A channel that lost its server tries to connect again at least every second (gRPC's default backoff
# grows to 2 minutes), so a server restarted within the reconnect window is found within a second. The
# coordinator service's channels keep gRPC's backoff: rank 0 never comes back.
_RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                      ("grpc.max_reconnect_backoff_ms", 1000)]
_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def table_refusal(name: str, dim: Any, capacity: Any) -> str:
    """Why a table of `dim` and `capacity`, as the user passed them, cannot be declared; "" when it can.

    Example:
        >>> table_refusal("emb", 16, 2**62)
        "table 'emb': capacity (the most distinct ids it holds) must be an integer in [1, 17179869184]. Got capacity=4611686018427387904."
    """
    for what, value, high in (("dim (the width of a row)", dim, MAX_DIM),
                              ("capacity (the most distinct ids it holds)", capacity, MAX_ELEMENTS)):
        whole = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if not whole or not 1 <= value <= high:
            return f"table {name!r}: {what} must be an integer in [1, {high}]. Got {what.split()[0]}={value!r}."
    return ""


def shard_capacity(capacity: int, num_servers: int) -> int:
    """Rows each server may hold of a table of `capacity` rows: its share, with room for the hash's imbalance."""
    if num_servers == 1:
        return capacity
    return min(capacity, math.ceil(capacity / num_servers * 1.25) + 16)


@dataclasses.dataclass(frozen=True)
class _Table:
    dim: int
    capacity: int


class ClientState(TextEnum):
    """A client's lifecycle: created, connected to every server, closed for good."""

    CREATED = "created"
    CONNECTED = "connected"
    CLOSED = "closed"


class Client:
    """One trainer's connection to every parameter server of the job.

    Args:
        endpoints: ``host:port`` of each server, in server order.
        secret: the job secret.
        trainer: this trainer's id, in range(num_trainers).
        num_trainers: trainers of the job.
        mode: ``"async"`` or ``"sync"``, as the servers run.
        placement: how dense blocks go to servers (``"round_robin"`` or ``"name_hash"``).
        slice_elements: dense parameters larger than this are cut across servers (0: never).
        chunk_bytes: tensor bytes per frame of a call.
        reconnect_seconds: how long a call waits for a server that is down or restarting.
        heartbeat_seconds: how often this trainer tells the servers it is alive.
    """

    def __init__(self, endpoints: Sequence[str], secret: str, *, trainer: int, num_trainers: int,
                 mode: str = "async", placement: Placement | str = Placement.ROUND_ROBIN,
                 slice_elements: int = DEFAULT_SLICE_ELEMENTS, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 reconnect_seconds: float = 60.0, heartbeat_seconds: float = 1.0) -> None:
        if not endpoints:
            raise ConfigError("a parameter-server trainer needs at least one server endpoint.")
        if not 0 <= trainer < num_trainers:
            raise ConfigError(f"trainer must be in range(num_trainers={num_trainers}). Got trainer={trainer}.")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}. Got mode={mode!r}.")
        self.endpoints = tuple(endpoints)
        self.trainer, self.num_trainers, self.mode = trainer, num_trainers, mode
        self.placement, self.slice_elements = placement, slice_elements
        self.chunk_bytes = chunk_bytes
        self.reconnect_seconds = reconnect_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.state = ClientState.CREATED
        self.step = 0  # pushes made; a synchronous pull waits until the servers applied this many steps
        self._channels = [open_channel(e, _RECONNECT_OPTIONS) for e in self.endpoints]
        # calls count their bytes; heartbeats do not
        self._stubs = [Stub(c, PARAMETER_SERVER, token_metadata(secret),
                            on_bytes_out=lambda size: self._count(bytes_sent=size),
                            on_bytes_in=lambda size: self._count(bytes_received=size)) for c in self._channels]
        self._beat_stubs = [Stub(c, PARAMETER_SERVER, token_metadata(secret)) for c in self._channels]
        self._unreached: list[Unreached | None] = [None] * len(self.endpoints)
        self._versions = [0] * len(self.endpoints)
        self._incarnations = [0] * len(self.endpoints)  # the server process each call is meant for
        self._sequences = [0] * len(self.endpoints)  # pushes numbered per server, so a resend is not applied twice
        self._plan = DensePlan(len(self.endpoints), {}, ())
        self._tables: dict[str, _Table] = {}
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(
            ("pulls", "pushes", "bytes_sent", "bytes_received", "rows_pulled", "rows_pushed", "retries",
             "pushes_taken_before", "pull_seconds", "push_seconds"), 0)
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._pool = futures.ThreadPoolExecutor(max_workers=len(self.endpoints), thread_name_prefix="unison-ps-call")

    def __repr__(self) -> str:
        return (f"<Client trainer={self.trainer}/{self.num_trainers} {self.mode} {self.state} "
                f"servers={len(self.endpoints)} step={self.step}>")

    @property
    def num_servers(self) -> int:
        return len(self.endpoints)

    @property
    def plan(self) -> DensePlan:
        """Where the declared dense parameters live."""
        return self._plan

    def statistics(self) -> dict[str, float]:
        """Counters: calls, bytes sent and received (serialized messages), rows moved, seconds in calls."""
        with self._lock:
            return dict(self._counts, step=self.step)

    # ---- calls

    def _count(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def _reached(self, server: int, error: str = "") -> None:
        """Note a contact with `server` that worked (no `error`) or failed (the first failure starts the wait)."""
        with self._lock:
            known = self._unreached[server]
            if not error:
                self._unreached[server] = None
            elif known is None:
                self._unreached[server] = Unreached(time.monotonic(), time.time(), error)
            else:
                self._unreached[server] = dataclasses.replace(known, error=error)

    def _given_up(self, server: int) -> Unreached | None:
        """What is known of `server` when this trainer no longer waits for it, else None."""
        with self._lock:
            unreached = self._unreached[server]
        return unreached if gave_up(unreached, time.monotonic(), self.reconnect_seconds) else None

    def _lost(self, server: int) -> tuple[int, Unreached] | None:
        """A server this trainer gave up on (`server` first), with what is known of it; else None.

        Every step reaches every server, so once one is given up on no call of this trainer can be of
        use: a call to another server (a synchronous pull waiting for the step) ends naming the lost one.
        """
        for candidate in [server, *(s for s in range(self.num_servers) if s != server)]:
            unreached = self._given_up(candidate)
            if unreached is not None:
                return candidate, unreached
        return None

    def _unavailable(self, server: int, method: str, unreached: Unreached) -> ServerUnavailableError:
        return ServerUnavailableError(unavailable_message(
            server=server, endpoint=self.endpoints[server], trainer=self.trainer, method=method, unreached=unreached,
            now=time.monotonic(), reconnect_seconds=self.reconnect_seconds))

    def _call(self, server: int, method: str, requests: Callable[[], Iterator[Any]],
              timeout: float | None = None) -> Any:
        """One call to one server; a server down or restarting is waited for up to `reconnect_seconds`.

        The wait starts at the first failed contact (`_reached`); the heartbeat thread notes contacts
        too, and cancels a call still waiting on a server it gave up on (one stopped, not dead).
        """

        def unless_lost() -> None:
            lost = self._lost(server)
            if lost is not None:
                raise self._unavailable(lost[0], method, lost[1])

        def again(exc: grpc.RpcError) -> bool:
            # not wait_for_ready: a server that is down fails the call at once, and it is made again
            if self._closed.is_set():
                return False
            self._reached(server, f"{exc.code().name}: {exc.details()}")
            self._count(retries=1)
            return True

        try:
            result = self._stubs[server].call(method, requests, timeout=timeout,
                                              retry=Retry(again, before=unless_lost, pause_seconds=0.2),
                                              error=lambda exc: self._error(server, method, exc))
        except Cancelled:  # the heartbeat gave up on a server (or close() ran)
            lost = self._lost(server)
            if lost is None:
                raise ServerUnavailableError(f"trainer {self.trainer}'s {method} to parameter server {server} "
                                             f"({self.endpoints[server]}) was cancelled: the client is closing.")\
                    from None
            raise self._unavailable(lost[0], method, lost[1]) from None
        self._reached(server)
        return result

    def _error(self, server: int, method: str, exc: grpc.RpcError) -> Exception:
        """The error a trainer raises for a failed call (made again no more): the status's meaning, or the lost server."""
        code, details = exc.code(), exc.details()
        lost = self._lost(server)
        if code == grpc.StatusCode.CANCELLED and lost is not None:
            return self._unavailable(lost[0], method, lost[1])
        where = f"parameter server {server} ({self.endpoints[server]})"
        if code in _REFUSALS:
            cls = TableFullError if "is full" in (details or "") else RequestError
            return cls(f"{where} refused {method} from trainer {self.trainer}: {details}")
        if code == grpc.StatusCode.ABORTED:
            return TrainerLostError(f"trainer {self.trainer}: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ConfigError(f"{where} refused trainer {self.trainer}: {details}. Give every process of the "
                               "job the same UNISON_SECRET.")
        return ServerUnavailableError(f"{where} did not answer {method} from trainer {self.trainer}: "
                                      f"{code.name}: {details}")

    def _on_every(self, call: Callable[[int], _Reply]) -> list[_Reply]:
        """`call(server)` for every server, at once; the first error is raised as soon as it happens.

        A call still waiting on another server then goes on in the background (a synchronous pull
        may wait a long time): the error comes first.
        """
        if self.num_servers == 1:
            return [call(0)]
        running = [self._pool.submit(call, server) for server in range(self.num_servers)]
        futures.wait(running, return_when=futures.FIRST_EXCEPTION)
        for future in running:
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        return [future.result() for future in running]

    def _info(self) -> pb.TrainerInfo:
        return pb.TrainerInfo(trainer=self.trainer, num_trainers=self.num_trainers, host=socket.gethostname(),
                              pid=os.getpid(), version=__version__, mode=self.mode)

    # ---- lifecycle

    def connect(self) -> list[pb.HelloReply]:
        """Introduce this trainer to every server (waiting for them to come up) and start heartbeats."""
        info = self._info()
        replies = self._on_every(lambda s: self._call(s, "Hello", lambda: iter([info])))
        for server, reply in enumerate(replies):
            if reply.server != server:
                raise ConfigError(
                    f"The parameter server at {self.endpoints[server]} is server {reply.server} of "
                    f"{reply.num_servers} (its UNISON_PS_SERVER_INDEX), but trainer {self.trainer}'s "
                    f"UNISON_PS_ENDPOINTS lists it as server {server} of {self.num_servers}. Give every "
                    "server the index of its place in UNISON_PS_ENDPOINTS, and every process the same list.")
        for reply in replies:
            self._versions[reply.server] = reply.version
            self._sequences[reply.server] = max(self._sequences[reply.server], reply.sequence)
            self._incarnations[reply.server] = reply.incarnation
        if self.mode == "sync":
            # a restarted trainer takes up at the servers' step
            self.step = min(r.version for r in replies)
        self.state = ClientState.CONNECTED
        if self.heartbeat_seconds > 0:
            self._heartbeat = threading.Thread(target=self._beat, name=f"unison-ps-heartbeat-{self.trainer}",
                                               daemon=True)
            self._heartbeat.start()
        return replies

    def _beat(self) -> None:
        """Tell every server this trainer is alive; note which servers answer, and stop waiting on the lost."""
        info = pb.TrainerInfo(trainer=self.trainer)

        def beat() -> bool:
            for server, stub in enumerate(self._beat_stubs):
                try:
                    stub.call("Heartbeat", lambda: iter([info]), timeout=max(self.heartbeat_seconds, 1.0))
                    self._reached(server)
                except grpc.RpcError as exc:
                    log.debug("trainer %d: a heartbeat to server %d failed: %s", self.trainer, server, exc.code())
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        self._reached(server, f"{exc.code().name}: {exc.details()}")
                if self._given_up(server) is not None:
                    for calls in self._stubs:  # every call: a step cannot end without this server; they
                        calls.cancel_in_flight()  # raise ServerUnavailableError naming it, in their threads
            return True

        every(self.heartbeat_seconds, self._closed, beat)

    def finish(self) -> None:
        """Tell every server this trainer is done (servers exit once every trainer is), and close."""
        if self.state is ClientState.CONNECTED:
            info = self._info()
            try:
                self._on_every(lambda s: self._call(s, "Finish", lambda: iter([info]), timeout=30.0))
            finally:
                self.close()

    def close(self) -> None:
        """Stop heartbeats and close the channels, without telling the servers."""
        if self.state is ClientState.CLOSED:
            return
        self._closed.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5.0)
        self._pool.shutdown(wait=False)
        for channel in self._channels:
            channel.close()
        self.state = ClientState.CLOSED

    def __enter__(self) -> Client:
        if self.state is ClientState.CREATED:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.finish()
        else:
            self.close()

    # ---- declarations

    def declare_dense(self, params: Mapping[str, np.ndarray], optimizer: Optimizer | None = None) -> DensePlan:
        """Place dense parameters on the servers; trainer 0's values are their starting values.

        Every trainer declares the same names and shapes in the same order. A server resumed from a
        checkpoint keeps its values; pull to get them.
        """
        optimizer = optimizer or SGD()
        arrays = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in params.items()}
        plan = plan_dense([(n, a.shape) for n, a in arrays.items()], self.num_servers,
                          placement=self.placement, slice_elements=self.slice_elements)
        spec = pb.Optimizer(kind=optimizer.kind, fields=optimizer.fields())

        def declare(server: int) -> Any:
            blocks = plan.on(server)
            header = pb.Frame(trainer=self.trainer, optimizer=spec,
                              dense=[pb.DenseDecl(key=b.key, size=b.size) for b in blocks])
            parts = [Part(b.key, arrays[b.name].reshape(-1)[b.start:b.stop]) for b in blocks] \
                if self.trainer == 0 else []
            return self._call(server, "Declare", lambda: frames(header, parts, self.chunk_bytes))

        self._on_every(declare)
        self._plan = DensePlan(self.num_servers, {**self._plan.shapes, **plan.shapes},
                               self._plan.blocks + plan.blocks)
        return plan

    def declare_table(self, name: str, dim: int, capacity: int, *, initializer: Initializer | None = None,
                      optimizer: Optimizer | None = None) -> None:
        """Create a sparse table on the servers: rows of `dim` floats, up to `capacity` rows in all."""
        refusal = table_refusal(name, dim, capacity)
        if refusal:
            raise RequestError(refusal)
        initializer = initializer or Initializer()
        optimizer = optimizer or SGD()
        decl = pb.TableDecl(name=name, dim=dim, capacity=shard_capacity(capacity, self.num_servers),
                            initializer=initializer.kind, scale=initializer.scale, seed=initializer.seed,
                            declared=capacity)
        header = pb.Frame(trainer=self.trainer, tables=[decl],
                          optimizer=pb.Optimizer(kind=optimizer.kind, fields=optimizer.fields()))
        self._on_every(lambda s: self._call(s, "Declare", lambda: iter([header])))
        self._tables[name] = _Table(dim, capacity)

    def _table(self, name: str) -> _Table:
        table = self._tables.get(name)
        if table is None:
            raise RequestError(f"unknown table {name!r}: declare it with declare_table first. Declared: "
                               f"{sorted(self._tables)}.")
        return table

    # ---- pulls and pushes

    def pull(self, dense: Sequence[str] = (), sparse: Mapping[str, np.ndarray] | None = None,
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Fetch dense parameters by name, and the rows of unique ids per table, in one call per server.

        In synchronous mode the values include every step this trainer has pushed (the call waits
        for the other trainers' gradients of that step).

        Returns:
            (dense values by name, with their declared shapes; per table the rows of the given ids,
            shape (len(ids), dim), in the order of the ids).
        """
        started = time.perf_counter()
        blocks = [b for name in dense for b in self._blocks_of(name)]
        for table in sparse or {}:
            self._table(table)
        splits = {t: split_rows(table_ids(t, ids).reshape(-1), self.num_servers) for t, ids in (sparse or {}).items()}

        def pull_from(server: int) -> list[pb.Frame] | None:
            keys = [b.key for b in blocks if b.server == server]
            pieces = [pb.Piece(key=t, ids=np.ascontiguousarray(u[p[server]], "<i8").tobytes())
                      for t, (u, _, p) in splits.items() if len(p[server])]
            if not keys and not pieces:
                return None
            header = pb.Frame(trainer=self.trainer, step=self.step, keys=keys, pieces=pieces,
                              incarnation=self._incarnations[server])
            return self._call(server, "Pull", lambda: iter([header]))  # type: ignore[no-any-return]

        replies = self._on_every(pull_from)
        flat: dict[str, np.ndarray] = {}
        for server, reply in enumerate(replies):
            if reply is None:
                continue
            self._versions[server] = reply[0].step
            self._incarnations[server] = reply[0].incarnation
            for frame in reply:
                for piece in frame.pieces:
                    data = floats(piece.data, f"reply for {piece.key!r}")
                    slot = f"{server}\0{piece.key}" if piece.key in splits else piece.key
                    target = flat.get(slot)
                    if target is None:
                        target = flat[slot] = np.empty(self._reply_size(piece.key, server, splits), np.float32)
                    target[piece.offset:piece.offset + len(data)] = data
        values = {}
        for name in dense:
            out = np.empty(math.prod(self._plan.shapes[name]), np.float32)
            for b in self._blocks_of(name):
                out[b.start:b.stop] = flat[b.key]
            values[name] = out.reshape(self._plan.shapes[name])
        rows = {}
        rows_pulled = 0
        for table, (unique, inverse, parts) in splits.items():
            dim = self._tables[table].dim
            uniq_rows = np.empty((len(unique), dim), np.float32)
            for server, positions in enumerate(parts):
                if len(positions):
                    uniq_rows[positions] = flat[f"{server}\0{table}"].reshape(len(positions), dim)
            rows[table] = uniq_rows[inverse]
            rows_pulled += len(unique)
        self._count(pulls=1, rows_pulled=rows_pulled, pull_seconds=time.perf_counter() - started)
        return values, rows

    def _reply_size(self, key: str, server: int, splits: Mapping[str, Any]) -> int:
        if key in splits:
            return len(splits[key][2][server]) * self._tables[key].dim
        return next(b.size for b in self._plan.blocks if b.key == key)

    def _blocks_of(self, name: str) -> tuple[Any, ...]:
        if name not in self._plan.shapes:
            raise RequestError(f"unknown dense parameter {name!r}: declare it with declare_dense first. "
                               f"Declared: {sorted(self._plan.shapes)}.")
        return self._plan.of(name)

    def pull_dense(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The current values of dense parameters (every declared one when `names` is None)."""
        return self.pull(dense=list(self._plan.shapes) if names is None else names)[0]

    def pull_sparse(self, table: str, ids: np.ndarray) -> np.ndarray:
        """The rows of `ids` (any shape of int64 ids, repeats allowed): shape ``ids.shape + (dim,)``.

        Only the unique ids travel, each to the server holding it.
        """
        ids = table_ids(table, ids)
        return self.pull(sparse={table: ids.reshape(-1)})[1][table].reshape(ids.shape + (self._table(table).dim,))

    def push(self, dense: Mapping[str, np.ndarray] | None = None,
             sparse: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        """Send one step's gradients: dense by name, and per table (ids, one gradient row per id).

        Repeated ids of a table are summed before they travel. Every server gets one call (in
        synchronous mode an empty one too, so each server's step completes).
        """
        started = time.perf_counter()
        parts_of: list[list[Part]] = [[] for _ in range(self.num_servers)]
        for name, grad in (dense or {}).items():
            blocks = self._blocks_of(name)
            array = np.asarray(grad, dtype=np.float32)
            if array.shape != tuple(self._plan.shapes[name]):
                raise RequestError(f"the gradient of {name!r} has shape {array.shape}; the parameter was declared "
                                   f"with shape {tuple(self._plan.shapes[name])}, and a gradient must have the "
                                   "parameter's shape (nothing was sent).")
            flat = np.ascontiguousarray(array).reshape(-1)
            for b in blocks:
                parts_of[b.server].append(Part(b.key, flat[b.start:b.stop]))
        rows_pushed = 0
        for table, (ids, grads) in (sparse or {}).items():
            dim = self._table(table).dim
            ids = table_ids(table, ids).reshape(-1)
            grads = np.asarray(grads, dtype=np.float32)
            if grads.size != len(ids) * dim:
                raise RequestError(f"the gradient of table {table!r} has {grads.size} values for {len(ids)} ids; "
                                   f"rows of this table have dim={dim}.")
            unique, summed = sum_rows(ids, grads.reshape(len(ids), dim))
            _, _, parts = split_rows(unique, self.num_servers)
            for server, positions in enumerate(parts):
                if len(positions):
                    parts_of[server].append(Part(table, summed[positions], unique[positions]))
            rows_pushed += len(unique)

        def push_to(server: int) -> Any:
            if not parts_of[server] and self.mode == "async":
                return None
            with self._lock:
                self._sequences[server] += 1
                sequence = self._sequences[server]
            header = pb.Frame(trainer=self.trainer, step=self.step, based_on=self._versions[server],
                              sequence=sequence, incarnation=self._incarnations[server])
            # a resend after a lost reply carries the same number: the server takes it once
            ack = self._call(server, "Push", lambda: frames(header, parts_of[server], self.chunk_bytes))
            self._incarnations[server] = ack.incarnation
            return ack

        acks = self._on_every(push_to)
        self._count(pushes_taken_before=sum(1 for ack in acks if ack is not None and ack.duplicate))
        self.step += 1
        self._count(pushes=1, rows_pushed=rows_pushed, push_seconds=time.perf_counter() - started)

    # ---- the servers' side

    def server_statistics(self) -> list[dict[str, Any]]:
        """Every server's statistics() (calls, bytes, staleness, memory, trainers), in server order."""
        replies = self._on_every(lambda s: self._call(s, "Status", lambda: iter([pb.StatusRequest()]),
                                                      timeout=30.0))
        return [json.loads(r.statistics_json) for r in replies]

    def checkpoint(self) -> list[str]:
        """Ask every server to write its checkpoint now; return the files' paths."""
        replies = self._on_every(lambda s: self._call(s, "Checkpoint", lambda: iter([pb.CheckpointRequest()]),
                                                      timeout=600.0))
        return [r.path for r in replies]
