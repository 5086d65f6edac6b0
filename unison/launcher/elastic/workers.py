"""The elastic driver's worker processes: start one per slot, on this host or another, watch them end, stop them.

Where the survivors of a membership change keep their processes, the driver starts every worker
itself (no mpiexec): on this host as its child, in a session of its own; on another host through
mpiexec's way of reaching it (``--launcher-exec``, else ``ssh``), with the worker's environment sent on
the remote command's standard input (keys never appear on a command line) to a few lines of Python
that set it and become the program. Each worker is named ``w<N>`` and gets its own marker directory
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

from ..._contract import LAUNCHER_DIR_VARIABLE, LAUNCHER_RELAY_VARIABLE
from ..hosts.reach import Reach, local_names
from ..supervision.blame import Markers, read_markers
from ..supervision.deaths import DeathWatch
from ..supervision.relay import MarkerRelay

__all__ = ["Worker", "Workers"]

# Run on the worker's host by this Python: read the environment (one JSON line), become the program.
_BOOTSTRAP = ("import json,os,sys\n"
              "e=json.loads(sys.stdin.readline())\n"
              "d=e.pop('__cwd__','')\n"
              "try:\n os.chdir(d)\nexcept OSError:\n pass\n"
              "n=os.open(os.devnull,os.O_RDONLY);os.dup2(n,0)\n"
              "os.execvpe(sys.argv[1],sys.argv[1:],e)\n")
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
            relay = MarkerRelay(directory, self.advertised)
            env[LAUNCHER_RELAY_VARIABLE] = relay.variable
            env["__cwd__"] = os.getcwd()
            command = shlex.join([sys.executable, "-c", _BOOTSTRAP, *self.program])
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
