"""A parameter server's shard without gRPC: declarations, pushes applied and refused, versions, steps, checkpoints."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from unison._version import __version__
from unison.errors import (
    ConfigError,
    ConflictError,
    InvalidArgumentError,
    NotDeclaredError,
    RequestError,
    TableFullError,
    TrainerLostError,
)
from unison.ps import _checkpoint
from unison.ps import ps_pb2 as pb
from unison.ps.optim import SGD, Adam
from unison.ps.shard import Shard


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(mode: str = "async", num_trainers: int = 2, incarnation: int = 7) -> tuple[Shard, Clock]:
    clock = Clock()
    return Shard(0, num_trainers, mode, incarnation=incarnation, trainer_timeout_seconds=5.0, clock=clock), clock


def floats_piece(key: str, values: object, offset: int = 0) -> pb.Piece:
    return pb.Piece(key=key, offset=offset, data=np.asarray(values, "<f4").tobytes())


def rows_piece(table: str, ids: object, rows: object) -> pb.Piece:
    return pb.Piece(key=table, ids=np.asarray(ids, "<i8").tobytes(), data=np.asarray(rows, "<f4").tobytes())


def ids_piece(table: str, ids: object) -> pb.Piece:
    return pb.Piece(key=table, ids=np.asarray(ids, "<i8").tobytes())


def table_decl(name: str = "emb", dim: int = 2, capacity: int = 10, **kw: object) -> pb.TableDecl:
    return pb.TableDecl(name=name, dim=dim, capacity=capacity, initializer=str(kw.pop("initializer", "zeros")),
                        **kw)  # type: ignore[arg-type]


def declare(shard: Shard, trainer: int = 0, values: object = (1.0, 2.0), lr: float = 0.5, tables: tuple = (),
            key: str = "w#0") -> bool:
    pieces = [floats_piece(key, values)] if trainer == 0 else []
    return shard.declare(trainer, "sgd", {"learning_rate": lr}, [pb.DenseDecl(key=key, size=len(values))],
                         list(tables), pieces)  # type: ignore[arg-type]


def push(shard: Shard, trainer: int, pieces: list[pb.Piece], *, sequence: int = 0, step: int = 0,
         based_on: int = 0, incarnation: int = 7) -> bool:
    return shard.push(trainer, sequence=sequence, step=step, based_on=based_on, incarnation=incarnation,
                      pieces=pieces)


def pull(shard: Shard, keys: list[str], pieces: list[pb.Piece] = (), trainer: int = 0, step: int = 0,
         incarnation: int = 7) -> dict[str, np.ndarray]:
    wanted = shard.check_pull(trainer, step=step, incarnation=incarnation, keys=keys, pieces=list(pieces))
    return {part.key: part.data for part in shard.pull(keys, wanted)}


def hello(shard: Shard, trainer: int, pid: int = 100) -> int:
    return shard.hello(trainer, num_trainers=shard.num_trainers, mode=shard.mode, unison_version=__version__,
                       host=f"h{trainer}", pid=pid + trainer)


# ---- declarations


def test_a_declaration_makes_blocks_and_tables_and_takes_trainer_0s_values_once() -> None:
    shard, _ = make()
    assert declare(shard, trainer=1, values=(0.0, 0.0), tables=(table_decl(),))  # made: a checkpoint is due
    assert shard.undeclared_values(["w#0"]) == ["w#0"]  # a pull of it waits for trainer 0
    assert declare(shard, trainer=0, values=(1.0, 2.0), tables=(table_decl(),))  # its values completed
    assert shard.undeclared_values(["w#0"]) == []
    assert not declare(shard, trainer=0, values=(5.0, 5.0))  # values already set: the first win, nothing made
    np.testing.assert_array_equal(pull(shard, ["w#0"])["w#0"], [1.0, 2.0])
    assert shard.counts["declares"] == 3


def test_values_sent_in_pieces_complete_a_block_only_when_all_came() -> None:
    shard, _ = make()
    decl = [pb.DenseDecl(key="w#0", size=3)]
    assert shard.declare(0, "sgd", {}, decl, [], [floats_piece("w#0", [1.0, 2.0])])  # made
    assert shard.undeclared_values(["w#0"]) == ["w#0"]
    assert shard.declare(0, "sgd", {}, decl, [], [floats_piece("w#0", [3.0], offset=2)])  # completed
    assert shard.undeclared_values(["w#0"]) == []
    with pytest.raises(RequestError, match=r"^Declare carries values for 'v#0', which this call does not declare\.$"):
        shard.declare(0, "sgd", {}, decl, [], [floats_piece("v#0", [1.0])])
    shard.declare(0, "sgd", {}, [pb.DenseDecl(key="u#0", size=2)], [], [])
    with pytest.raises(RequestError, match=r"^values of 'u#0' at offset 1 run past its 2 elements\.$"):
        shard.declare(0, "sgd", {}, [pb.DenseDecl(key="u#0", size=2)], [], [floats_piece("u#0", [1.0, 2.0], 1)])


def test_a_declaration_that_differs_is_refused_naming_both_values() -> None:
    shard, _ = make()
    declare(shard, tables=(table_decl(dim=4, capacity=10),))
    with pytest.raises(ConflictError, match=r"^table 'emb' was declared differently before; dim: 4 here, 8 from "
                                            r"trainer 1\. Every trainer must declare the same parameters\.$"):
        declare(shard, trainer=1, tables=(table_decl(dim=8, capacity=10),))
    with pytest.raises(ConflictError, match=r"dense block 'w#0' was declared differently before; size: 2 here, 3 "
                                            r"from trainer 1; optimizer: SGD\(learning_rate=0\.5\) here, "
                                            r"SGD\(learning_rate=0\.1\) from trainer 1"):
        declare(shard, trainer=1, values=(0.0, 0.0, 0.0), lr=0.1)
    # the whole table's capacity is compared, not each server's share of it
    declare(shard, trainer=1, tables=(table_decl(dim=4, capacity=3, declared=10),))


@pytest.mark.parametrize(("dense", "table", "message"), [
    (pb.DenseDecl(key="w", size=2), None,
     r"^a dense block key is '<parameter>#<block>' and a table name has no '#'\. Got dense block 'w'\.$"),
    (pb.DenseDecl(key="w#0", size=0), None, r"^dense block 'w#0': size must be in \[1, 17179869184\]\. Got 0\.$"),
    (None, table_decl(name="e#1"), r"a table name has no '#'\. Got table 'e#1'\.$"),
    (None, table_decl(name=""), r"^a table name must have 1 to 256 characters\. Got 0\.$"),
    (None, table_decl(dim=0), r"^table 'emb': dim must be in \[1, 65536\]\. Got dim=0\.$"),
    (None, table_decl(capacity=0, declared=5),
     r"^table 'emb': capacity must be in \[1, 17179869184\]\. Got capacity=5 \(0 rows on this server\)\.$"),
    (None, table_decl(initializer="ones"),
     r"^table 'emb': initializer must be one of \('zeros', 'uniform', 'normal'\)\. Got 'ones'\.$"),
])
def test_a_malformed_declaration_is_refused_and_makes_nothing(dense: pb.DenseDecl | None, table: pb.TableDecl | None,
                                                               message: str) -> None:
    shard, _ = make()
    with pytest.raises(RequestError, match=message):
        shard.declare(0, "sgd", {}, [dense] if dense else [], [table] if table else [], [])
    assert (shard.dense, shard.tables, shard.counts["declares"]) == ({}, {}, 0)


def test_a_bad_optimizer_is_refused() -> None:
    shard, _ = make()
    with pytest.raises(InvalidArgumentError, match=r"^optimizer must be one of \['adagrad', 'adam', 'momentum', "
                                                   r"'sgd'\]\. Got 'lamb'\.$"):
        shard.declare(0, "lamb", {}, [pb.DenseDecl(key="w#0", size=1)], [], [])


# ---- trainers


def test_hello_refuses_a_trainer_of_another_job_and_returns_the_last_push_number() -> None:
    shard, _ = make()
    with pytest.raises(RequestError, match=r"^trainer must be in range\(num_trainers=2\)\. Got trainer=2\.$"):
        hello(shard, 2)
    with pytest.raises(ConflictError, match=r"^trainer 1 counts 3 trainers; parameter server 0 was started for 2\."):
        shard.hello(1, num_trainers=3, mode="async", unison_version=__version__, host="h", pid=1)
    with pytest.raises(ConflictError, match=r"^trainer 1 trains in 'sync' mode; parameter server 0 runs in 'async' "
                                            r"mode\. Give every process the same UNISON_PS_MODE\.$"):
        shard.hello(1, num_trainers=2, mode="sync", unison_version=__version__, host="h", pid=1)
    with pytest.raises(ConflictError, match=rf"^trainer 1 runs unison 0\.0\.1; parameter server 0 runs "
                                            rf"{re.escape(__version__)}\.$"):
        shard.hello(1, num_trainers=2, mode="async", unison_version="0.0.1", host="h", pid=1)
    assert shard.roster.trainers == {}  # a refused trainer is not counted
    assert hello(shard, 1) == 0
    declare(shard)
    push(shard, 1, [floats_piece("w#0", [0.0, 0.0])], sequence=4)
    assert hello(shard, 1) == 4  # a trainer that reconnects numbers its pushes on from here
    assert shard.roster.trainers[1].host == "h1" and shard.roster.trainers[1].pid == 101


def test_a_shard_is_made_for_one_mode_and_at_least_one_trainer() -> None:
    with pytest.raises(ConfigError, match=r"^mode must be one of \('async', 'sync'\)\. Got mode='semi'\.$"):
        Shard(0, 2, "semi")
    with pytest.raises(ConfigError, match=r"^num_trainers must be at least 1\. Got 0\.$"):
        Shard(0, 0, "async")


# ---- asynchronous pushes


def test_an_async_push_is_applied_at_once_and_counts_its_staleness() -> None:
    shard, _ = make()
    declare(shard, values=(1.0, 2.0), lr=0.5)
    assert not push(shard, 0, [floats_piece("w#0", [1.0, 1.0])], sequence=1, based_on=0)
    assert shard.version == 1
    np.testing.assert_array_equal(pull(shard, ["w#0"])["w#0"], [0.5, 1.5])
    assert not push(shard, 1, [floats_piece("w#0", [2.0, 0.0])], sequence=1, based_on=0)  # one update in between
    assert shard.version == 2
    np.testing.assert_array_equal(pull(shard, ["w#0"])["w#0"], [-0.5, 1.5])
    stats = shard.statistics()
    assert (stats["staleness_sum"], stats["staleness_max"], stats["staleness_histogram"]) == (1, 1, {"0": 1, "1": 1})
    assert (stats["pushes"], stats["dense_elements_pushed"], stats["pulls"], stats["dense_elements_pulled"]) == (
        2, 4, 2, 4)
    assert shard.sequences == shard.applied_sequences == {0: 1, 1: 1}
    # an asynchronous pull never waits for a step, even one past the version (a server restarted
    # without a checkpoint is behind its trainers)
    assert shard.step_ready(2) and shard.step_ready(50)


def test_a_push_in_pieces_is_assembled_and_rows_of_a_repeated_id_add_up() -> None:
    shard, _ = make()
    declare(shard, values=(0.0, 0.0, 0.0), lr=1.0, tables=(table_decl(dim=2),))
    push(shard, 0, [floats_piece("w#0", [1.0], offset=2), floats_piece("w#0", [2.0, 3.0]),
                    rows_piece("emb", [5, 9], [[1.0, 1.0], [2.0, 0.0]]), rows_piece("emb", [5], [[1.0, 3.0]])])
    got = pull(shard, ["w#0"], [ids_piece("emb", [9, 5, 4])])
    np.testing.assert_array_equal(got["w#0"], [-2.0, -3.0, -1.0])
    np.testing.assert_array_equal(got["emb"].reshape(3, 2), [[-2.0, 0.0], [-2.0, -4.0], [0.0, 0.0]])
    assert (shard.counts["rows_pushed"], shard.counts["rows_pulled"], shard.version) == (3, 3, 1)


def test_a_push_sent_again_is_acknowledged_and_not_applied_twice() -> None:
    shard, _ = make()
    declare(shard, values=(0.0, 0.0), lr=1.0)
    assert not push(shard, 0, [floats_piece("w#0", [1.0, 1.0])], sequence=3)
    assert push(shard, 0, [floats_piece("w#0", [1.0, 1.0])], sequence=3)  # its reply was lost: sent again
    assert push(shard, 0, [floats_piece("w#0", [1.0, 1.0])], sequence=2)  # an older one
    assert (shard.version, shard.counts["duplicate_pushes"], shard.counts["pushes"]) == (1, 2, 1)
    assert not push(shard, 0, [floats_piece("w#0", [1.0, 1.0])], sequence=0)  # unnumbered: always taken
    assert not push(shard, 1, [floats_piece("w#0", [1.0, 1.0])], sequence=3)  # numbers are per trainer
    np.testing.assert_array_equal(pull(shard, ["w#0"])["w#0"], [-3.0, -3.0])
    assert shard.version == 3


# ---- refusals: nothing of a refused push is applied


def test_pulls_and_pushes_of_what_is_not_declared_are_refused() -> None:
    shard, _ = make()
    declare(shard, tables=(table_decl(),))
    with pytest.raises(NotDeclaredError, match=r"^unknown table 'nope' on parameter server 0; declared tables: "
                                               r"\['emb'\]\.$"):
        pull(shard, [], [ids_piece("nope", [1])])
    with pytest.raises(NotDeclaredError, match=r"^dense block 'v#0' is not declared on parameter server 0; declare "
                                               r"it before pulling\.$"):
        pull(shard, ["w#0", "v#0"])
    with pytest.raises(NotDeclaredError, match=r"^dense block 'v#0' is not declared on parameter server 0; declare "
                                               r"it before pushing\.$"):
        push(shard, 0, [floats_piece("v#0", [1.0])])
    with pytest.raises(NotDeclaredError, match=r"^unknown table 'nope' on parameter server 0"):
        push(shard, 0, [rows_piece("nope", [1], [[1.0, 1.0]])])
    assert (shard.version, shard.counts["pulls"], shard.counts["pushes"]) == (0, 0, 0)


@pytest.mark.parametrize(("piece", "error", "message"), [
    (pb.Piece(key="w#0", data=b"\0" * 6), InvalidArgumentError,
     r"^gradient of 'w#0': 6 bytes of float32 data is not a multiple of 4\.$"),
    (floats_piece("w#0", [1.0]), RequestError,
     r"^gradient of 'w#0' carries 1 elements; the block has 2\. Push whole blocks\.$"),
    (floats_piece("w#0", [1.0, 1.0], offset=1), RequestError,
     r"^gradient of 'w#0' at offset 1 runs past its 2 elements\.$"),
    (floats_piece("w#0", [1.0, np.nan]), RequestError,
     r"^gradient of 'w#0' holds NaN or infinity; nothing of this push was applied\.$"),
    (rows_piece("emb", [1, 2], np.ones((2, 3))), RequestError,
     r"^gradient of table 'emb' carries 3 values per row for 2 ids; the table's rows have dim=2\.$"),
    (pb.Piece(key="emb", ids=b"\0" * 12, data=b""), InvalidArgumentError,
     r"^ids of table 'emb': 12 bytes of int64 ids is not a multiple of 8\.$"),
    (rows_piece("emb", [1], [[np.inf, 0.0]]), RequestError,
     r"^gradient of table 'emb' holds NaN or infinity; nothing of this push was applied\.$"),
])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_malformed_gradient_is_refused_and_nothing_of_the_push_is_applied(
        piece: pb.Piece, error: type[Exception], message: str, mode: str) -> None:
    shard, _ = make(mode)
    declare(shard, values=(1.0, 2.0), tables=(table_decl(dim=2),))
    # a good gradient of the other kind comes with the bad one (first: it would be applied first)
    good = floats_piece("w#0", [1.0, 1.0]) if piece.ids else rows_piece("emb", [3], [[1.0, 1.0]])
    with pytest.raises(error, match=message):
        push(shard, 0, [good, piece], sequence=1)
    got = pull(shard, ["w#0"], [ids_piece("emb", [3])])
    np.testing.assert_array_equal(got["w#0"], [1.0, 2.0])
    np.testing.assert_array_equal(got["emb"], [0.0, 0.0])
    assert (shard.version, shard.pending, shard.sequences, shard.counts["pushes"]) == (0, {}, {}, 0)


def test_a_full_table_refuses_the_push_before_any_update() -> None:
    shard, _ = make()
    declare(shard, values=(1.0, 2.0), tables=(table_decl(capacity=2, declared=4),))
    push(shard, 0, [rows_piece("emb", [1], [[1.0, 1.0]])])
    with pytest.raises(TableFullError, match=r"^table 'emb' is full on this server: it holds 1 of its 2 rows and "
                                             r"the batch brings 2 new ids \(the table was declared with capacity=4"):
        push(shard, 0, [floats_piece("w#0", [1.0, 1.0]), rows_piece("emb", [7, 8], np.ones((2, 2)))], sequence=2)
    np.testing.assert_array_equal(pull(shard, ["w#0"])["w#0"], [1.0, 2.0])
    assert (shard.version, len(shard.tables["emb"])) == (1, 1)


# ---- synchronous steps


def test_a_sync_step_is_applied_once_every_trainer_pushed_it_as_their_average() -> None:
    shard, _ = make("sync")
    declare(shard, values=(0.0, 0.0), lr=1.0, tables=(table_decl(),))
    assert not push(shard, 0, [floats_piece("w#0", [1.0, 2.0]), rows_piece("emb", [4], [[2.0, 2.0]])],
                    sequence=1, step=0)
    assert (shard.version, sorted(shard.pending), shard.step_ready(1)) == (0, [0], False)
    assert shard.applied_sequences == {} and shard.sequences == {0: 1}  # taken, not applied yet
    np.testing.assert_array_equal(pull(shard, ["w#0"])["w#0"], [0.0, 0.0])  # a pull of step 0 reads at once
    # trainer 0 may run ahead: its step 1 waits beside step 0
    push(shard, 0, [floats_piece("w#0", [10.0, 10.0])], sequence=2, step=1)
    push(shard, 1, [floats_piece("w#0", [3.0, 0.0]), rows_piece("emb", [4, 5], [[0.0, 2.0], [4.0, 4.0]])],
         sequence=1, step=0)
    assert (shard.version, sorted(shard.pending), shard.step_ready(1), shard.step_ready(2)) == (1, [1], True, False)
    got = pull(shard, ["w#0"], [ids_piece("emb", [4, 5])], step=1)
    np.testing.assert_array_equal(got["w#0"], [-2.0, -1.0])
    np.testing.assert_array_equal(got["emb"].reshape(2, 2), [[-1.0, -2.0], [-2.0, -2.0]])
    assert shard.applied_sequences == {0: 1, 1: 1}
    push(shard, 1, [floats_piece("w#0", [0.0, 0.0])], sequence=2, step=1)
    np.testing.assert_array_equal(pull(shard, ["w#0"], step=2)["w#0"], [-7.0, -6.0])
    assert (shard.version, shard.pending, shard.applied_sequences) == (2, {}, {0: 2, 1: 2})


def test_a_sync_push_behind_too_far_ahead_or_twice_is_refused() -> None:
    shard, _ = make("sync")
    declare(shard, values=(0.0,), lr=1.0)
    for trainer in (0, 1):
        push(shard, trainer, [floats_piece("w#0", [1.0])], step=0)
    assert shard.version == 1
    with pytest.raises(ConflictError, match=r"^trainer 0 pushed gradients of step 0, but this server has applied "
                                            r"steps up to 0; the trainer is behind"):
        push(shard, 0, [floats_piece("w#0", [1.0])], step=0)
    with pytest.raises(ConflictError, match=r"^trainer 0 pushed gradients of step 4, but this server is at step 1; "
                                            r"a push may run at most 2 steps ahead\."):
        push(shard, 0, [floats_piece("w#0", [1.0])], step=4)
    push(shard, 0, [floats_piece("w#0", [1.0])], step=1)
    with pytest.raises(ConflictError, match=r"^trainer 0 pushed gradients of step 1 twice; push once per step\.$"):
        push(shard, 0, [floats_piece("w#0", [5.0])], step=1)
    np.testing.assert_array_equal(shard.pending[1].dense["w#0"], [1.0])  # the refused push added nothing
    assert shard.counts["pushes"] == 3


def test_a_sync_push_sent_again_does_not_double_its_steps_sum() -> None:
    shard, _ = make("sync")
    declare(shard, values=(0.0,), lr=1.0)
    push(shard, 0, [floats_piece("w#0", [2.0])], sequence=1, step=0)
    assert push(shard, 0, [floats_piece("w#0", [2.0])], sequence=1, step=0)  # sent again: not "twice"
    push(shard, 1, [floats_piece("w#0", [4.0])], sequence=1, step=0)
    np.testing.assert_array_equal(pull(shard, ["w#0"], step=1)["w#0"], [-3.0])


def test_a_sync_step_held_up_by_a_lost_trainer_fails_every_later_call() -> None:
    shard, clock = make("sync")
    hello(shard, 0), hello(shard, 1)
    declare(shard, values=(0.0,))
    push(shard, 0, [floats_piece("w#0", [1.0])], step=0)
    clock.now += 4.0
    assert shard.step_failure(0) == ""  # trainer 1 is late, not gone: the pull goes on waiting
    assert not shard.step_ready(1)
    shard.roster.heartbeat(0)
    clock.now += 2.0
    failure = shard.step_failure(0)
    assert failure == ("step 0 did not complete on parameter server 0: trainer 1 (h1, pid 101) pushed steps up to -1 "
                       "and sent nothing for 6.0 s; it died or is stopped.")
    assert (shard.roster.failure, shard.roster.told) == (failure, {0})
    clock.now += 1.0
    assert shard.step_failure(0) != failure  # what a waiting pull says moves with the clock; the failure kept does not
    assert shard.roster.failure == failure
    hello(shard, 1)  # it comes back: too late, the step failed
    with pytest.raises(TrainerLostError, match=re.escape(failure)):
        pull(shard, ["w#0"], trainer=1, step=0)
    with pytest.raises(TrainerLostError, match=re.escape(failure)):
        push(shard, 1, [floats_piece("w#0", [1.0])], step=0)
    assert shard.roster.told == {0, 1} and shard.version == 0


def test_a_trainer_goes_on_with_a_restarted_server_only_at_the_step_it_resumed_at() -> None:
    old, _ = make("sync", incarnation=7)
    declare(old, values=(0.0,))
    for step in range(2):
        for trainer in (0, 1):
            push(old, trainer, [floats_piece("w#0", [1.0])], step=step)
    header, arrays = _checkpoint.shard_state(old)
    new, _ = make("sync", incarnation=8)
    _checkpoint.restore_shard(new, header, arrays)
    with pytest.raises(ConflictError, match=r"^parameter server 0 restarted from its checkpoint at step 2, but "
                                            r"trainer 1 is at step 3: step 2 of this server are lost"):
        push(new, 1, [floats_piece("w#0", [1.0])], step=3, incarnation=7)
    with pytest.raises(ConflictError, match=r"^parameter server 0 restarted from its checkpoint at step 2, but "
                                            r"trainer 0 is at step 3"):
        pull(new, ["w#0"], step=3, incarnation=7)
    np.testing.assert_array_equal(pull(new, ["w#0"], step=2, incarnation=7)["w#0"], [-1.0])  # goes on
    assert not push(new, 1, [floats_piece("w#0", [1.0])], step=2, incarnation=7)
    fresh, _ = make("sync", incarnation=9)  # restarted without a checkpoint
    declare(fresh, values=(0.0,))
    with pytest.raises(ConflictError, match=r"restarted without a checkpoint, at step 0, but trainer 0 is at step 2"):
        pull(fresh, ["w#0"], step=2, incarnation=7)
    async_shard, _ = make("async", incarnation=9)  # asynchronous training has no steps to agree on
    declare(async_shard, values=(0.0,))
    pull(async_shard, ["w#0"], step=2, incarnation=7)


# ---- checkpoints


def test_the_checkpoint_state_round_trips_through_a_file(tmp_path: Path) -> None:
    shard, _ = make("sync")
    shard.declare(0, "adam", Adam(0.1).fields(), [pb.DenseDecl(key="w#0", size=3)],
                  [table_decl(dim=2, capacity=8, declared=16, initializer="uniform", scale=0.5, seed=3)],
                  [floats_piece("w#0", [1.0, 2.0, 3.0])])
    shard.declare(0, "sgd", SGD(1.0).fields(), [pb.DenseDecl(key="v#0", size=2)], [], [])  # no values yet
    for trainer in (0, 1):
        push(shard, trainer, [floats_piece("w#0", [1.0, -1.0, 0.5]), rows_piece("emb", [3, 11], np.ones((2, 2)))],
             sequence=1, step=0)
    push(shard, 0, [floats_piece("w#0", [9.0, 9.0, 9.0])], sequence=2, step=1)  # pending: not kept
    path = tmp_path / "server-0-of-1.npz"
    _checkpoint.save(path, *_checkpoint.shard_state(shard))
    header, arrays = _checkpoint.load(path)  # type: ignore[misc]
    assert (header["version"], header["sequences"], sorted(header["dense"])) == (1, {"0": 1, "1": 1}, ["w#0"])
    copy, _ = make("sync")
    _checkpoint.restore_shard(copy, header, arrays, source=str(path))
    assert (copy.version, copy.restored, copy.sequences, copy.pending) == (1, True, {0: 1, 1: 1}, {})
    assert copy.tables["emb"].declared_capacity == 16 and copy.tables["emb"].capacity == 8
    ids = [ids_piece("emb", [3, 11, 40])]
    expected = pull(shard, ["w#0"], ids, step=1)
    got = pull(copy, ["w#0"], ids, step=1)
    np.testing.assert_array_equal(got["w#0"], expected["w#0"])
    np.testing.assert_array_equal(got["emb"], expected["emb"])  # a row made after the restore starts alike
    for s in (shard, copy):  # the optimizer's state came along: the next step moves both alike
        push(s, 1, [floats_piece("w#0", [0.5, 0.5, 0.5])], sequence=2, step=1)
        if s is copy:
            push(s, 0, [floats_piece("w#0", [9.0, 9.0, 9.0])], sequence=2, step=1)
    np.testing.assert_array_equal(pull(copy, ["w#0"], step=2)["w#0"], pull(shard, ["w#0"], step=2)["w#0"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} was written in sync mode; this server runs in "
                                          r"async\.$"):
        _checkpoint.restore_shard(make("async")[0], header, arrays, source=str(path))


def _spoiled(change: str) -> tuple[dict, dict]:
    """The state of a shard with an Adam block and a table, spoiled as `change` says."""
    shard, _ = make("sync")
    shard.declare(0, "adam", Adam(0.1).fields(), [pb.DenseDecl(key="w#0", size=3)], [table_decl(dim=2, capacity=8)],
                  [floats_piece("w#0", [1.0, 2.0, 3.0])])
    for trainer in (0, 1):
        push(shard, trainer, [rows_piece("emb", [3, 11], np.ones((2, 2)))], sequence=1, step=0)
    header, arrays = _checkpoint.shard_state(shard)
    if change == "no dense":
        del header["dense"]
    elif change == "dense a list":
        header["dense"] = ["w#0"]
    elif change == "block without size":
        del header["dense"]["w#0"]["size"]
    elif change == "size not a number":
        header["dense"]["w#0"]["size"] = "three"
    elif change == "unknown optimizer":
        header["dense"]["w#0"]["optimizer"]["kind"] = "rmsprop"
    elif change == "values of another shape":
        arrays["dense/w#0/values"] = np.zeros((1, 4), np.float32)
    elif change == "slot missing":
        del arrays["dense/w#0/slot.m"]
    elif change == "bad initializer":
        header["tables"]["emb"]["initializer"] = {"kind": "zeros", "spread": 1}
    elif change == "table rows of another width":
        arrays["table/emb/values"] = np.zeros((2, 5), np.float32)
    elif change == "version not a number":
        header["version"] = None
    return header, arrays


@pytest.mark.parametrize(("change", "says"), [
    ("no dense", r"its header: no 'dense'"),
    ("dense a list", r'its header: .dense. must be an object of objects. Got \["w#0"\]'),
    ("block without size", r"dense block 'w#0': no 'size'"),
    ("size not a number", r"dense block 'w#0': invalid literal for int\(\) with base 10: 'three'"),
    ("unknown optimizer", r"dense block 'w#0': optimizer must be one of \[.*\]. Got 'rmsprop'."),
    ("values of another shape", r"dense block 'w#0': array 'dense/w#0/values' is float32\[1, 4\]; expected float32\[1, 3\]"),
    ("slot missing", r"dense block 'w#0': no 'dense/w#0/slot.m'"),
    ("bad initializer", r"table 'emb': .*unexpected keyword argument 'spread'"),
    ("table rows of another width", r"table 'emb': could not broadcast"),
    ("version not a number", r"its header: int\(\) argument must be"),
])
def test_a_malformed_checkpoint_is_refused_by_name_and_restores_nothing(change: str, says: str) -> None:
    header, arrays = _spoiled(change)
    fresh, _ = make("sync")
    with pytest.raises(ConfigError, match=rf"^/ckpt/server-0-of-1.npz is not a readable unison.ps checkpoint \({says}.*\); "
                                          r"move it away to start from scratch\.$"):
        _checkpoint.restore_shard(fresh, header, arrays, source="/ckpt/server-0-of-1.npz")
    assert (fresh.dense, fresh.tables, fresh.version, fresh.restored) == ({}, {}, 0, False)
    _checkpoint.restore_shard(fresh, *_spoiled("nothing"))  # the same state unspoiled restores
    assert sorted(fresh.dense) == ["w#0"] and fresh.tables["emb"].state()["ids"].tolist() == [3, 11]


def test_statistics_count_memory_pending_steps_and_trainers() -> None:
    shard, clock = make("sync")
    hello(shard, 0)
    declare(shard, values=(0.0,) * 4, tables=(table_decl(dim=2),))
    held = shard.statistics()["memory_bytes"]
    push(shard, 0, [floats_piece("w#0", [1.0] * 4), rows_piece("emb", [1, 2], np.ones((2, 2)))], step=0)
    clock.now += 1.5
    stats = shard.statistics()
    assert (stats["version"], stats["pending_steps"], stats["dense_blocks"], stats["dense_elements"]) == (0, [0], 1, 4)
    assert stats["tables"] == {"emb": {"rows": 0, "capacity": 10, "declared_capacity": 10, "dim": 2}}
    assert stats["trainers"]["0"] == {"host": "h0", "pid": 100, "pushed": 0, "finished": False,
                                      "seconds_since_seen": 1.5, "lost": ""}
    # the pending sums: 16 bytes of dense gradient, 16 of ids and 16 of rows
    assert stats["memory_bytes"] - held == 48 and stats["failure"] == ""
