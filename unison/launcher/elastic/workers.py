"""The elastic driver's worker processes: start one per slot, on this host or another, watch them end, stop them.

Where the survivors of a membership change keep their processes, the driver starts every worker
itself (no mpiexec): on this host as its child, in a session of its own; on another host through
mpiexec's way of reaching it (``--launcher-exec``, else ``ssh``), with the worker's environment sent on
the remote command's standard input (keys never appear on a command line) to a few lines of Python
that set it, run the program as their child and report how it ended (`_BOOTSTRAP`). Each worker is named ``w<N>`` and gets its own marker directory
``<job>/w<N>`` (``UNISON_LAUNCHER_DIR``; on another host a marker relay of its own writes there), so
that its markers stay its own whatever ranks it holds over the epochs. Deaths come in the order the
kernel saw them (`DeathWatch`); a remote worker's death is that of the local command that reached it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..._contract import LAUNCHER_DIR_VARIABLE, LAUNCHER_RELAY_VARIABLE, marker_name
from ..hosts.reach import Reach, address_seen_from, local_names
from ..supervision.blame import Markers, read_markers
from ..supervision.deaths import DeathWatch
from ..supervision.relay import MarkerRelay

__all__ = ["Worker", "Workers"]

# Run on the worker's host by this Python, as ``python -c _BOOTSTRAP CONTRACT PROGRAM...``: read the
# environment (one JSON line), then run the program as a child and tell the driver how it ended (an
# ``ended`` marker over the worker's relay, as unisonrun's keeper does for a rank of an mpiexec launch):
# the driver sees only how the command that reached the host ended (a shell: 137 for a SIGKILL). It
# ignores the interrupts the driver sends the worker's process group (the program gets them and ends as
# it will); the program dies with it. Without the contract module at CONTRACT it becomes the program.
_BOOTSTRAP = f"""\
import json, os, signal, sys
env = json.loads(sys.stdin.readline())
try:
    os.chdir(env.pop("__cwd__", ""))
except OSError:
    pass
marker = env.pop("__ended__", "")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
program = sys.argv[2:]
contract = None
if marker and env.get("{LAUNCHER_RELAY_VARIABLE}"):
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("unison_contract", sys.argv[1])
        contract = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(contract)
    except Exception:
        contract = None
if contract is None:
    os.execvpe(program[0], program, env)
parent = os.getpid()
child = os.fork()
if child == 0:
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() != parent:
        os._exit(1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        os.execvpe(program[0], program, env)
    except OSError as exc:
        sys.stderr.write("unisonrun: cannot run %r: %s\\n" % (program[0], exc.strerror))
    os._exit(127)
for ignored in (signal.SIGINT, signal.SIGTERM):
    signal.signal(ignored, signal.SIG_IGN)
code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
contract.send_marker(env["{LAUNCHER_RELAY_VARIABLE}"], marker, "%d %d\\n" % (child, code))
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(parent, -code)
sys.exit(128 - code if code < 0 else code)
"""
_CONTRACT = str(Path(__file__).resolve().parents[2] / "_contract.py")
_KILL_TIMEOUT_SECONDS = 10.0


@dataclasses.dataclass
class Worker:
    """One worker process: its name, the host it runs as, the epoch and rank it started as."""

    name: str
    number: int
    host: str
    start_epoch: int
    start_rank: int
    proc: subprocess.Popen[bytes]
    directory: Path
    local: bool
    relay: MarkerRelay | None = None
    pid: int = 0  # the worker's own pid (for a remote worker, as it reported it)
    returncode: int | None = None  # once ended: its exit code (-N: signal N), as the local command saw it
    ended_at_ns: int = 0
    killed: bool = False  # the driver killed it

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def markers(self) -> Markers:
        """The marker files this worker left (of any rank it held)."""
        return read_markers(self.directory)


class Workers:
    """Start, watch and stop the job's workers.

    Example:
        >>> workers = Workers(Path(job), ["python", "train.py"], env, Reach())  # doctest: +SKIP
        >>> worker = workers.start("localhost", epoch=0, rank=0, extra={...})   # doctest: +SKIP
    """

    def __init__(self, job: Path, program: Sequence[str], env: Mapping[str, str], reach: Reach,
                 advertised: str = "") -> None:
        self.job, self.program, self.env, self.reach = job, list(program), dict(env), reach
        self.advertised = advertised  # this host's address as other hosts see it (the relays)
        self.workers: dict[str, Worker] = {}
        self.started = 0
        self._watch = DeathWatch()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        alive = sum(1 for w in self.workers.values() if w.alive)
        return f"<Workers started={self.started} alive={alive}>"

    def statistics(self) -> dict[str, int]:
        return {"started": self.started, "alive": sum(1 for w in self.workers.values() if w.alive),
                "killed": sum(1 for w in self.workers.values() if w.killed)}

    def start(self, host: str, epoch: int, rank: int, extra: Mapping[str, str]) -> Worker:
        """Start a worker on `host` as `rank` of `epoch`, with `extra` added to the job's environment."""
        number = self.started
        name = f"w{number}"
        directory = self.job / name
        directory.mkdir(mode=0o700)
        env = dict(self.env)
        env.update(extra)
        env[LAUNCHER_DIR_VARIABLE] = str(directory)
        local = host in local_names()
        relay = None
        if local:
            proc = subprocess.Popen(self.program, env=env, start_new_session=True, stdin=subprocess.DEVNULL)
        else:
            # where the worker's host reaches this one (the relay's address is all it gets)
            relay = MarkerRelay(directory, self.advertised or address_seen_from([host]))
            env[LAUNCHER_RELAY_VARIABLE] = relay.variable
            env["__cwd__"] = os.getcwd()
            env["__ended__"] = marker_name("ended", number)
            command = shlex.join([sys.executable, "-c", _BOOTSTRAP, _CONTRACT, *self.program])
            proc = subprocess.Popen(self.reach.command(host, command), start_new_session=True,
                                    stdin=subprocess.PIPE)
            assert proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(env) + "\n").encode())
                proc.stdin.close()
            except OSError:  # the command ended at once (the host cannot be reached): seen as its death
                pass
        self.started += 1
        worker = Worker(name, number, host, epoch, rank, proc, directory, local, relay,
                        pid=proc.pid if local else 0)
        with self._lock:
            self.workers[name] = worker
        self._watch.watch(number, proc.pid)
        return worker

    def by_number(self, number: int) -> Worker:
        return next(w for w in self.workers.values() if w.number == number)

    def ended(self) -> list[Worker]:
        """The workers that ended since the last call, first death first."""
        found = []
        for group in self._watch.deaths():
            for number in group:
                worker = self.by_number(number)
                code = worker.proc.wait()
                worker.returncode, worker.ended_at_ns = code, time.monotonic_ns()
                if worker.relay is not None:
                    worker.relay.close()
                found.append(worker)
        return found

    def reported_pid(self, name: str, pid: int) -> None:
        """A remote worker said which pid it runs as (its first question)."""
        worker = self.workers.get(name)
        if worker is not None and not worker.local and not worker.pid:
            worker.pid = pid

    def kill(self, workers: Sequence[Worker]) -> None:
        """SIGKILL `workers` (a remote one on its host too, through mpiexec's way of reaching it)."""
        remote: dict[str, list[int]] = {}
        for worker in workers:
            if not worker.alive:
                continue
            worker.killed = True
            if not worker.local and worker.pid:
                remote.setdefault(worker.host, []).append(worker.pid)
            try:
                os.killpg(worker.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for host, pids in remote.items():
            command = "kill -9 " + " ".join(str(pid) for pid in pids)
            threading.Thread(target=self._run_remote, args=(host, command), daemon=True).start()

    def _run_remote(self, host: str, command: str) -> None:
        try:
            subprocess.run(self.reach.command(host, command), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=_KILL_TIMEOUT_SECONDS, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def signal(self, signum: int) -> None:
        """Send `signum` to every worker still alive (its whole session on this host)."""
        for worker in self.workers.values():
            if worker.alive:
                try:
                    os.killpg(worker.proc.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.alive]

    def close(self) -> None:
        """Kill every worker still alive and wait for them (and their commands) to end."""
        self.kill(self.alive())
        for worker in self.workers.values():
            try:
                worker.proc.wait(timeout=_KILL_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if worker.relay is not None:
                worker.relay.close()
        self._watch.close()
