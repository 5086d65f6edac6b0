"""The pure rules of steps: accepted pushes, completion, who holds a step up, staleness."""

from __future__ import annotations

from unison.ps._steps import (
    AHEAD_STEPS,
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


def test_push_rules() -> None:
    assert push_refusal(step=4, version=4, trainer=0, already=False) == ""
    assert push_refusal(step=4 + AHEAD_STEPS, version=4, trainer=0, already=False) == ""
    assert "behind" in push_refusal(step=3, version=4, trainer=2, already=False)
    assert "at most 2 steps ahead" in push_refusal(step=7, version=4, trainer=0, already=False)
    assert push_refusal(step=4, version=4, trainer=1, already=True) == (
        "trainer 1 pushed gradients of step 4 twice; push once per step.")


def test_a_push_numbered_at_or_below_the_last_taken_is_a_resend() -> None:
    assert not is_duplicate(1, 0)  # the first push
    assert is_duplicate(5, 5) and is_duplicate(3, 5)  # sent again after a lost reply
    assert not is_duplicate(6, 5) and not is_duplicate(9, 5)  # numbers may skip (a server restarted)
    assert not is_duplicate(0, 5)  # an unnumbered push is always taken


def test_a_trainer_goes_on_with_a_restarted_server_only_at_the_step_it_resumed_at() -> None:
    assert resume_refusal(server=1, version=6, restored=True, trainer=0, step=6) == ""
    assert resume_refusal(server=1, version=6, restored=True, trainer=2, step=8).startswith(
        "parameter server 1 restarted from its checkpoint at step 6, but trainer 2 is at step 8: steps 6 to 7 of "
        "this server are lost while the trainers (and any other servers) went on past them")
    assert "step 6 of this server are lost" in resume_refusal(server=1, version=6, restored=True, trainer=2, step=7)
    assert resume_refusal(server=0, version=0, restored=False, trainer=1, step=3).startswith(
        "parameter server 0 restarted without a checkpoint, at step 0, but trainer 1 is at step 3")
    behind = resume_refusal(server=0, version=9, restored=True, trainer=1, step=3)
    assert "the checkpoint holds steps the trainer has not pushed" in behind
    assert "Restart the job from checkpoints of one step on every server" in behind


def test_step_completes_with_every_trainer() -> None:
    assert not step_complete({0, 2}, 3)
    assert step_complete({0, 1, 2}, 3)


def test_blockers_name_the_missing_trainer_that_is_gone() -> None:
    seen = {0: TrainerSeen("a", 1, 100.0, 5), 1: TrainerSeen("b", 2, 99.0, 4),
            2: TrainerSeen("c", 3, 80.0, 4, finished=True)}
    assert step_blockers(5, {0}, seen, 3, 101.0, 5.0) == ["trainer 2 (c, pid 3) pushed steps up to 4 and finished"]
    assert step_blockers(5, {0, 2}, seen, 3, 104.5, 5.0) == [
        "trainer 1 (b, pid 2) pushed steps up to 4 and sent nothing for 5.5 s; it died or is stopped"]
    assert step_blockers(5, {0, 1, 2}, seen, 3, 500.0, 5.0) == []


def test_a_trainer_that_never_came_blocks_after_the_timeout() -> None:
    seen = {0: TrainerSeen("a", 1, 100.0)}
    assert step_blockers(0, {0}, seen, 2, 103.0, 5.0) == []
    assert step_blockers(0, {0}, seen, 2, 106.0, 5.0) == ["trainer 1 never connected (6.0 s after the first)"]


def test_staleness() -> None:
    assert staleness(10, 7) == 3
    assert staleness(3, 3) == 0
    assert staleness(2, 5) == 0  # a server resumed from an older checkpoint


def test_lost_trainers_and_when_a_server_ends() -> None:
    a = TrainerSeen("a", 10, 100.0, finished=True, first_seen=50.0)
    b = TrainerSeen("b", 11, 95.0, pushed=4, first_seen=51.0)
    c = TrainerSeen("c", 12, 99.5, first_seen=52.0)
    # nobody came yet: nobody is lost, the server waits
    assert lost_trainers({}, 2, 1000.0, 5.0) == {} and server_end(sync=False, trainers={}, num_trainers=2, now=1e3,
                                                                    timeout_seconds=5.0) == ""
    assert server_end(sync=False, trainers={0: a, 1: a}, num_trainers=2, now=0.0, timeout_seconds=5.0) == \
        "every trainer finished"
    # asynchronous: the others finished and the rest are lost
    assert lost_trainers({0: a, 1: b}, 2, 101.0, 5.0) == {
        1: "trainer 1 (b, pid 11) sent nothing for 6.0 s; it died or is stopped"}
    assert server_end(sync=False, trainers={0: a, 1: b}, num_trainers=2, now=101.0, timeout_seconds=5.0) == \
        "trainer 0 finished; trainer 1 (b, pid 11) sent nothing for 6.0 s; it died or is stopped"
    assert server_end(sync=False, trainers={0: a, 1: b, 2: c}, num_trainers=3, now=101.0, timeout_seconds=5.0) == ""
    # a trainer that never came counts from the first trainer's hello
    assert lost_trainers({0: c}, 2, 57.5, 5.0) == {1: "trainer 1 never connected (5.5 s after the first)"}
    # synchronous: a lost trainer alone ends nothing while another may still be told; told, it ends
    assert lost_trainers({0: a, 1: b}, 2, 101.0, 5.0, sync=True)[1].startswith("trainer 1 (b, pid 11) pushed steps "
                                                                              "up to 4 and sent nothing")
    assert server_end(sync=True, trainers={0: c, 1: b}, num_trainers=2, now=101.0, timeout_seconds=5.0) == ""
    failure = "step 5 did not complete on parameter server 0: trainer 1 (b, pid 11) ..."
    assert server_end(sync=True, trainers={0: c, 1: b}, num_trainers=2, now=101.0, timeout_seconds=5.0,
                      failure=failure) == ""
    assert server_end(sync=True, trainers={0: c, 1: b}, num_trainers=2, now=101.0, timeout_seconds=5.0,
                      failure=failure, told={0}).startswith(
        f"synchronous training stopped: {failure}; trainer 0 got the error; trainer 1 (b, pid 11) pushed steps up to 4")


def test_a_trainer_gives_up_on_a_server_after_the_reconnect_window() -> None:
    from unison.ps._reach import Unreached, gave_up, unavailable_message

    down = Unreached(since=10.0, since_wall=1_700_000_000.0, error="UNAVAILABLE: connection refused")
    assert not gave_up(None, 1e9, 60.0) and not gave_up(down, 70.0, 60.0) and gave_up(down, 70.5, 60.0)
    text = unavailable_message(server=2, endpoint="h:7", trainer=1, method="Pull", unreached=down, now=71.0,
                               reconnect_seconds=60.0)
    assert text.startswith("parameter server 2 (h:7) has not answered trainer 1 since 20")
    assert "(61.0 s, over the reconnect window of 60 s; last: UNAVAILABLE: connection refused), so its Pull failed" \
        in text
