"""What the elastic driver tells each rank (read once from the environment), and how rank 0 asks it about hosts.

Variables, all set by the driver in unisonrun for every epoch's launch: ``UNISON_ELASTIC_EPOCH`` (the
membership epoch), ``UNISON_ELASTIC_DRIVER`` (``KEY@HOST:PORT`` of the driver's endpoint: questions
and answers are lines signed under that key, `unison._contract.ask_signed`),
``UNISON_ELASTIC_STORE`` (the job's shared-memory store directory) and ``UNISON_ELASTIC_HOSTS`` (this
epoch's ``host:slots`` list, in rank order). Without them (plain ``mpiexec``) the elastic objects work
as in Horovod without its driver: commits stay in memory and hosts never change.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import socket
from collections.abc import Mapping

from .._contract import ELASTIC_HOSTS_VARIABLE, HOSTS_UPDATED_EXIT, ask_signed, host_of, parse_hosts
from ..config import Settings, load_settings
from ..errors import ConfigError

__all__ = ["HOSTS_UPDATED_EXIT", "ElasticEnvironment", "ask_driver", "environment"]
_ASK_TIMEOUT_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class ElasticEnvironment:
    """The elastic launch this process belongs to (`driver` empty: not launched by the elastic driver)."""

    epoch: int = 0
    driver: str = ""
    store: str = ""
    hosts: tuple[tuple[str, int], ...] = ()

    def host_of(self, rank: int) -> str:
        """The host name the driver assigned to `rank` (its store directory's name)."""
        return host_of(self.hosts, rank) or socket.gethostname()

    def writes_store(self, rank: int) -> bool:
        """True for the first rank of each host: the one that writes the host's commits."""
        return bool(self.store) and (rank == 0 or self.host_of(rank) != self.host_of(rank - 1))


def parse(environ: Mapping[str, str]) -> ElasticEnvironment:
    """The `ElasticEnvironment` the variables in `environ` describe (parsed by `unison.config`)."""
    return from_settings(load_settings(environ))


def from_settings(settings: Settings) -> ElasticEnvironment:
    """The `ElasticEnvironment` of these settings (the ``elastic_*`` fields)."""
    try:
        hosts = parse_hosts(settings.elastic_hosts, ELASTIC_HOSTS_VARIABLE)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return ElasticEnvironment(settings.elastic_epoch, settings.elastic_driver, settings.elastic_store,
                              tuple(hosts))


@functools.lru_cache(maxsize=1)
def environment() -> ElasticEnvironment:
    """This process's `ElasticEnvironment`, read once with the other settings (`unison.config`)."""
    return from_settings(load_settings())


def ask_driver(address: str, epoch: int) -> int | None:
    """How many host changes the driver has announced to `epoch` (0: none; None: no answer).

    `address` is ``KEY@HOST:PORT``: the question is signed under the key, and an answer counts only
    when it is signed under it as the answer to this question (a fresh nonce in each question, so an
    old answer cannot be played back). Every message names its epoch; the driver answers ``STALE`` to
    an epoch it has left, which counts as a change (this launch is being replaced). An unreachable
    driver, a refused question and an answer that fails the check are all None, which the caller
    takes as no change (the launch goes on; if the driver is gone the job ends anyway).
    """
    reply = ask_signed(address, f"CHECK {epoch} {secrets.token_hex(8)}".encode(), _ASK_TIMEOUT_SECONDS)
    if reply is None:
        return None
    words = reply.decode("ascii", errors="replace").split()
    if words[:1] == ["OK"] and len(words) == 3 and words[1] == str(epoch) and words[2].isdigit():
        return int(words[2])
    if words[:1] == ["STALE"]:
        return 1 << 30
    return 0
