"""State classes without the elastic driver: commit keeps a copy in memory, restore returns to it."""

from __future__ import annotations

import pytest

from unison.elastic._state import HostsUpdatedInterrupt, ObjectState

# Every name a State kept as an attribute of its own before its bookkeeping moved apart from the
# user's values: a user value of any of these names must be only a value.
FORMER_INTERNAL_NAMES = ("commits", "_bcast_object", "_get_rank", "_reset_callbacks", "_known_updates",
                         "_driver_updates", "_asked_at", "_pending_check", "_checked", "_saved", "_saved_in_store",
                         "_background_commits", "_writer", "_write_error", "_writer_store", "_names")


def internal_names(state: object) -> set[str]:
    """The names a state uses internally now, that a user could pass as a value (identifiers only)."""
    return {name for name in vars(state) if name.isidentifier()} | set(FORMER_INTERNAL_NAMES)


def test_object_state_commit_and_restore() -> None:
    state = ObjectState(lambda obj, root_rank=0: obj, lambda: 0, epoch=0, seen=[1])
    state.epoch, state.seen = 3, [1, 2]
    state.commit()
    state.seen.append(99)
    state.epoch = 7
    state.restore()
    assert (state.epoch, state.seen, state.statistics()["commits"]) == (3, [1, 2], 1)
    called = []
    state.register_reset_callbacks([lambda: called.append(1)])
    state.on_reset()
    assert called == [1]
    assert HostsUpdatedInterrupt(True).skip_sync is True
    assert isinstance(HostsUpdatedInterrupt(False), RuntimeError)


def test_torch_state_restores_model_optimizer_and_values() -> None:
    torch = pytest.importorskip("torch")
    from unison.adapters.torch.elastic import TorchState

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = TorchState(model, optimizer, epoch=1)
    state.commit()
    saved = [p.detach().clone() for p in model.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    optimizer.step()
    state.epoch = 5
    state.restore()
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters()))
    assert all(torch.equal(a, optimizer.state[p]["momentum_buffer"]) for a, p in zip(momentum, model.parameters()))
    assert state.epoch == 1


def test_tensorflow_state_restores_variables() -> None:
    tf = pytest.importorskip("tensorflow")
    from unison.adapters.tensorflow.elastic import TensorFlowState

    variable = tf.Variable([1.0, 2.0])
    state = TensorFlowState([variable], batch=0)
    variable.assign([5.0, 6.0])
    state.batch = 4
    state.commit()
    variable.assign([0.0, 0.0])
    state.batch = 9
    state.restore()
    assert variable.numpy().tolist() == [5.0, 6.0] and state.batch == 4
    with pytest.raises(ValueError, match="TensorFlow 1 graph mode"):
        TensorFlowState([variable], session=object())


def test_two_states_checking_hosts_never_put_the_check_broadcast_in_flight_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake engine where a broadcast stays in flight until it is synchronized (a peer not there
    # yet): a second one under the same name raises, as the engine does.
    import unison._job.collectives
    import unison._job.submit
    from unison.elastic import _checks, _state
    from unison.elastic._environment import ElasticEnvironment
    from unison.errors import DuplicateNameError

    in_flight: dict[str, int] = {}
    names: dict[int, str] = {}

    def broadcast_async_(tensor: object, root_rank: int, name: str = "") -> int:
        if name in in_flight:
            raise DuplicateNameError(f"{name} is in flight")
        handle = in_flight[name] = len(names) + 1
        names[handle] = name
        return handle

    def synchronize(handle: int) -> None:
        del in_flight[names.pop(handle)]

    changes = [0]
    monkeypatch.setattr(unison._job.collectives, "broadcast_async_", broadcast_async_)
    monkeypatch.setattr(unison._job.submit, "synchronize", synchronize)
    monkeypatch.setattr(_checks, "environment", lambda: ElasticEnvironment(driver="127.0.0.1:9"))
    monkeypatch.setattr(_checks, "ask_driver", lambda address, epoch: changes[0])
    monkeypatch.setattr(_checks, "_ASK_EVERY_SECONDS", 0.0)
    model = _state.ObjectState(lambda obj, root_rank=0: obj, lambda: 0, step=0)
    data = _state.ObjectState(lambda obj, root_rank=0: obj, lambda: 0, position=0)
    for _ in range(3):
        model.commit()
        data.commit()
    changes[0] = 1  # the driver announces a change: each state raises at its second check after it
    model.commit()
    data.commit()
    with pytest.raises(HostsUpdatedInterrupt):
        model.commit()
    with pytest.raises(HostsUpdatedInterrupt):
        data.commit()
    model._settle()
    data._settle()
    assert in_flight == {} and names == {}


def test_rank_zero_asks_an_unanswering_driver_again_only_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    import unison._job.collectives
    import unison._job.submit
    from unison.elastic import _checks, _state
    from unison.elastic._environment import ElasticEnvironment

    asked: list[int] = []
    answers: list[int | None] = [None, 2]

    def ask_driver(address: str, epoch: int) -> int | None:
        asked.append(epoch)
        return answers[min(len(asked), len(answers)) - 1]

    monkeypatch.setattr(unison._job.collectives, "broadcast_async_", lambda tensor, root_rank, name="": 1)
    monkeypatch.setattr(unison._job.submit, "synchronize", lambda handle: None)
    monkeypatch.setattr(_checks, "environment", lambda: ElasticEnvironment(driver="127.0.0.1:9"))
    monkeypatch.setattr(_checks, "ask_driver", ask_driver)
    monkeypatch.setattr(_checks, "_ASK_EVERY_SECONDS", 0.0)
    state = _state.ObjectState(lambda obj, root_rank=0: obj, lambda: 0, step=0)
    for _ in range(5):
        state.commit()  # no answer: the commits go on, and nobody asks again for 5 s
    assert asked == [0] and state._books.driver_updates == 0
    monkeypatch.setattr(_checks, "_ASK_AFTER_NO_ANSWER_SECONDS", 0.0)
    state._books.asked_at = float("-inf")
    state.commit()
    assert asked == [0, 0] and state._books.driver_updates == 2
    state._settle()


def test_user_values_named_like_the_states_own_bookkeeping_are_only_values() -> None:
    fresh = ObjectState(lambda obj, root_rank=0: obj, lambda: 0)
    names = sorted(internal_names(fresh))
    assert "commits" in names and len(names) >= len(FORMER_INTERNAL_NAMES)
    state = ObjectState(lambda obj, root_rank=0: obj, lambda: 0, **{name: [name] for name in names})
    for step in range(3):
        for name in names:
            setattr(state, name, [name, step])
        state.commits = -step  # a script's own counter, lowered
        state.commit()
    assert state.statistics()["commits"] == 3
    for name in names:
        setattr(state, name, "changed after the commit")
    state.restore()
    assert {name: getattr(state, name) for name in names} == {
        name: (-2 if name == "commits" else [name, 2]) for name in names}
    assert state.statistics()["commits"] == 3 and "commits=3" in repr(state)


def test_torch_state_values_named_like_its_bookkeeping_are_only_values() -> None:
    torch = pytest.importorskip("torch")
    from unison.adapters.torch.elastic import TorchState

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names = sorted(internal_names(TorchState(model, optimizer)) - {"model", "optimizer"})
    state = TorchState(model, optimizer, **{name: 0 for name in names})
    state.commits = 100
    state.commit()
    state.commits, state._background_commits = 5, "x"  # type: ignore[attr-defined]
    state.restore()
    assert (state.commits, state._background_commits, state.statistics()["commits"]) == (100, 0, 1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["commit", "restore", "sync", "save", "_books", "_capture", "statistics"])
def test_a_value_that_would_hide_the_states_methods_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"A state value named '{name}' would hide ObjectState.{name}, which "
                       r"the state needs. Rename the value"):
        ObjectState(lambda obj, root_rank=0: obj, lambda: 0, **{name: 1})
    with pytest.raises(ValueError, match=r"A state value's name must be an identifier \(values are attributes\). "
                       r"Got 'unison elastic bookkeeping'"):
        ObjectState(lambda obj, root_rank=0: obj, lambda: 0, **{"unison elastic bookkeeping": 1})


def test_a_store_open_to_others_stops_every_rank_naming_the_rank_and_the_directory(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 0's host directory is writable by others: nothing is unpickled from it, and what every rank
    # receives from the commit exchange makes each raise the same error.
    import unison._job.objects
    from unison.elastic import _state
    from unison.elastic._environment import ElasticEnvironment
    from unison.elastic.store import CommitId, StateStore
    from unison.errors import ConfigError

    StateStore(tmp_path, "a").write(CommitId(epoch=0, commit=5), [b"not a pickle"])
    (tmp_path / "a").chmod(0o777)
    exchanged = []

    def allgather_object(obj: object, name: str = "") -> list:
        exchanged.append(obj)
        return [obj, CommitId(epoch=0, commit=4)]  # rank 1, on host b, found an older commit

    monkeypatch.setattr(unison._job.objects, "allgather_object", allgather_object)
    monkeypatch.setattr(_state, "environment", lambda: ElasticEnvironment(store=str(tmp_path), hosts=(("a", 1), ("b", 1))))
    state = ObjectState(lambda obj, root_rank=0: obj, lambda: 0, epoch=0)
    with pytest.raises(ConfigError, match=r"^rank 0 on host a cannot restore from its elastic store: The elastic "
                                          r"store directory .*/a is writable by group or others \(owner .*, mode "
                                          r"0o777\)\. Every rank unpickles"):
        state._begin()
    assert isinstance(exchanged[0], str)  # what rank 1 raised with, too
