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
import importlib.util
import math
import os
import shlex
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
    blame_hosts,
    error_of,
)
from ...errors import InvalidArgumentError, LaunchError
from ..hosts.reach import address_seen_from, reach_of
from ..jobs import ElasticRecord
from ..mpi.lines import rank_tags
from ..mpi.mpiexec import MpiExec, find_mpiexec
from ..supervision.keeper import command as keeper_command
from ..supervision.reaper import JobDirectory
from ..supervision.relay import MarkerRelay
from ..supervision.supervise import JobOutcome, exit_status, report, supervise
from .discovery import Discovery, say, wait_for_hosts
from .endpoint import Endpoint, driver_host
from .hostcare import as_elastic_host, blacklisting, is_local, remove_remote_stores, store_directory
from .hostcare import unreachable as _unreachable

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
    relaunch: bool = False  # one mpiexec launch per epoch, every process anew (--elastic-relaunch)


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
    group.add_argument("--elastic-relaunch", action="store_true",
                       help="start every process anew for each membership epoch (one mpiexec launch each, "
                       "MPI as the transport) instead of keeping the survivors' processes (gloo; needs torch)")


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
                          args.slots_per_host, timeout, args.discovery_interval, fixed, source,
                          relaunch=bool(getattr(args, "elastic_relaunch", False)))


def _run_epoch(found: MpiExec, epoch: Epoch, program: Sequence[str], env: dict[str, str], *,
               mpi_args: str, launcher_exec: str, iface: str, env_names: Sequence[str],
               timeout: float | None, tag_output: bool = False, output_dir: str = "",
               on_launch: Callable[[str], None] | None = None) -> JobOutcome:
    remote = bool(launcher_exec) or not all(is_local(host.name) for host in epoch.hosts)
    with JobDirectory("unisonrun-") as job, contextlib.ExitStack() as stack:
        if on_launch is not None:
            on_launch(str(job.path))
        epoch_env = dict(env)
        epoch_env[LAUNCHER_DIR_VARIABLE] = str(job.path)
        if remote:  # ranks and keepers on other hosts send their markers to the relay
            names = [host.name for host in epoch.hosts if not is_local(host.name)]
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
        extra = shlex.split(mpi_args)
        tags = rank_tags(found.vendor, output_dir, extra)  # each rank's lines whole through the relay
        cmd = found.command(epoch.np, keeper_command(list(program), remote=remote),
                            hosts=epoch.hosts_argument(), env=epoch_env, env_names=env_names,
                            extra=extra, launcher_exec=launcher_exec, iface=iface, tag_output=tag_output,
                            output_dir=output_dir, tags=tags)
        # No grace after a failure: the state is in the commits, and the next launch starts as soon
        # as this one is gone (the ranks' orderly stop took about 3 s after an exception).
        return supervise(cmd, job.path, epoch_env, timeout=timeout, tails=tails, announce=True,
                         keepers=True, grace_seconds=0.0, tags=tags)


def run_elastic(options: ElasticOptions, program: Sequence[str], *, mpiexec: str = "", mpi_args: str = "",
                env_pairs: Sequence[tuple[str, str]] = (), launcher_exec: str = "", iface: str = "",
                timeout: float | None = None, tag_output: bool = False, output_dir: str = "",
                on_epoch: Callable[[Epoch], None] | None = None) -> int:
    """Run `program` elastically; return unisonrun's exit status.

    The survivors of a membership change keep their processes (`inplace`) unless the job asks for one
    launch per epoch: ``--elastic-relaunch``, or mpiexec's own options (``--mpi-args``,
    ``--tag-output``, ``--output-filename``), or no torch to run gloo on (`in_place`). `on_epoch` is
    called with each epoch before it starts (`unison.run` collects the last one's results).
    """
    if not program:
        raise LaunchError("No program given: unisonrun -np N --host-discovery-script S python train.py")
    if in_place(options, mpi_args=mpi_args, tag_output=tag_output, output_dir=output_dir):
        from .inplace import run_in_place

        env = dict(os.environ)
        env.update(env_pairs)
        return run_in_place(options, program, env=env, launcher_exec=launcher_exec, iface=iface, timeout=timeout,
                            on_epoch=on_epoch)
    return _run_relaunching(options, program, mpiexec=mpiexec, mpi_args=mpi_args, env_pairs=env_pairs,
                            launcher_exec=launcher_exec, iface=iface, timeout=timeout, tag_output=tag_output,
                            output_dir=output_dir, on_epoch=on_epoch)


def in_place(options: ElasticOptions, *, mpi_args: str = "", tag_output: bool = False, output_dir: str = "") -> bool:
    """Whether the survivors keep their processes: no --elastic-relaunch, none of mpiexec's own
    options, and torch installed (the workers' gloo groups and the driver's store are torch's).

    Example:
        >>> in_place(ElasticOptions("./discover.sh", Limits(1)), mpi_args="-l")
        False
    """
    if options.relaunch or mpi_args or tag_output or output_dir:
        return False
    return importlib.util.find_spec("torch") is not None


def _run_relaunching(options: ElasticOptions, program: Sequence[str], *, mpiexec: str, mpi_args: str,
                     env_pairs: Sequence[tuple[str, str]], launcher_exec: str, iface: str, timeout: float | None,
                     tag_output: bool, output_dir: str, on_epoch: Callable[[Epoch], None] | None) -> int:
    """The driver that starts one mpiexec per epoch, every process anew."""
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

    store = store_directory()
    with store, contextlib.ExitStack() as cleanup:
        cleanup.callback(endpoint.close)
        status = ElasticRecord(str(store.path), program, membership, lock)
        store.remove_too(status.record)
        cleanup.callback(status.remove)
        discovery = Discovery(options.discovery_script, options.slots_per_host, options.discovery_interval,
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
        cleanup.callback(lambda: remove_remote_stores(list(stores), str(store.path), reach, env))
        while True:
            decision = wait_for_hosts(options.elastic_timeout, options.timeout_source, options.discovery_interval,
                                      membership, discovery, lock,
                                      lambda message: status.publish(discovery.hosts, waiting=message))
            if isinstance(decision, Stop):
                say(decision.message)
                return 1
            with lock:
                membership.started(decision)
                endpoint.begin(decision.number)
            stores.update(dict.fromkeys(host.name for host in decision.hosts))
            local = all(is_local(host.name) for host in decision.hosts)
            remote_hosts = [host.name for host in decision.hosts if not is_local(host.name)]
            # KEY@HOST:PORT: rank 0 signs its questions with the key and checks the answers' signatures
            env[ELASTIC_DRIVER_VARIABLE] = endpoint.listen(driver_host(local, remote_hosts))
            say(f"epoch {decision.number}: {decision.np} ranks on {decision.hosts_argument()}")
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
                say(f"epoch {decision.number} committed and stopped for a change of hosts")
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
                say(f"epoch {decision.number} failed (exit status {exit_status(outcome)})"
                     + blacklisting(membership, blamed, now))
            if stop is not None:
                say(stop.message)
                return 1
            discovery.poll()  # plan the next epoch on what discovery says now, not a poll ago
