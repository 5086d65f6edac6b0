"""The launch plug-ins' decisions (`unison._job.launch`) and the start-up check at a torch store, without
starting a job: which launch a process is part of, its place from the hosts, the settings agreement,
and the store check's verdicts with ranks as threads on one in-memory store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from unison._job.launch import Request, agree_settings, detect
from unison._job.launch.base import Place
from unison._job.launch.mpi import MpiLaunch, launcher_size, started_by_mpi
from unison._job.launch.rendezvous import TorchRendezvous, place_of
from unison._job.launch.single import SingleProcess
from unison._job.startup import Arrival, check_start_in_store, store_verdict
from unison.config import Settings
from unison.errors import ConfigError, StartupError

LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID",
                    "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                    "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                    "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_mpi_launcher_wins_and_keeps_its_ranks(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("PMI_SIZE", "2")
    assert isinstance(detect(), MpiLaunch)
    assert isinstance(detect(request=Request(None, 0, 2)), MpiLaunch)  # init_process_group checks against it


def test_a_store_from_init_process_group_wins_over_sruns_variables(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("SLURM_STEP_NUM_TASKS", "2")
    assert isinstance(detect(), MpiLaunch)  # hvd.init() alone under srun: MPI
    launch = detect(request=Request(None, 1, 2))
    assert isinstance(launch, TorchRendezvous) and (launch.rank, launch.size) == (1, 2)


def test_torchs_variables_make_a_rendezvous_and_half_of_them_are_refused(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "2")
    no_launcher.setenv("MASTER_ADDR", "127.0.0.1")
    no_launcher.setenv("MASTER_PORT", "29500")
    assert isinstance(detect(), TorchRendezvous)
    no_launcher.delenv("MASTER_ADDR")
    with pytest.raises(ConfigError, match=r"rank 1 of WORLD_SIZE=2, but MASTER_ADDR is unset"):
        detect()


def test_a_process_alone(no_launcher: pytest.MonkeyPatch) -> None:
    launch = detect()
    assert isinstance(launch, (MpiLaunch, SingleProcess))  # MPI where mpi4py is installed: a singleton


def test_what_counts_as_an_mpi_launch() -> None:
    assert launcher_size({"OMPI_COMM_WORLD_SIZE": "3"}) == 3 and launcher_size({}) == 1
    assert started_by_mpi({"PMI_SIZE": "2"}, srun_too=False)
    assert not started_by_mpi({"PMI_SIZE": "1"})
    assert not started_by_mpi({"SLURM_NTASKS": "4"})  # sbatch's own variable: a job of one process


def test_a_place_from_every_ranks_host() -> None:
    assert place_of(0, ["a"]) == Place(0, 1)
    assert place_of(3, ["a", "a", "b", "b"]) == Place(3, 4, 1, 2, 1, 2, True)
    assert place_of(2, ["a", "b", "a"]) == Place(2, 3, 1, 2, 0, 1, False)  # alone at local rank 1
    assert place_of(1, ["a", "b", "a"]) == Place(1, 3, 0, 1, 1, 2, False)
    assert Place.of_blocks(5, 6, 1, 2) == Place(5, 6, 1, 2, 2, 3, True)


def test_the_settings_agreement_names_the_setting_and_the_ranks() -> None:
    rows: list[bytes] = []

    def exchange(payload: bytes) -> list[bytes]:
        rows.append(payload)
        return [payload, payload.replace(b'"chunk_bytes": 4194304', b'"chunk_bytes": 8')]

    with pytest.raises(ConfigError, match=r"UNISON_CHUNK_BYTES differs between ranks: 4194304 on rank \[0\]; 8 on "
                                          r"rank \[1\]"):
        agree_settings(exchange, Settings())
    assert rows  # the routine exchanged this rank's values


def test_the_store_verdict() -> None:
    ready = Arrival(3, "h", 1, "")
    assert store_verdict({0: ready, 1: ready, 2: ready}, 3, 60.0) == ""
    assert store_verdict({0: ready, 1: Arrival(3, "h", 2, "ConfigError: bad")}, 3, 9.0) == (
        "init() failed: rank 2 did not reach init() within 9 s (it raised or exited before init(), is stuck before "
        "it, or already left the job); check its output. the timeout of init_process_group, or "
        "UNISON_START_TIMEOUT_SECONDS where shorter, sets the wait; rank 1 could not start: ConfigError: bad.")


def _ranks(store: Any, claims: list[tuple[int, int]], timeout: float = 2.0) -> list[Any]:
    """Run `check_start_in_store` for each (rank, world size) in a thread of its own; each one's outcome."""
    outcomes: list[Any] = [None] * len(claims)

    def one(index: int, rank: int, size: int) -> None:
        try:
            outcomes[index] = check_start_in_store(store, rank, size, "", timeout, f"host{rank % 2}")
        except StartupError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=one, args=(i, r, n)) for i, (r, n) in enumerate(claims)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def _store() -> Any:
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=30))
    return store


def test_every_rank_gets_every_arrival() -> None:
    outcomes = _ranks(_store(), [(0, 3), (1, 3), (2, 3)])
    assert all(isinstance(o, dict) and sorted(o) == [0, 1, 2] for o in outcomes), outcomes
    assert [outcomes[0][r].host for r in range(3)] == ["host0", "host1", "host0"]


def test_a_missing_rank_is_named_on_the_others() -> None:
    outcomes = _ranks(_store(), [(0, 3), (1, 3)], timeout=0.5)
    for outcome in outcomes:
        assert isinstance(outcome, StartupError) and outcome.missing_ranks == (2,), outcome
        assert str(outcome).startswith("init() failed: rank 2 did not reach init() within 0.5 s")


def test_a_rank_0_that_never_reported_is_not_waited_for_twice_the_bound() -> None:
    # Rank 0 never reached unison's start (torch's tcp:// rendezvous holds it until every process of
    # the world size connected): rank 1 names the missing ranks after the bound, not after twice it,
    # and says why rank 0 may be missing.
    store = _store()  # torch's import is not part of the wait
    start = time.monotonic()
    outcome = _ranks(store, [(1, 3)], timeout=3.0)[0]
    waited = time.monotonic() - start
    assert isinstance(outcome, StartupError) and outcome.missing_ranks == (0, 2), outcome
    assert "Rank 0 may be missing only because rank 2 is: with tcp:// and env:// it waits in torch's rendezvous " \
           "until all 3 processes of the world size connected to its store" in str(outcome), outcome
    assert "(mp.spawn's nprocs, torchrun's --nproc-per-node), with ranks 0 to 2." in str(outcome)
    assert 3.0 + 5.0 <= waited < 3.0 + 5.0 + 2.0, waited  # twice the bound would be 11 s


def test_a_rank_0_that_arrives_after_the_others_gave_up_fails_as_they_did() -> None:
    store = _store()
    gave_up = _ranks(store, [(1, 2)], timeout=0.5)[0]
    assert isinstance(gave_up, StartupError) and gave_up.missing_ranks == (0,), gave_up
    late = _ranks(store, [(0, 2)], timeout=0.5)[0]  # rank 1's report is there, but it has left
    assert isinstance(late, StartupError) and str(late) == str(gave_up), late


def test_a_world_size_that_differs_is_named_on_both() -> None:
    for outcome in _ranks(_store(), [(0, 2), (1, 3)]):
        assert isinstance(outcome, StartupError), outcome
        assert "the world size differs between ranks: 2 on rank [0]; 3 on rank [1]" in str(outcome)


def test_a_second_claimant_of_a_rank_is_refused() -> None:
    store = _store()
    first = _ranks(store, [(0, 2), (1, 2)])
    assert all(isinstance(o, dict) for o in first)
    second = _ranks(store, [(1, 2)])[0]
    assert isinstance(second, StartupError)
    assert "two processes claim rank 1: host1, pid" in str(second) and "came first" in str(second)
