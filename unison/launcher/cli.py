"""The `unisonrun` command line: parse options, start the job under the matching mpiexec, supervise it."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .._contract import LAUNCHER_DIR_VARIABLE
from .._contract import LAUNCHER_HOSTS_VARIABLE as HOSTS_VARIABLE
from .._contract import LAUNCHER_KEEP_GOING_VARIABLE as KEEP_GOING_VARIABLE
from .._contract import LAUNCHER_RELAY_VARIABLE as RELAY_VARIABLE
from ..config import load_settings
from ..errors import ConfigError, InvalidArgumentError, LaunchError
from .elastic.driver import add_arguments as add_elastic_arguments
from .elastic.driver import options_from as elastic_options
from .elastic.driver import run_elastic
from .hosts.hostfile import parse_hosts, read_hostfile
from .hosts.reach import address_seen_from
from .jobs import register, show_status
from .mpi.lines import rank_tags
from .mpi.mpiexec import find_mpiexec
from .mpi.program import check_program
from .mpi.variables import env_pairs, hide_values
from .supervision.keeper import command as keeper_command
from .supervision.reaper import JobDirectory
from .supervision.relay import MarkerRelay
from .supervision.supervise import exit_status, report, supervise

__all__ = ["main", "parser"]

EPILOG = """\
examples:
  unisonrun -np 4 python train.py
  unisonrun -np 4 -H host1:2,host2:2 python train.py      (hosts reached by mpiexec's own launcher)
  unisonrun -np 2 --tag-output --timeout 3600 python train.py
  unisonrun -np 4 -H host1:2,host2:2 --pservers 2 python train.py
                                                           (parameter servers, one per host: docs/ps.md)
  unisonrun --check-build
  unisonrun --status                                       (live table of your running job;
                                                            needs UNISON_CONTROLLER=grpc)

When any rank fails (uncaught exception, signal, exit without shutting unison down) every rank is
stopped within 10 s, the failed rank is named, and unisonrun exits non-zero.
"""


def parser() -> argparse.ArgumentParser:
    """The argument parser of `unisonrun`."""
    p = argparse.ArgumentParser(
        prog="unisonrun", description="Run a unison job on N processes under mpiexec, and stop it "
        "cleanly when any rank fails.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int, help="number of processes")
    p.add_argument("-H", "--hosts", default="", help="hosts and slots, e.g. host1:2,host2:2")
    p.add_argument("--hostfile", default="", help="file with one 'host:slots' per line")
    p.add_argument("--tag-output", action="store_true", help="prefix every output line with its rank")
    p.add_argument("--output-filename", default="", metavar="DIR", help="write each rank's output to DIR")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the job (exit status 124) after this many seconds")
    p.add_argument("-x", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="pass an environment variable to every rank, through mpiexec's environment "
                   "(never its command line); for secrets give NAME only, with the value exported; "
                   "repeatable")
    p.add_argument("--mpi-args", default="", help="extra arguments for mpiexec, as one string")
    p.add_argument("--launcher-exec", default="", metavar="SCRIPT",
                   help="program mpiexec runs instead of ssh to start processes on other hosts "
                   "(MPICH: -launcher ssh -launcher-exec SCRIPT; Open MPI: --mca plm_rsh_agent SCRIPT)")
    p.add_argument("--iface", default=os.environ.get("UNISON_IFACE", ""), metavar="IF",
                   help="network interface for MPI traffic between hosts (default: $UNISON_IFACE); with "
                   "MPICH this also selects the TCP netmod (ofi/tcp) so data crosses that interface")
    p.add_argument("--mpiexec", default="", metavar="PATH", help="mpiexec to use (default: the one next "
                   "to this Python, else on PATH); must belong to the MPI that mpi4py loads")
    p.add_argument("--check-build", action="store_true", help="print versions and usable backends, then "
                   "run a 2-process self-test")
    p.add_argument("--status", nargs="?", const="", default=None, metavar="PID|HOST:PORT",
                   help="print the live status table of your running job (started by unisonrun with "
                   "UNISON_CONTROLLER=grpc), or of the job with that unisonrun pid or service address")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=None,
                   help="the ranks' log level (sets HOROVOD_LOG_LEVEL and UNISON_LOG_LEVEL for them, as horovodrun)")
    add_elastic_arguments(p)
    p.add_argument("--pservers", type=int, default=0, metavar="N",
                   help="also start N parameter servers running the same program (its unison.ps.init() "
                   "serves there): on this host, or with -H/--hostfile round robin over the hosts, started "
                   "as mpiexec starts ranks there; the -np processes are its trainers (docs/ps.md)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="program and its arguments")
    return p


MPI_MESSAGES_FILE = "mpiexec.log"  # MPICH's own report of a stop unison explained, in --output-filename DIR
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")  # horovodrun's --log-level choices


def _variables(args: argparse.Namespace) -> list[tuple[str, str]]:
    """What every rank gets in its environment: the ``-x`` variables, then ``--log-level``'s."""
    pairs = env_pairs(args.env, os.environ)
    if args.log_level:
        pairs += [("HOROVOD_LOG_LEVEL", args.log_level), ("UNISON_LOG_LEVEL", args.log_level.lower())]
    return pairs


_HOST_OPTIONS = frozenset({"-hosts", "-host", "-H", "--host", "-f", "-hostfile", "--hostfile", "-machinefile",
                           "--machinefile", "-machine", "-launcher", "-launcher-exec", "-bootstrap"})


def _local_only(hosts: str, hostfile: str, launcher_exec: str, extra: Sequence[str]) -> bool:
    """True when every rank runs on this host (else keepers take their remote form, and markers the relay)."""
    return not (hosts or hostfile or launcher_exec) and not any(
        arg.split("=", 1)[0] in _HOST_OPTIONS for arg in extra)


def _hosts_and_slots(hosts: str, hostfile: str) -> list[tuple[str, int]]:
    """The hosts of ``-H`` or of a hostfile with their slots; none when they do not parse (mpiexec will say why)."""
    try:
        entries = hosts.split(",") if hosts else read_hostfile(hostfile) if hostfile else []
        return parse_hosts(entries, "hosts")
    except InvalidArgumentError:
        return []


def _host_names(hosts: str, hostfile: str) -> list[str]:
    """The host names of ``-H`` or of a hostfile; none when they do not parse (mpiexec will say why)."""
    return [name for name, _ in _hosts_and_slots(hosts, hostfile)]


def launcher_hosts(np: int, hosts: str = "", hostfile: str = "") -> str:
    """``UNISON_LAUNCHER_HOSTS`` for a launch: its hosts as ``host:slots,...`` (``localhost:np`` without
    -H or a hostfile, as horovodrun), from which each rank's keeper derives the HOROVOD_* variables."""
    if not hosts and not hostfile:
        return f"localhost:{np}"
    return ",".join(f"{name}:{slots}" for name, slots in _hosts_and_slots(hosts, hostfile))


def launch(np: int, program: Sequence[str], *, hosts: str = "", hostfile: str = "", tag_output: bool = False,
           output_dir: str = "", env_pairs: Sequence[tuple[str, str]] = (), mpi_args: str = "",
           mpiexec: str = "", timeout: float | None = None, extra_env: dict[str, str] | None = None,
           quiet_stdout: bool = False, launcher_exec: str = "", iface: str = "", keep_going: bool = False,
           role: str = "", check: Callable[[], Mapping[int, str]] | None = None) -> int:
    """Start `program` on `np` ranks, supervise it, print who failed, and return the exit status.

    `keep_going`, `role` and `check` are `supervise`'s; with `keep_going` MPICH's mpiexec is told
    not to stop the other ranks when one fails (``-disable-auto-cleanup``).
    """
    if np < 1:
        raise LaunchError(f"-np must be at least 1. Got -np {np}.")
    if not program:
        raise LaunchError("No program given: unisonrun -np N python train.py")
    check_program(np, program)
    try:  # a bad UNISON_*/HOROVOD_* value fails here once, not on every rank after the start
        settings = load_settings({**os.environ, **(extra_env or {}), **dict(env_pairs)})
    except ConfigError as exc:
        raise LaunchError(str(exc)) from None
    found = find_mpiexec(mpiexec)
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    extra = shlex.split(mpi_args)
    remote = not _local_only(hosts, hostfile, launcher_exec, extra)
    if keep_going and found.vendor == "mpich":
        extra = ["-disable-auto-cleanup", *extra]
    with JobDirectory("unisonrun-") as job, contextlib.ExitStack() as stack:
        directory = str(job.path)
        env = dict(os.environ)
        env.update(extra_env or {})
        env.update(env_pairs)  # values travel in mpiexec's environment, never on its command line
        env[LAUNCHER_DIR_VARIABLE] = directory
        env[HOSTS_VARIABLE] = launcher_hosts(np, hosts, hostfile)
        if keep_going:  # keepers report a rank's death by signal as an exit status: mpiexec keeps the others
            env[KEEP_GOING_VARIABLE] = "1"
        if remote:  # ranks and keepers on other hosts send their markers to the relay
            relay = stack.enter_context(MarkerRelay(job.path, address_seen_from(_host_names(hosts, hostfile))))
            env[RELAY_VARIABLE] = relay.variable
        tails = None
        if tag_output and found.vendor != "openmpi":
            # Hydra's own -prepend-rank tags each chunk it reads, not each line: write every rank's
            # output to files and tag whole lines while copying them out.
            output_dir = output_dir or directory
            tails = (np, output_dir)
        tags = rank_tags(found.vendor, output_dir, extra)  # each rank's lines whole through our relay
        # Every variable set here is named.
        cmd = found.command(np, keeper_command(list(program), remote=remote), hosts=hosts,
                            hostfile=hostfile, tag_output=tag_output, output_dir=output_dir,
                            env=env, env_names=[name for name, _ in env_pairs], extra=extra,
                            launcher_exec=launcher_exec, iface=iface, tags=tags)
        record = register(directory, program, np)
        job.remove_too(record)
        try:
            outcome = supervise(cmd, job.path, env, timeout=timeout,
                                stdout=subprocess.DEVNULL if quiet_stdout else None, tails=tails,
                                announce=True, keepers=True, keep_going=keep_going, role=role, check=check,
                                mpi_messages=Path(output_dir) / MPI_MESSAGES_FILE if output_dir else None,
                                show_mpi_messages=settings.log_level in ("trace", "debug"), tags=tags)
        finally:
            if record is not None:
                record.unlink(missing_ok=True)
    report(outcome)
    return exit_status(outcome)


def _refuse_in_elastic_mode(args: argparse.Namespace) -> None:
    """Options that have no meaning in an elastic job (whose hosts come from the discovery script, or
    are the fixed -H/--hostfile ones)."""
    if args.host_discovery_script and (args.hosts or args.hostfile):
        given = "-H/--hosts" if args.hosts else "--hostfile"
        raise LaunchError(
            f"{given} cannot be combined with --host-discovery-script: an elastic job runs on the hosts "
            "the discovery script prints. Drop one of them (a script that prints fixed hosts: "
            "echo localhost:2)."
        )
    if args.pservers:
        what = ("--host-discovery-script" if args.host_discovery_script else
                "an elastic job (--min-np, --max-np, --reset-limit, --blacklist-cooldown-range)")
        raise LaunchError(
            f"--pservers {args.pservers} cannot be combined with {what}: parameter servers run beside a "
            "fixed set of trainers, not an elastic one. Drop one of them."
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `unisonrun` and ``python -m unison.launcher``; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        if args.check_build:
            from .check_build import check_build

            return check_build(mpiexec=args.mpiexec)
        if args.status is not None:
            return show_status(args.status)
        if args.np is None:
            parser().error("-np N is required")
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        hide_values(args.env)
        elastic = elastic_options(args)
        if elastic is not None:
            _refuse_in_elastic_mode(args)
            return run_elastic(elastic, command, mpiexec=args.mpiexec, mpi_args=args.mpi_args,
                               env_pairs=_variables(args), launcher_exec=args.launcher_exec,
                               iface=args.iface, timeout=args.timeout, tag_output=args.tag_output,
                               output_dir=args.output_filename)
        if args.pservers:
            from .pservers.servers import parameter_servers

            with parameter_servers(args.pservers, args.np, command, hosts=args.hosts, hostfile=args.hostfile,
                                   launcher_exec=args.launcher_exec, env_pairs=_variables(args)) as servers:
                # a trainer that fails does not stop the others: the servers' rules decide (docs/ps.md)
                return launch(args.np, command, hosts=args.hosts, hostfile=args.hostfile,
                              tag_output=args.tag_output, output_dir=args.output_filename,
                              env_pairs=_variables(args), mpi_args=args.mpi_args,
                              mpiexec=args.mpiexec, timeout=args.timeout, launcher_exec=args.launcher_exec,
                              iface=args.iface, extra_env=servers.env, keep_going=True,
                              role="parameter-server trainer", check=servers.check)
        return launch(args.np, command, hosts=args.hosts, hostfile=args.hostfile, tag_output=args.tag_output,
                      output_dir=args.output_filename, env_pairs=_variables(args),
                      mpi_args=args.mpi_args, mpiexec=args.mpiexec, timeout=args.timeout,
                      launcher_exec=args.launcher_exec, iface=args.iface)
    except LaunchError as exc:
        print(f"unisonrun: {exc}", file=sys.stderr)
        return 2
