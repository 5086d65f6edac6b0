"""State classes without the elastic driver: commit keeps a copy in memory, restore returns to it."""

from __future__ import annotations

import pytest

from unison.elastic._state import HostsUpdatedInterrupt, ObjectState


def test_object_state_commit_and_restore() -> None:
    state = ObjectState(lambda obj, root_rank=0: obj, lambda: 0, epoch=0, seen=[1])
    state.epoch, state.seen = 3, [1, 2]
    state.commit()
    state.seen.append(99)
    state.epoch = 7
    state.restore()
    assert (state.epoch, state.seen, state.commits) == (3, [1, 2], 1)
    called = []
    state.register_reset_callbacks([lambda: called.append(1)])
    state.on_reset()
    assert called == [1]
    assert HostsUpdatedInterrupt(True).skip_sync is True
    assert isinstance(HostsUpdatedInterrupt(False), RuntimeError)


def test_torch_state_restores_model_optimizer_and_values() -> None:
    torch = pytest.importorskip("torch")
    from unison.elastic._torch import TorchState

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
    from unison.elastic._tensorflow import TensorFlowState

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
    import unison._collectives
    import unison._submit
    from unison.elastic import _state
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
    monkeypatch.setattr(unison._collectives, "broadcast_async_", broadcast_async_)
    monkeypatch.setattr(unison._submit, "synchronize", synchronize)
    monkeypatch.setattr(_state, "environment", lambda: ElasticEnvironment(driver="127.0.0.1:9"))
    monkeypatch.setattr(_state, "ask_driver", lambda address, epoch: changes[0])
    monkeypatch.setattr(_state, "_ASK_EVERY_SECONDS", 0.0)
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
    import unison._collectives
    import unison._submit
    from unison.elastic import _state
    from unison.elastic._environment import ElasticEnvironment

    asked: list[int] = []
    answers: list[int | None] = [None, 2]

    def ask_driver(address: str, epoch: int) -> int | None:
        asked.append(epoch)
        return answers[min(len(asked), len(answers)) - 1]

    monkeypatch.setattr(unison._collectives, "broadcast_async_", lambda tensor, root_rank, name="": 1)
    monkeypatch.setattr(unison._submit, "synchronize", lambda handle: None)
    monkeypatch.setattr(_state, "environment", lambda: ElasticEnvironment(driver="127.0.0.1:9"))
    monkeypatch.setattr(_state, "ask_driver", ask_driver)
    monkeypatch.setattr(_state, "_ASK_EVERY_SECONDS", 0.0)
    state = _state.ObjectState(lambda obj, root_rank=0: obj, lambda: 0, step=0)
    for _ in range(5):
        state.commit()  # no answer: the commits go on, and nobody asks again for 5 s
    assert asked == [0] and state._driver_updates == 0
    monkeypatch.setattr(_state, "_ASK_AFTER_NO_ANSWER_SECONDS", 0.0)
    state._asked_at = float("-inf")
    state.commit()
    assert asked == [0, 0] and state._driver_updates == 2
    state._settle()
