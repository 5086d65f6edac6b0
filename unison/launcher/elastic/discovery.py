"""The elastic driver's view of the hosts: poll the discovery script in a thread, wait for enough slots.

`Discovery` runs the discovery script every ``--discovery-interval`` seconds (or stands for fixed
hosts, ``-H`` with ``--min-np``) and keeps its last good answer; `wait_for_hosts` asks the membership
(pure) what to launch next and waits, up to ``--elastic-timeout``, while it answers `Wait`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ...elastic.membership import Epoch, Host, Membership, Stop, Wait, parse_discovery
from ...errors import LaunchError

__all__ = ["Discovery", "say", "wait_for_hosts"]


def say(message: str) -> None:
    """One line of the elastic driver's log (stderr)."""
    print(f"unisonrun: elastic: {message}", file=sys.stderr, flush=True)


class Discovery:
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

    def __repr__(self) -> str:
        return f"<Discovery polls={self.polls} hosts={self.hosts}>"

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
                say(f"{exc} (keeping the hosts it printed last)")
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


def wait_for_hosts(elastic_timeout: float, timeout_source: str, discovery_interval: float,
                   membership: Membership, discovery: Discovery, lock: threading.Lock,
                   on_wait: Callable[[str], None]) -> Epoch | Stop:
    """The next epoch, once discovery offers --min-np slots; a Stop after --elastic-timeout."""
    deadline = time.monotonic() + elastic_timeout
    said = ""
    while True:
        with lock:
            decision = membership.plan(discovery.hosts or (), time.monotonic())
        if not isinstance(decision, Wait):
            return decision
        if time.monotonic() >= deadline:
            return Stop(f"waited {elastic_timeout:g} s ({timeout_source}) for hosts: {decision.message}. "
                        "Add hosts, or lower --min-np.")
        if decision.message != said:
            said = decision.message
            say(f"waiting for hosts: {decision.message}")
            on_wait(decision.message)
        discovery.changed.clear()
        discovery.changed.wait(min(discovery_interval, max(0.0, deadline - time.monotonic())) + 0.01)
