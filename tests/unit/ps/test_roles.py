"""A process's role in a parameter-server job comes from the settings (UNISON_PS_* or Paddle's names)."""

from __future__ import annotations

import pytest

from unison.errors import ConfigError
from unison.ps.roles import resolve_role

SECRET = {"UNISON_SECRET": "s" * 32}


def test_unison_variables_give_a_trainer() -> None:
    role = resolve_role({**SECRET, "UNISON_PS_ROLE": "trainer", "UNISON_PS_TRAINER_ID": "1",
                         "UNISON_PS_ENDPOINTS": "h:1,h:2", "UNISON_PS_NUM_TRAINERS": "2", "UNISON_PS_MODE": "sync",
                         "UNISON_PS_TRAINER_TIMEOUT_SECONDS": "3.5", "UNISON_PS_RECONNECT_SECONDS": "4.5"})
    assert (role.role, role.index, role.endpoints, role.num_servers, role.num_trainers, role.mode,
            role.trainer_timeout_seconds, role.reconnect_seconds) == ("trainer", 1, ("h:1", "h:2"), 2, 2, "sync",
                                                                      3.5, 4.5)
    assert resolve_role({**SECRET, "UNISON_PS_ROLE": "trainer", "UNISON_PS_TRAINER_ID": "0",
                         "UNISON_PS_ENDPOINTS": "h:1", "UNISON_PS_NUM_TRAINERS": "1"}).reconnect_seconds == 60.0
    with pytest.raises(ConfigError, match="UNISON_PS_RECONNECT_SECONDS"):
        resolve_role({**SECRET, "UNISON_PS_ROLE": "trainer", "UNISON_PS_TRAINER_ID": "0", "UNISON_PS_ENDPOINTS": "h:1",
                      "UNISON_PS_NUM_TRAINERS": "1", "UNISON_PS_RECONNECT_SECONDS": "-1"})


def test_paddle_names_are_aliases_and_pod_ip_finds_the_server_index() -> None:
    role = resolve_role({**SECRET, "PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": "a:1,b:2",
                         "PADDLE_TRAINERS_NUM": "3", "POD_IP": "b", "PADDLE_PORT": "2"})
    assert (role.role, role.index, role.num_servers, role.num_trainers) == ("server", 1, 2, 3)


def test_the_mpi_rank_is_the_trainer_id_when_none_is_set() -> None:
    role = resolve_role({**SECRET, "UNISON_PS_ROLE": "trainer", "UNISON_PS_ENDPOINTS": "h:1",
                         "UNISON_PS_NUM_TRAINERS": "4", "OMPI_COMM_WORLD_RANK": "3"})
    assert role.index == 3


def test_a_server_given_port_0_and_an_address_file_listens_on_any_port() -> None:
    role = resolve_role({**SECRET, "UNISON_PS_ROLE": "server", "UNISON_PS_SERVER_INDEX": "1",
                         "UNISON_PS_ENDPOINTS": "h0:0,h1:0", "UNISON_PS_NUM_TRAINERS": "2",
                         "UNISON_PS_ADDRESS_FILE": "/tmp/a"})
    assert (role.index, role.endpoints[role.index], role.address_file) == (1, "h1:0", "/tmp/a")


def test_keywords_win_over_variables() -> None:
    role = resolve_role({**SECRET, "UNISON_PS_ROLE": "server", "UNISON_PS_NUM_TRAINERS": "2"}, role="trainer",
                        trainer_id=0, endpoints=["h:9"], mode="sync")
    assert (role.role, role.endpoints, role.mode) == ("trainer", ("h:9",), "sync")


@pytest.mark.parametrize(("env", "match"), [
    ({"UNISON_PS_MODE": "eventually"}, r"UNISON_PS_MODE must be one of async, sync\. Got UNISON_PS_MODE='eventually'"),
    ({"UNISON_PS_TRAINER_ID": "x"}, r"UNISON_PS_TRAINER_ID must be a non-negative integer\. Got UNISON_PS_TRAINER_ID='x'"),
    ({"UNISON_PS_TRAINER_ID": "5"}, r"UNISON_PS_TRAINER_ID must be in range\(num_trainers=2\)\. Got 5"),
    ({"UNISON_PS_ROLE": "boss"}, r"UNISON_PS_ROLE must be 'server' or 'trainer'\. Got UNISON_PS_ROLE='boss'"),
    ({"UNISON_PS_ENDPOINTS": "h:1,g:0"}, r"A trainer needs every server's port; UNISON_PS_ENDPOINTS has port 0"),
    ({"UNISON_PS_ROLE": "server", "UNISON_PS_SERVER_INDEX": "1", "UNISON_PS_ENDPOINTS": "h:1,g:0"},
     r"UNISON_PS_ENDPOINTS gives this server port 0 \(any free port\), so the trainers could not know it"),
])
def test_a_bad_value_names_its_variable(env: dict[str, str], match: str) -> None:
    base = {**SECRET, "UNISON_PS_ROLE": "trainer", "UNISON_PS_TRAINER_ID": "0", "UNISON_PS_ENDPOINTS": "h:1",
            "UNISON_PS_NUM_TRAINERS": "2"}
    with pytest.raises(ConfigError, match=match):
        resolve_role({**base, **env})
