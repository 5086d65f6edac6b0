"""A parameter server's shard as plain data, deciding each request without gRPC or threads.

A `Shard` holds what one server serves: dense blocks (one row of values each, with the optimizer's
state), table shards, the version (pushes applied in asynchronous mode, steps applied in
synchronous mode), the pending sums of synchronous steps, the last push number taken from each
trainer, and (its `roster`) what is known of each trainer. Each method decides one request: it
checks it, changes the state or not, and returns plain data or raises (`_requests` draws them):

- `RequestError` (`TableFullError` for a full table): the request is malformed (a key, size, byte
  length, offset or row width out of its bounds, a gradient holding NaN);
- `NotDeclaredError`: it names a dense block or table the shard does not hold;
- `ConflictError`: it disagrees with the shard (a re-declaration that differs, a synchronous push
  behind, too far ahead or twice, a trainer that met an earlier process of this server at another
  step, a trainer started for another job);
- `TrainerLostError`: a synchronous step failed, a trainer it waited for being gone.

The shard is not thread-safe: `server.ParameterServer` calls it under one lock, and does the waiting
(a synchronous pull waits until `step_ready`, `step_failure` saying when it never will be). Time
comes from `clock`, so a test moves it by hand. `_checkpoint.shard_state` writes a shard down and
`_checkpoint.restore_shard` reads it back.

Example:
    >>> from unison.ps import ps_pb2 as pb
    >>> shard = Shard(0, num_trainers=1, mode="async")
    >>> shard.declare(0, "sgd", {"learning_rate": 0.5}, [pb.DenseDecl(key="w#0", size=2)], [],
    ...               [pb.Piece(key="w#0", data=np.ones(2, "<f4").tobytes())])
    True
    >>> shard.push(0, sequence=1, step=0, based_on=0, incarnation=shard.incarnation,
    ...            pieces=[pb.Piece(key="w#0", data=np.ones(2, "<f4").tobytes())])
    False
    >>> shard.pull(["w#0"], {})[0].data.tolist(), shard.version
    ([0.5, 0.5], 1)
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import ConfigError, ConflictError, NotDeclaredError, RequestError
from ._requests import (
    DenseDeclaration,
    Piece,
    TableDeclaration,
    agree,
    check_declarations,
    dense_gradient,
    sparse_gradient,
    wanted_ids,
)
from ._roster import Roster
from ._steps import is_duplicate, push_refusal, resume_refusal, staleness, step_complete
from ._wire import Part, floats, sum_rows
from .optim import Optimizer, from_fields
from .table import Initializer, TableShard

__all__ = ["MODES", "DenseBlock", "PendingStep", "Shard"]

log = logging.getLogger(__name__)

MODES = ("async", "sync")
@dataclasses.dataclass
class DenseBlock:
    """One dense block: its values as one row, the optimizer's state, and how much of its first values came."""

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
class PendingStep:
    """One synchronous step's gradients, summed over the trainers that pushed it."""

    contributors: set[int] = dataclasses.field(default_factory=set)
    sequences: dict[int, int] = dataclasses.field(default_factory=dict)  # each contributor's push number
    dense: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.dense.values()) + sum(
            i.nbytes + r.nbytes for parts in self.sparse.values() for i, r in parts)


class Shard:
    """The blocks, tables, version, pending steps and trainers of one parameter server, and its rules.

    Args:
        index: the server's index (named in messages).
        num_trainers: trainers of the job.
        mode: ``"async"`` (apply each push at once) or ``"sync"`` (average each step over all trainers).
        incarnation: tells this process of the server from earlier and later ones (nonzero).
        trainer_timeout_seconds: a trainer not heard for this long is gone.
        clock: seconds of a monotonic clock.
    """

    def __init__(self, index: int, num_trainers: int, mode: str, *, incarnation: int = 1,
                 trainer_timeout_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}. Got mode={mode!r}.")
        if num_trainers < 1:
            raise ConfigError(f"num_trainers must be at least 1. Got {num_trainers}.")
        self.index, self.num_trainers, self.mode = index, num_trainers, mode
        self.incarnation = incarnation
        self.roster = Roster(index, num_trainers, sync=mode == "sync", timeout_seconds=trainer_timeout_seconds,
                             clock=clock)
        self.dense: dict[str, DenseBlock] = {}
        self.tables: dict[str, TableShard] = {}
        self.pending: dict[int, PendingStep] = {}
        # the last push number taken from each trainer, and of those applied (sync: the step completed);
        # a checkpoint keeps the applied ones, as it keeps no pending sums
        self.sequences: dict[int, int] = {}
        self.applied_sequences: dict[int, int] = {}
        self.version = 0
        self.restored = False
        self.staleness: dict[int, int] = {}  # pushes by staleness (16: 16 or more)
        self.counts: dict[str, int] = dict.fromkeys(
            ("pulls", "pushes", "declares", "rows_pulled", "rows_pushed", "dense_elements_pulled",
             "dense_elements_pushed", "staleness_sum", "staleness_max", "duplicate_pushes"), 0)

    def __repr__(self) -> str:
        return (f"<Shard {self.index} {self.mode} version={self.version} blocks={len(self.dense)} "
                f"tables={len(self.tables)}>")

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    # ---- trainers (the rest of what is known of them: `roster`)

    def hello(self, trainer: int, *, num_trainers: int, mode: str, unison_version: str, host: str,
              pid: int) -> int:
        """Meet a trainer started for this job; return the last push number taken from it (0: none)."""
        self.roster.check(trainer)
        if num_trainers != self.num_trainers:
            raise ConflictError(f"trainer {trainer} counts {num_trainers} trainers; parameter server {self.index} "
                                f"was started for {self.num_trainers}. Give every process the same number.")
        if mode != self.mode:
            raise ConflictError(f"trainer {trainer} trains in {mode!r} mode; parameter server {self.index} runs "
                                f"in {self.mode!r} mode. Give every process the same UNISON_PS_MODE.")
        if unison_version != __version__:
            raise ConflictError(f"trainer {trainer} runs unison {unison_version}; parameter server {self.index} "
                                f"runs {__version__}.")
        self.roster.seen(trainer, host=host[:256], pid=pid, finished=False)
        return self.sequences.get(trainer, 0)

    # ---- declarations

    def declare(self, trainer: int, optimizer_kind: str, optimizer_fields: Mapping[str, float],
                dense: Sequence[DenseDeclaration], tables: Sequence[TableDeclaration],
                pieces: Sequence[Piece]) -> bool:
        """Create the blocks and tables not held yet, check the others agree, take trainer 0's first values.

        Values come only with trainer 0's declaration; a block keeps the first values it got (or the
        ones restored). Returns whether a block or table was made or a block's values completed (what a
        checkpoint should keep before the declaration is acknowledged).
        """
        self.roster.check(trainer)
        optimizer = from_fields(optimizer_kind, dict(optimizer_fields))
        check_declarations(dense, tables)
        sizes = {d.key: int(d.size) for d in dense}
        created = False
        self.roster.seen(trainer)
        for key, size in sizes.items():
            block = self.dense.get(key)
            if block is None:
                values = np.zeros((1, size), np.float32)
                self.dense[key] = DenseBlock(values, optimizer.new_slots(values.shape), np.zeros(1, np.int64),
                                             optimizer)
                created = True
            else:
                agree(f"dense block {key!r}", {"size": block.size, "optimizer": block.optimizer},
                      {"size": size, "optimizer": optimizer}, trainer)
        for t in tables:
            initializer = Initializer(t.initializer, t.scale, t.seed)
            table = self.tables.get(t.name)
            if table is None:
                self.tables[t.name] = TableShard(t.name, t.dim, t.capacity, initializer, optimizer,
                                                 declared_capacity=t.declared)
                created = True
            else:
                agree(f"table {t.name!r}", {"dim": table.dim, "capacity": table.declared_capacity,
                                            "initializer": table.initializer, "optimizer": table.optimizer},
                      {"dim": t.dim, "capacity": t.declared or t.capacity, "initializer": initializer,
                       "optimizer": optimizer}, trainer)
        for piece in pieces:
            block = self.dense.get(piece.key)
            if block is None or piece.key not in sizes:
                raise RequestError(f"Declare carries values for {piece.key!r}, which this call does not declare.")
            if block.ready:
                continue  # values already set (by an earlier trainer 0, or restored): the server's win
            data = floats(piece.data, f"values of {piece.key!r}")
            if piece.offset + len(data) > block.size:
                raise RequestError(f"values of {piece.key!r} at offset {piece.offset} run past its {block.size} "
                                   "elements.")
            block.values[0, piece.offset:piece.offset + len(data)] = data
            block.filled += len(data)
            created = created or block.ready
        self.counts["declares"] += 1
        return created

    # ---- pulls

    def check_pull(self, trainer: int, *, step: int, incarnation: int, keys: Sequence[str],
                   pieces: Sequence[Piece]) -> dict[str, np.ndarray]:
        """Check a pull of dense blocks `keys` and of the table rows whose ids `pieces` carry; return the ids by table.

        The pull is of step `step`: it may read once `step_ready(step)` (in synchronous mode, when the steps
        before it are applied).
        """
        self.roster.check(trainer)
        wanted = wanted_ids(pieces)
        self.roster.seen(trainer)
        self._check_resume(trainer, incarnation, step)
        for key in keys:
            if key not in self.dense:
                raise NotDeclaredError(f"dense block {key!r} is not declared on parameter server {self.index}; "
                                       "declare it before pulling.")
        for table in wanted:
            if table not in self.tables:
                raise NotDeclaredError(f"unknown table {table!r} on parameter server {self.index}; declared "
                                       f"tables: {sorted(self.tables)}.")
        if self.sync:
            self.roster.check_failure(trainer)
        return wanted

    def step_ready(self, step: int) -> bool:
        """Whether a pull of `step` may read: in synchronous mode once the steps before it are applied; at once in
        asynchronous mode, whatever the version (a server restarted without a checkpoint is behind the trainer)."""
        return not self.sync or self.version >= step

    def step_failure(self, trainer: int) -> str:
        """Why the step `trainer` waits for cannot complete, or "" while it may.

        A failure is kept (the first one), and `trainer` counted as told of it: the shard's later
        synchronous calls fail with it (`TrainerLostError`), and `Roster.end_reason` counts who knows.
        """
        pending = self.pending.get(self.version)
        gone = self.roster.blockers(self.version, pending.contributors if pending else set())
        if not gone:
            return ""
        message = f"step {self.version} did not complete on parameter server {self.index}: " + "; ".join(gone) + "."
        self.roster.fail(trainer, message)
        return message

    def undeclared_values(self, keys: Sequence[str]) -> list[str]:
        """The blocks of `keys` whose first values trainer 0 has not sent yet (a pull of them waits)."""
        return [k for k in keys if not self.dense[k].ready]

    def pull(self, keys: Sequence[str], wanted: Mapping[str, np.ndarray]) -> list[Part]:
        """The values of the blocks `keys` and the rows of `wanted` (ids by table, from `check_pull`), as copies."""
        parts = []
        for key in keys:
            parts.append(Part(key, self.dense[key].values[0].copy()))
            self.counts["dense_elements_pulled"] += self.dense[key].size
        for table, ids in wanted.items():
            parts.append(Part(table, self.tables[table].lookup(ids).reshape(-1)))
            self.counts["rows_pulled"] += len(ids)
        self.counts["pulls"] += 1
        return parts

    # ---- pushes

    def push(self, trainer: int, *, sequence: int, step: int, based_on: int, incarnation: int,
             pieces: Sequence[Piece]) -> bool:
        """Take a push of gradients; return True when it is one taken before (sent again), which changes nothing.

        Asynchronous: applied at once, the version counting it. Synchronous: added to step `step`'s
        sums; a step every trainer pushed is applied, their average, and the version moves past it.
        A push is checked whole before anything changes (a full table refuses it before any update).
        """
        self.roster.check(trainer)
        dense: dict[str, list[Piece]] = {}
        sparse: dict[str, list[Piece]] = {}
        for piece in pieces:
            (sparse if piece.ids else dense).setdefault(piece.key, []).append(piece)
        self.roster.seen(trainer)
        if is_duplicate(sequence, self.sequences.get(trainer, 0)):
            self.counts["duplicate_pushes"] += 1
            log.info("parameter server %d: trainer %d sent push %d again; it was taken before", self.index, trainer,
                     sequence)
            return True
        grads = {key: self._dense_gradient(key, parts) for key, parts in dense.items()}
        rows = {table: self._sparse_gradient(table, parts) for table, parts in sparse.items()}
        if not self.sync:
            lag = staleness(self.version, based_on)
            self._apply(grads, rows, 1.0)
            self.counts["staleness_sum"] += lag
            self.counts["staleness_max"] = max(self.counts["staleness_max"], lag)
            bucket = min(lag, 16)
            self.staleness[bucket] = self.staleness.get(bucket, 0) + 1
            self.version += 1
            if sequence:
                self.sequences[trainer] = self.applied_sequences[trainer] = sequence
        else:
            self.roster.check_failure(trainer)
            self._check_resume(trainer, incarnation, step)
            pending = self.pending.get(step)
            refusal = push_refusal(step=step, version=self.version, trainer=trainer,
                                   already=pending is not None and trainer in pending.contributors)
            if refusal:
                raise ConflictError(refusal)
            pending = self.pending.setdefault(step, PendingStep())
            for key, grad in grads.items():
                if key in pending.dense:
                    pending.dense[key] += grad
                else:
                    pending.dense[key] = grad.copy()
            for table, (ids, values) in rows.items():
                pending.sparse.setdefault(table, []).append((ids, values))
            pending.contributors.add(trainer)
            if sequence:
                pending.sequences[trainer] = self.sequences[trainer] = sequence
            self.roster.seen(trainer, pushed=step)
            self._apply_complete_steps()
        self.counts["pushes"] += 1
        return False

    def _apply_complete_steps(self) -> None:
        while self.version in self.pending and step_complete(self.pending[self.version].contributors,
                                                             self.num_trainers):
            done = self.pending.pop(self.version)
            summed = {t: sum_rows(np.concatenate([i for i, _ in parts]), np.concatenate([r for _, r in parts]))
                      for t, parts in done.sparse.items()}
            self._apply(done.dense, summed, 1.0 / self.num_trainers)
            self.applied_sequences.update(done.sequences)
            self.version += 1

    def _check_resume(self, trainer: int, incarnation: int, step: int) -> None:
        """Refuse a synchronous call from a trainer that met an earlier process of this server, unless the steps agree."""
        if not self.sync or incarnation == self.incarnation:
            return
        refusal = resume_refusal(server=self.index, version=self.version, restored=self.restored, trainer=trainer,
                                 step=step)
        if refusal:
            raise ConflictError(refusal)
        log.info("parameter server %d: trainer %d goes on at step %d with this process", self.index, trainer, step)

    def _dense_gradient(self, key: str, pieces: list[Piece]) -> np.ndarray:
        block = self.dense.get(key)
        if block is None:
            raise NotDeclaredError(f"dense block {key!r} is not declared on parameter server {self.index}; declare "
                                   "it before pushing.")
        grad = dense_gradient(key, block.size, pieces)
        self.counts["dense_elements_pushed"] += block.size
        return grad

    def _sparse_gradient(self, name: str, pieces: list[Piece]) -> tuple[np.ndarray, np.ndarray]:
        table = self.tables.get(name)
        if table is None:
            raise NotDeclaredError(f"unknown table {name!r} on parameter server {self.index}; declared tables: "
                                   f"{sorted(self.tables)}.")
        summed = sparse_gradient(name, table.dim, pieces)
        self.counts["rows_pushed"] += sum(len(p.ids) for p in pieces) // 8  # ids as sent, repeats included
        return summed

    def _apply(self, dense: dict[str, np.ndarray], sparse: dict[str, tuple[np.ndarray, np.ndarray]],
               scale: float) -> None:
        """Apply gradients scaled by `scale`; a full table refuses before anything changes."""
        for name, (ids, _) in sparse.items():
            self.tables[name].positions(ids)  # makes missing rows, or raises TableFullError first
        for key, grad in dense.items():
            block = self.dense[key]
            block.optimizer.apply(block.values, block.slots, block.steps, np.zeros(1, np.int64),
                                  (grad * np.float32(scale))[None, :])
        for name, (ids, rows) in sparse.items():
            self.tables[name].apply(ids, rows * np.float32(scale))

    # ---- statistics (a checkpoint of the shard: `_checkpoint.shard_state`)

    def statistics(self) -> dict[str, Any]:
        """Counters and state: calls, rows, elements, staleness, memory held, pending steps, trainers."""
        out: dict[str, Any] = dict(self.counts)
        memory = sum(b.values.nbytes + b.steps.nbytes + sum(a.nbytes for a in b.slots.values())
                     for b in self.dense.values())
        memory += sum(t.nbytes for t in self.tables.values())
        memory += sum(p.nbytes for p in self.pending.values())
        out.update(
            version=self.version, restored=self.restored, dense_blocks=len(self.dense),
            dense_elements=sum(b.size for b in self.dense.values()),
            tables={name: {"rows": len(t), "capacity": t.capacity, "declared_capacity": t.declared_capacity,
                           "dim": t.dim}
                    for name, t in self.tables.items()},
            staleness_histogram={str(k): v for k, v in sorted(self.staleness.items())},
            memory_bytes=memory, pending_steps=sorted(self.pending), **self.roster.statistics(),
        )
        return out

