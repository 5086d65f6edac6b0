"""`horovod.run`'s arguments for `unison.run`: which apply, which are refused, and what they turn into.

A pure decision: `plan` takes the arguments as given and returns a frozen `RunPlan` (number of
processes, extra environment, output directory, Python executable, and for an elastic job the
elastic driver's options) or raises an error that names the argument and says what to do.
`unison.run` starts processes on this machine only, so host arguments are accepted when every host
they name is this machine. ``host_discovery_script`` makes the job elastic, as in Horovod, and so do
the other elastic arguments with `hosts`/`hostfile` (an elastic job on those fixed hosts).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from ...elastic.membership import Host, Limits
from ...errors import InvalidArgumentError, LaunchError
from ..elastic.driver import ElasticOptions
from ..elastic.driver import elastic_timeout as driver_elastic_timeout
from ..hosts.hostfile import parse_hosts, read_hostfile
from ..hosts.reach import local_names

__all__ = ["DEFAULT_NUM_PROC", "ELASTIC_ARGUMENTS", "RunPlan", "parse_hosts", "plan", "read_hostfile"]

# unison.run started 2 processes when not told otherwise before it took horovod.run's arguments.
DEFAULT_NUM_PROC = 2

# Elastic training's arguments (any makes the job elastic: on the discovery script's hosts, or on hosts=).
ELASTIC_ARGUMENTS = ("min_num_proc", "max_num_proc", "slots", "reset_limit", "cooldown_range",
                     "host_discovery_script", "min_np", "max_np")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What `unison.run` does with the arguments it was given.

    Attributes:
        num_proc: the number of processes to start.
        env: variables to add to every rank's environment.
        output_dir: the directory for each rank's output files ("" for the caller's streams).
        executable: the Python that runs each rank ("" for this one).
        elastic: the elastic driver's options, for an elastic job (None: a fixed `num_proc`).
        hosts: the ranks' hosts as ``host:slots,...`` in rank order, from `hosts`/`hostfile` ("" when
            neither was given: every rank on ``localhost``, as horovod.run's default).
    """

    num_proc: int
    env: dict[str, str]
    output_dir: str = ""
    executable: str = ""
    elastic: ElasticOptions | None = None
    hosts: str = ""




def _filled(parsed: list[tuple[str, int]], count: int) -> str:
    """The first `count` slots of `parsed`, in order, as ``host:slots,...`` (where each rank runs).

    Example:
        >>> _filled([("localhost", 2), ("127.0.0.1", 2)], 3)
        'localhost:2,127.0.0.1:1'
    """
    taken = []
    for host, slots in parsed:
        if count <= 0:
            break
        taken.append(f"{host}:{min(slots, count)}")
        count -= slots
    return ",".join(taken)


def _local_hosts(hosts: str | None, hostfile: str | None) -> list[tuple[str, int]] | None:
    """The hosts and slots of `hosts`/`hostfile`, every one a name of this machine (None when neither is given)."""
    if hosts and hostfile:
        raise InvalidArgumentError("Pass hosts= or hostfile=, not both (as in horovod.run).")
    if hosts:
        where, entries = f"hosts={hosts!r}", hosts.split(",")
    elif hostfile:
        where, entries = f"hostfile={hostfile!r}", read_hostfile(hostfile)
    else:
        return None
    parsed = parse_hosts(entries, where)
    if not parsed:
        raise InvalidArgumentError(f"{where} names no host.")
    here = local_names()
    remote = sorted({host for host, _ in parsed if host not in here})
    if remote:
        raise InvalidArgumentError(
            f"unison.run starts processes on this machine only, but {where} names other machines: "
            f"{', '.join(remote)}. For a job across machines use `unisonrun -np N -H {','.join(remote)}:SLOTS "
            "python train.py` (or its --hostfile); for this machine pass hosts='localhost:N'."
        )
    return parsed


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} is a number of processes (an int). Got {name}={value!r}.")
    if value < 1:
        raise LaunchError(f"{name} must be at least 1. Got {name}={value}.")
    return value


def plan(*, num_proc: object = None, np: object = None, hosts: str | None = None, hostfile: str | None = None,
         start_timeout: object = None, output_filename: str | None = None, use_gloo: object = None,
         use_mpi: object = None, executable: str | None = None, elastic: dict[str, Any] | None = None,
         elastic_timeout: object = None) -> RunPlan:
    """Check `unison.run`'s Horovod arguments and decide what they do.

    Args:
        num_proc: number of processes; None: the slots of `hosts`/`hostfile`, else `DEFAULT_NUM_PROC`.
        np: Horovod's deprecated name for `num_proc`.
        hosts: ``"localhost:N"``-style hosts, all of them this machine.
        hostfile: a file of such hosts, one per line (``host:N`` or ``host slots=N``).
        start_timeout: seconds each rank's `init()` waits for the others (UNISON_START_TIMEOUT_SECONDS).
        output_filename: directory for each rank's output files.
        use_gloo: refused when true: unison has no Gloo backend.
        use_mpi: any value: True asks for MPI, which unison always uses; False and None say "no
            preference" in Horovod (its examples pass ``use_mpi=False`` without ``--communication``).
        executable: the Python that runs each rank.
        elastic: the elastic arguments by name (`ELASTIC_ARGUMENTS`); any makes the job elastic, on
            the hosts ``host_discovery_script`` prints or else on the fixed `hosts`/`hostfile`.
        elastic_timeout: seconds an elastic job waits for its fewest processes (default:
            ``HOROVOD_ELASTIC_TIMEOUT``, else 600).

    Raises:
        InvalidArgumentError: an argument unison.run cannot honour; the message says what to do.
        LaunchError: a number of processes below 1.
    """
    if use_gloo:
        raise InvalidArgumentError(
            "unison.run got use_gloo=True, but unison has no Gloo backend: its ranks run under mpiexec "
            "(set UNISON_CONTROLLER=grpc in env= for the gRPC control plane). Leave use_gloo unset."
        )
    if num_proc is not None and np is not None and num_proc != np:
        raise InvalidArgumentError(
            f"num_proc and its deprecated alias np disagree: num_proc={num_proc!r}, np={np!r}. Pass num_proc only."
        )
    env: dict[str, str] = {}
    if start_timeout is not None:
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, int | float) or not (
                math.isfinite(start_timeout) and start_timeout > 0):
            raise InvalidArgumentError(
                f"start_timeout is a positive number of seconds. Got start_timeout={start_timeout!r}."
            )
        env["UNISON_START_TIMEOUT_SECONDS"] = str(float(start_timeout))
    given = {name: value for name, value in (elastic or {}).items() if value is not None}
    if given or elastic_timeout is not None:
        options = _elastic_options(given, num_proc if num_proc is not None else np, hosts, hostfile,
                                   elastic_timeout)
        return RunPlan(num_proc=options.limits.min_np, env=env, output_dir=output_filename or "",
                       executable=executable or "", elastic=options)
    parsed = _local_hosts(hosts, hostfile)
    slots = None if parsed is None else sum(n for _, n in parsed)
    if num_proc is not None:
        count = _count("num_proc", num_proc)
    elif np is not None:
        count = _count("np", np)
    else:
        count = slots if slots is not None else DEFAULT_NUM_PROC
    if slots is not None and count > slots:
        raise InvalidArgumentError(
            f"num_proc={count} is more than the {slots} slots that hosts/hostfile give. Give more slots "
            "(hosts='localhost:N') or fewer processes."
        )
    return RunPlan(num_proc=count, env=env, output_dir=output_filename or "", executable=executable or "",
                   hosts="" if parsed is None else _filled(parsed, count))


def _alias(given: dict[str, Any], name: str, alias: str) -> Any:
    """The value of `name` or of its deprecated `alias` (both given: they must agree)."""
    value, other = given.get(name), given.get(alias)
    if value is not None and other is not None and value != other:
        raise InvalidArgumentError(
            f"{name} and its deprecated alias {alias} disagree: {name}={value!r}, {alias}={other!r}. "
            f"Pass {name} only."
        )
    return value if value is not None else other


def _elastic_options(given: dict[str, Any], num_proc: object, hosts: str | None, hostfile: str | None,
                     elastic_timeout: object) -> ElasticOptions:
    """The elastic driver's options for `unison.run`'s elastic arguments (`given`: those not None)."""
    script = given.get("host_discovery_script")
    fixed: tuple[Host, ...] = ()
    if not script:
        if not (hosts or hostfile):
            names = ", ".join(f"{name}=" for name in sorted(given)) or "elastic_timeout="
            raise InvalidArgumentError(
                f"unison.run got {names} but neither host_discovery_script= nor hosts=/hostfile=: an elastic "
                "job needs its hosts, from a program that prints the available ones, one 'host:slots' per "
                "line (docs/elastic.md), or fixed (hosts='localhost:2,127.0.0.1:2', as in horovod.run). Pass "
                "one of them, or a fixed num_proc=N without the elastic arguments."
            )
        fixed = tuple(Host(name, slots) for name, slots in _local_hosts(hosts, hostfile) or [])
    elif hosts or hostfile:
        raise InvalidArgumentError(
            "unison.run got host_discovery_script= with hosts=/hostfile=: an elastic job's hosts are the "
            "ones the discovery script prints. Pass one or the other."
        )
    min_np = _alias(given, "min_num_proc", "min_np")
    max_np = _alias(given, "max_num_proc", "max_np")
    if min_np is None:
        min_np = num_proc
    if min_np is None:
        raise InvalidArgumentError(
            "An elastic unison.run needs min_num_proc= (or num_proc=, its default): the fewest processes "
            "to run with."
        )
    counts = {"min_num_proc": min_np, "max_num_proc": max_np, "slots": given.get("slots")}
    for name, value in counts.items():
        if value is not None:
            _count(name, value)
    reset_limit = given.get("reset_limit")
    if reset_limit is not None and (isinstance(reset_limit, bool) or not isinstance(reset_limit, int)):
        raise InvalidArgumentError(f"reset_limit is a number of resets (an int). Got reset_limit={reset_limit!r}.")
    cooldown = given.get("cooldown_range")
    if cooldown is not None:
        try:
            low, high = (float(bound) for bound in cooldown)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"cooldown_range is (low, high) in seconds. Got cooldown_range={cooldown!r}."
            ) from None
        cooldown = (low, high)
    if elastic_timeout is not None and (isinstance(elastic_timeout, bool) or not isinstance(
            elastic_timeout, int | float) or not (math.isfinite(elastic_timeout) and elastic_timeout > 0)):
        raise InvalidArgumentError(
            f"elastic_timeout is a positive number of seconds. Got elastic_timeout={elastic_timeout!r}."
        )
    try:  # not given: HOROVOD_ELASTIC_TIMEOUT, else 600 s, as in horovod.run
        timeout, source = driver_elastic_timeout(elastic_timeout, os.environ, "elastic_timeout")
    except LaunchError as exc:
        raise InvalidArgumentError(str(exc)) from None
    try:
        limits = Limits(min_np, max_np, reset_limit, cooldown)
    except LaunchError as exc:
        raise InvalidArgumentError(str(exc).replace("--min-np", "min_num_proc").replace("--max-np", "max_num_proc")
                                   .replace("--reset-limit", "reset_limit")
                                   .replace("--blacklist-cooldown-range A B", "cooldown_range")) from None
    return ElasticOptions(str(script or ""), limits, given.get("slots"), float(timeout), fixed_hosts=fixed,
                          timeout_source=source)
