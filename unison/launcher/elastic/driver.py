"""unisonrun's elastic driver: poll the discovery script, launch one mpiexec per membership epoch, relaunch.

Decisions come from `unison.elastic.membership.Membership` (pure); this module only acts: it runs
the discovery script every `--discovery-interval`, answers rank 0's ``CHECK <epoch>`` questions on a
small TCP endpoint (signed lines under a key for the job; every answer names the epoch, and a
question from an epoch that has ended gets ``STALE``), starts each epoch's mpiexec under `supervise`, and reads how it ended: every rank done
(exit 0), every rank stopped after a commit for a host change (exit `HOSTS_UPDATED_EXIT`), or a
failure (anything else). After a failure it blacklists the failed ranks' hosts and the epoch's
remote hosts that mpiexec's launcher cannot reach any more (`hosts.reach`: a vanished host the
discovery script still lists fails the launch before any rank starts, so no rank names it).

The job's shared-memory store is a `JobDirectory` under ``/dev/shm``: removed when the driver ends,
and by its reaper if the driver is killed; the same path on the other hosts that ran ranks is removed
through mpiexec's launcher when the driver ends (best effort, logged). ``unisonrun --status`` reads
the job's record (`launcher.jobs`), which the driver rewrites at every change. ``--tag-output`` works per
epoch as without elastic; ``--output-filename DIR`` writes each epoch's files under ``DIR/epoch-N``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ..._contract import (
    ELASTIC_DRIVER_VARIABLE,
    ELASTIC_EPOCH_VARIABLE,
    ELASTIC_HOSTS_VARIABLE,
    ELASTIC_STORE_VARIABLE,
    HOSTS_UPDATED_EXIT,
    LAUNCHER_DIR_VARIABLE,
    LAUNCHER_HOSTS_VARIABLE,
    LAUNCHER_RELAY_VARIABLE,
)
from ...elastic.membership import (
    Ending,
    Epoch,
    Host,
    Limits,
    Membership,
    Stop,
    Wait,
    blame_hosts,
    error_of,
    parse_discovery,
)
from ...errors import InvalidArgumentError, LaunchError
from ..hosts.reach import Reach, address_seen_from, local_names, reach_of, run_on_hosts
from ..jobs import ElasticRecord
from ..mpi.mpiexec import MpiExec, find_mpiexec
from ..supervision.keeper import command as keeper_command
from ..supervision.reaper import JobDirectory
from ..supervision.relay import MarkerRelay
from ..supervision.supervise import JobOutcome, exit_status, report, supervise
from .endpoint import Endpoint, driver_host

__all__ = ["ElasticOptions", "add_arguments", "as_elastic_host", "options_from", "run_elastic"]



ELASTIC_TIMEOUT_VARIABLE = "HOROVOD_ELASTIC_TIMEOUT"  # horovodrun's default for --elastic-timeout
DEFAULT_ELASTIC_TIMEOUT_SECONDS = 600.0


@dataclasses.dataclass(frozen=True)
class ElasticOptions:
    """unisonrun's elastic options (Horovod's meanings).

    The hosts come from `discovery_script`, polled, or when it is empty from `fixed_hosts` (horovodrun
    ``-H a:2,b:2 --min-np 2``: an elastic job on fixed hosts, which a failed host leaves for good or
    for its cooldown). `timeout_source` names where `elastic_timeout` came from, for the message.
    """

    discovery_script: str
    limits: Limits
    slots_per_host: int | None = None
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT_SECONDS
    discovery_interval: float = 1.0
    fixed_hosts: tuple[Host, ...] = ()
    timeout_source: str = "--elastic-timeout"


def elastic_timeout(given: float | None, environ: Mapping[str, str], name: str) -> tuple[float, str]:
    """The elastic timeout and where it came from: `given` (named `name`), else ``HOROVOD_ELASTIC_TIMEOUT``,
    else 600 s (Horovod's order).

    Example:
        >>> elastic_timeout(None, {"HOROVOD_ELASTIC_TIMEOUT": "30"}, "--elastic-timeout")
        (30.0, 'HOROVOD_ELASTIC_TIMEOUT')
    """
    if given is not None:
        value, source = given, name
    elif ELASTIC_TIMEOUT_VARIABLE in environ:
        source = ELASTIC_TIMEOUT_VARIABLE
        try:
            value = float(environ[source])
        except ValueError:
            value = math.nan
        text = environ[source]
    else:
        return DEFAULT_ELASTIC_TIMEOUT_SECONDS, name
    if not (math.isfinite(value) and value > 0):
        shown = f"{source}={text!r}" if source == ELASTIC_TIMEOUT_VARIABLE else f"{source} {value:g}"
        raise LaunchError(f"{source} is how long an elastic job waits for its --min-np slots: a positive number "
                          f"of seconds. Got {shown}.")
    return value, source


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the elastic options to unisonrun's parser."""
    group = p.add_argument_group("elastic training (docs/elastic.md)")
    group.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, default=None,
                       help="fewest processes to run with (default: -np)")
    group.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, default=None,
                       help="most processes to run with (default: as many as the hosts offer)")
    group.add_argument("--host-discovery-script", default="", metavar="SCRIPT",
                       help="program printing the available hosts, one 'host:slots' per line; polled; "
                       "makes the job elastic")
    group.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, default=None,
                       metavar="K", help="slots of a host the discovery script prints without ':slots'")
    group.add_argument("--elastic-timeout", type=float, default=None, metavar="SECONDS",
                       help="how long to wait for --min-np slots before failing (default: $HOROVOD_ELASTIC_TIMEOUT, "
                       "else 600)")
    group.add_argument("--reset-limit", type=int, default=None, metavar="R",
                       help="stop the job when it would be reset more than R times")
    group.add_argument("--blacklist-cooldown-range", type=float, nargs=2, default=None, metavar=("A", "B"),
                       help="a failed host may return after a cooldown: A*2^n seconds plus up to A of "
                       "jitter after its n-th failure, at most B (default: it stays blacklisted)")
    group.add_argument("--discovery-interval", type=float, default=1.0, metavar="SECONDS",
                       help="how often the discovery script runs (default 1)")


def options_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ElasticOptions | None:
    """The elastic options of parsed arguments, or None when the job is not elastic.

    Elastic: a discovery script, or (as horovodrun) -H/--hostfile with any of --min-np, --max-np,
    --reset-limit, --blacklist-cooldown-range: then the hosts are fixed.
    """
    environ = os.environ if environ is None else environ
    given = [flag for flag, value in (("--min-np", args.min_np), ("--max-np", args.max_np),
                                      ("--reset-limit", args.reset_limit),
                                      ("--blacklist-cooldown-range", args.blacklist_cooldown_range))
             if value is not None]
    fixed: tuple[Host, ...] = ()
    if not args.host_discovery_script:
        if not given:
            return None
        if not (args.hosts or args.hostfile):
            raise LaunchError(f"{', '.join(given)} make the job elastic, which needs its hosts: "
                              "--host-discovery-script SCRIPT (hosts that come and go) or -H/--hostfile "
                              "(fixed hosts, as horovodrun -H a:2,b:2 --min-np 2).")
        from ..hosts.hostfile import parse_hosts, read_hostfile

        try:
            entries = args.hosts.split(",") if args.hosts else read_hostfile(args.hostfile)
            fixed = tuple(Host(name, slots) for name, slots in
                          parse_hosts(entries, "-H" if args.hosts else f"--hostfile {args.hostfile}"))
        except InvalidArgumentError as exc:
            raise LaunchError(str(exc)) from None
        if not fixed:
            where = f"-H {args.hosts!r}" if args.hosts else f"--hostfile {args.hostfile} (empty)"
            raise LaunchError(f"{where} names no host: an elastic job on fixed hosts needs at least one "
                              "'host:slots' (-H a:2,b:2, or one per line in the hostfile).")
    min_np = args.min_np if args.min_np is not None else args.np
    if min_np is None:
        raise LaunchError("An elastic job needs -np N or --min-np N.")
    cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
    timeout, source = elastic_timeout(args.elastic_timeout, environ, "--elastic-timeout")
    return ElasticOptions(args.host_discovery_script,
                          Limits(min_np, args.max_np, args.reset_limit, cooldown),  # type: ignore[arg-type]
                          args.slots_per_host, timeout, args.discovery_interval, fixed, source)


class _Discovery:
    """Runs the discovery script every interval in a thread; keeps the last good answer (`fixed`: no
    script, these hosts always)."""

    def __init__(self, script: str, slots: int | None, interval: float, on_hosts: object,
                 fixed: tuple[Host, ...] = ()) -> None:
        self.script, self.slots, self.interval, self.fixed = script, slots, interval, fixed
        self.on_hosts = on_hosts
        self.hosts: tuple[Host, ...] | None = None
        self.error = ""
        self.polls = 0
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._polling = threading.Lock()
        self.poll()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="unison-elastic-discovery")
        self.thread.start()

    def poll(self) -> None:
        with self._polling:
            self._poll()

    def _poll(self) -> None:
        if self.fixed:
            self._found(self.fixed)
            return
        try:
            done = subprocess.run(shlex.split(self.script), capture_output=True, text=True,
                                  timeout=max(10.0, self.interval * 10))
            if done.returncode != 0:
                raise LaunchError(f"the host discovery script exited with status {done.returncode}: "
                                  f"{done.stderr.strip()[:300]}")
            hosts = parse_discovery(done.stdout, self.slots)
        except (OSError, subprocess.TimeoutExpired, LaunchError) as exc:
            if str(exc) != self.error:
                print(f"unisonrun: elastic: {exc} (keeping the hosts it printed last)", file=sys.stderr, flush=True)
            self.error = str(exc)
            return
        self._found(hosts)

    def _found(self, hosts: tuple[Host, ...]) -> None:
        self.error = ""
        self.polls += 1
        if hosts != self.hosts:
            self.hosts = hosts
            self.changed.set()
        callback = self.on_hosts
        if callable(callback):
            callback(hosts)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()


def _is_local(name: str) -> bool:
    return name in local_names()


def _store_directory() -> JobDirectory:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return JobDirectory(f"unison-elastic-{os.getuid()}-", base=base, variable=ELASTIC_STORE_VARIABLE)


def _run_epoch(found: MpiExec, epoch: Epoch, program: Sequence[str], env: dict[str, str], *,
               mpi_args: str, launcher_exec: str, iface: str, env_names: Sequence[str],
               timeout: float | None, tag_output: bool = False, output_dir: str = "",
               on_launch: Callable[[str], None] | None = None) -> JobOutcome:
    remote = bool(launcher_exec) or not all(_is_local(host.name) for host in epoch.hosts)
    with JobDirectory("unisonrun-") as job, contextlib.ExitStack() as stack:
        if on_launch is not None:
            on_launch(str(job.path))
        epoch_env = dict(env)
        epoch_env[LAUNCHER_DIR_VARIABLE] = str(job.path)
        if remote:  # ranks and keepers on other hosts send their markers to the relay
            names = [host.name for host in epoch.hosts if not _is_local(host.name)]
            relay = stack.enter_context(MarkerRelay(job.path, address_seen_from(names)))
            epoch_env[LAUNCHER_RELAY_VARIABLE] = relay.variable
        epoch_env[ELASTIC_EPOCH_VARIABLE] = str(epoch.number)
        epoch_env[ELASTIC_HOSTS_VARIABLE] = epoch_env[LAUNCHER_HOSTS_VARIABLE] = epoch.hosts_argument()
        if output_dir:  # one directory per epoch: a rank number names a different process each epoch
            output_dir = os.path.join(output_dir, f"epoch-{epoch.number}")
            os.makedirs(output_dir, exist_ok=True)
        tails = None
        if tag_output and found.vendor != "openmpi":  # as in a launch without elastic (cli.launch)
            output_dir = output_dir or str(job.path)
            tails = (epoch.np, output_dir)
        cmd = found.command(epoch.np, keeper_command(list(program), remote=remote),
                            hosts=epoch.hosts_argument(), env=epoch_env, env_names=env_names,
                            extra=shlex.split(mpi_args),
                            launcher_exec=launcher_exec, iface=iface, tag_output=tag_output,
                            output_dir=output_dir)
        # No grace after a failure: the state is in the commits, and the next launch starts as soon
        # as this one is gone (the ranks' orderly stop took about 3 s after an exception).
        return supervise(cmd, job.path, epoch_env, timeout=timeout, tails=tails, announce=True,
                         keepers=True, grace_seconds=0.0)


def _say(message: str) -> None:
    print(f"unisonrun: elastic: {message}", file=sys.stderr, flush=True)


PROBE_TIMEOUT_SECONDS = 10.0


def _unreachable(epoch: Epoch, blamed: Sequence[str], reach: Reach, env: dict[str, str]) -> dict[str, str]:
    """After a failed launch: the epoch's remote hosts (not already blamed) where mpiexec's launcher
    cannot even run ``true`` now, each with what the launcher said."""
    hosts = [host.name for host in epoch.hosts if not _is_local(host.name) and host.name not in blamed]
    if not hosts or not reach.usable:
        return {}
    found = {}
    answers = run_on_hosts(reach, hosts, "true", env, PROBE_TIMEOUT_SECONDS)
    for answer in answers:
        what = answer.describe(shlex.join(reach.command(answer.host, "true")))
        if not answer.started:  # our own launcher program is missing: no host is to blame for that
            _say(f"could not check whether {answer.host} is reachable: {what}")
        elif not answer.ok:
            found[answer.host] = what
    said = {(a.returncode, a.output.replace(a.host, "HOST")) for a in answers}
    if len(answers) > 1 and len(found) == len(answers) and len(said) == 1:
        # Every host failing alike points at this host (its ssh keys, DNS, network), not at them.
        _say(f"none of {', '.join(hosts)} could be reached, all alike ({found[hosts[0]]}); that looks like "
             "a problem of this host, so none is blacklisted for it")
        return {}
    return found


def _remove_remote_stores(hosts: Sequence[str], store: str, reach: Reach, env: dict[str, str]) -> None:
    """Remove the job's store directory on each remote host that ran ranks (best effort, logged)."""
    remote = [name for name in hosts if not _is_local(name)]
    if not remote:
        return
    if not reach.usable:
        _say(f"left the job's store {store} on {', '.join(remote)}: --mpi-args choose how mpiexec reaches "
             "them, which the driver cannot follow; remove it there")
        return
    command = f"rm -rf -- {shlex.quote(store)}"
    for answer in run_on_hosts(reach, remote, command, env, PROBE_TIMEOUT_SECONDS):
        if not answer.ok:
            _say(f"could not remove the job's store {store} on {answer.host}: "
                 + answer.describe(shlex.join(reach.command(answer.host, command))))


def as_elastic_host(epoch: Epoch, rank: int, why: str) -> str:
    """`why` (a failed rank's reason) naming `rank` by the elastic host it ran as, not the machine's name.

    Example:
        >>> as_elastic_host(Epoch(3, (Host("127.0.0.1", 1), Host("localhost", 1))), 1,
        ...                 "rank 1 (vm, pid 42) failed: ValueError: bad")
        'rank 1 (localhost, pid 42) failed: ValueError: bad'
    """
    prefix = f"rank {rank} ("
    if not why.startswith(prefix) or not 0 <= rank < epoch.np:
        return why
    machine, sep, rest = why[len(prefix):].partition(", pid ")
    return f"{prefix}{epoch.host_of(rank)}{sep}{rest}" if sep and ")" not in machine else why


def _blacklisting(membership: Membership, blamed: dict[str, str], now: float) -> str:
    """The log's account of whom the driver blacklisted, for how long, and why."""
    parts = []
    for name, why in blamed.items():
        left = membership.blacklist.get(name, now) - now
        count = membership.blacklistings.get(name, 1)
        duration = ("for good" if math.isinf(left) else
                    f"for {left:.1f} s (failure {count} of this host; --blacklist-cooldown-range backs off)")
        parts.append(f"{name} {duration} ({why})")
    return "; blacklisting " + ", ".join(parts) if parts else ""


def run_elastic(options: ElasticOptions, program: Sequence[str], *, mpiexec: str = "", mpi_args: str = "",
                env_pairs: Sequence[tuple[str, str]] = (), launcher_exec: str = "", iface: str = "",
                timeout: float | None = None, tag_output: bool = False, output_dir: str = "",
                on_epoch: Callable[[Epoch], None] | None = None) -> int:
    """Run `program` elastically; return unisonrun's exit status.

    `on_epoch` is called with each epoch before it starts (`unison.run` collects the last one's results).
    """
    if not program:
        raise LaunchError("No program given: unisonrun -np N --host-discovery-script S python train.py")
    found = find_mpiexec(mpiexec)
    reach = reach_of(launcher_exec, mpi_args)
    membership = Membership(options.limits)
    lock = threading.Lock()
    endpoint = Endpoint()

    published: list[tuple[Host, ...]] = []  # the discovery answer last written to the status record

    def on_hosts(hosts: tuple[Host, ...]) -> None:
        with lock:
            current = membership.current
            if current is not None and membership.wants_change(hosts, time.monotonic()):
                endpoint.announce(current.number)
        if published != [hosts]:
            published[:] = [hosts]
            status.publish(hosts)

    store = _store_directory()
    with store, contextlib.ExitStack() as cleanup:
        cleanup.callback(endpoint.close)
        status = ElasticRecord(str(store.path), program, membership, lock)
        store.remove_too(status.record)
        cleanup.callback(status.remove)
        discovery = _Discovery(options.discovery_script, options.slots_per_host, options.discovery_interval,
                               on_hosts, options.fixed_hosts)
        cleanup.callback(discovery.stop)
        started = time.monotonic()
        env = dict(os.environ)
        env.update(env_pairs)
        env[ELASTIC_STORE_VARIABLE] = str(store.path)  # marks every rank of the job for the store's reaper
        failures = 0
        # Hosts that may hold a store: every host of every epoch, less those found unreachable since
        # (a vanished host took its store with it; asking it again would only wait for a timeout).
        stores: dict[str, None] = {}
        cleanup.callback(lambda: _remove_remote_stores(list(stores), str(store.path), reach, env))
        while True:
            decision = _wait_for_hosts(options, membership, discovery, lock,
                                       lambda message: status.publish(discovery.hosts, waiting=message))
            if isinstance(decision, Stop):
                _say(decision.message)
                return 1
            with lock:
                membership.started(decision)
                endpoint.begin(decision.number)
            stores.update(dict.fromkeys(host.name for host in decision.hosts))
            local = all(_is_local(host.name) for host in decision.hosts)
            remote_hosts = [host.name for host in decision.hosts if not _is_local(host.name)]
            # KEY@HOST:PORT: rank 0 signs its questions with the key and checks the answers' signatures
            env[ELASTIC_DRIVER_VARIABLE] = endpoint.listen(driver_host(local, remote_hosts))
            _say(f"epoch {decision.number}: {decision.np} ranks on {decision.hosts_argument()}")
            if on_epoch is not None:
                on_epoch(decision)
            remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            status.publish(discovery.hosts, epoch=decision.number, np=decision.np,
                           hosts=decision.hosts_argument(), epoch_started=time.time(), running=True, waiting="")
            asked = endpoint.statistics()["answered"]  # rank 0 asks at its commits: a sign of progress
            outcome = _run_epoch(found, decision, program, env, mpi_args=mpi_args, launcher_exec=launcher_exec,
                                 iface=iface, env_names=[name for name, _ in env_pairs], timeout=remaining,
                                 tag_output=tag_output, output_dir=output_dir,
                                 on_launch=lambda path: status.publish(launcher_dir=path))
            status.publish(launcher_dir="", running=False)
            if outcome.interrupted or outcome.timed_out:
                report(outcome)
                return exit_status(outcome)
            if outcome.returncode == 0 and not outcome.failures:
                return 0
            blamed: dict[str, str] = {}
            if outcome.returncode == HOSTS_UPDATED_EXIT and not outcome.failures:
                ending = Ending.HOSTS_UPDATED
                _say(f"epoch {decision.number} committed and stopped for a change of hosts")
            else:
                outcome.failures = {rank: as_elastic_host(decision, rank, why) for rank, why in outcome.failures.items()}
                report(outcome)
                ending = Ending.FAILED
                by_rank = blame_hosts(decision, outcome.failures, {})
                unreachable = _unreachable(decision, list(by_rank), reach, env)
                blamed = blame_hosts(decision, outcome.failures, unreachable)
                for name in unreachable:
                    stores.pop(name, None)
            with lock:
                now = time.monotonic()
                first = next(iter(outcome.failures.values()), "")
                stop = membership.ended(ending, blamed, now, committed=endpoint.statistics()["answered"] > asked,
                                        error=error_of(first) if ending is Ending.FAILED else None)
            failures += ending is Ending.FAILED
            status.publish(failures=failures)
            if ending is Ending.FAILED:
                _say(f"epoch {decision.number} failed (exit status {exit_status(outcome)})"
                     + _blacklisting(membership, blamed, now))
            if stop is not None:
                _say(stop.message)
                return 1
            discovery.poll()  # plan the next epoch on what discovery says now, not a poll ago


def _wait_for_hosts(options: ElasticOptions, membership: Membership, discovery: _Discovery,
                    lock: threading.Lock, on_wait: Callable[[str], None]) -> Epoch | Stop:
    """The next epoch, once discovery offers --min-np slots; a Stop after --elastic-timeout."""
    deadline = time.monotonic() + options.elastic_timeout
    said = ""
    while True:
        with lock:
            decision = membership.plan(discovery.hosts or (), time.monotonic())
        if not isinstance(decision, Wait):
            return decision
        if time.monotonic() >= deadline:
            return Stop(f"waited {options.elastic_timeout:g} s ({options.timeout_source}) for hosts: {decision.message}. "
                        "Add hosts, or lower --min-np.")
        if decision.message != said:
            said = decision.message
            _say(f"waiting for hosts: {decision.message}")
            on_wait(decision.message)
        discovery.changed.clear()
        discovery.changed.wait(min(options.discovery_interval, max(0.0, deadline - time.monotonic())) + 0.01)

