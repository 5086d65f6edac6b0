"""The dispatch table: every kind of response has one route, and the table says which stop the job."""

from __future__ import annotations

from unison.ops import COLLECTIVE_KINDS, Kind
from unison.protocol.dispatch import ROUTES, Action, Route, route

DATA_PLANE = {Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.ALLTOALL, Kind.REDUCESCATTER}


def test_every_kind_has_a_route() -> None:
    assert set(ROUTES) == set(Kind)
    assert all(isinstance(r, Route) for r in ROUTES.values())


def test_the_collectives_that_move_data_run_on_the_executor_among_members_only() -> None:
    assert {kind for kind, r in ROUTES.items() if r.action is Action.RUN} == DATA_PLANE
    assert all(route(kind).members_only for kind in DATA_PLANE)
    assert route(Kind.BARRIER) == Route(Action.BARRIER, members_only=True)


def test_control_responses_reach_every_rank() -> None:
    # Process set ids are global: a rank outside a set still registers (and forgets) it.
    for kind in (Kind.ADD_PROCESS_SET, Kind.REMOVE_PROCESS_SET, Kind.JOIN, Kind.ERROR,
                 Kind.SHUTDOWN, Kind.ABORT, Kind.STALL, Kind.TUNE):
        assert not route(kind).members_only, kind


def test_exactly_shutdown_stall_and_abort_stop_the_job() -> None:
    stopping = {kind for kind, r in ROUTES.items() if r.action.stops}
    assert stopping == {Kind.SHUTDOWN, Kind.STALL, Kind.ABORT}
    assert [route(k).action for k in (Kind.SHUTDOWN, Kind.STALL, Kind.ABORT)] == [
        Action.STOP_SHUTDOWN, Action.STOP_STALL, Action.STOP_ABORT]


def test_each_action_serves_the_kind_of_its_name_or_the_data_plane() -> None:
    for kind in COLLECTIVE_KINDS - DATA_PLANE - {Kind.SHUTDOWN}:
        assert route(kind).action.value == kind.value
    assert route(Kind.ERROR).action is Action.FAIL
    assert route(Kind.TUNE).action is Action.TUNE
