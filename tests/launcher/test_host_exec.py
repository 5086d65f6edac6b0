"""Running a short command on hosts through a launcher program: answers per host, time limit, missing launcher."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from unison.launcher.hosts.reach import HostAnswer, Reach, reach_of, run_on_hosts

pytestmark = pytest.mark.timeout(60)

# Called as mpiexec calls it: LAUNCHER HOST COMMAND. "up" runs the command, "down" fails as a launcher
# does for a host it cannot reach, "slow" never answers.
LAUNCHER = """#!/bin/sh
host="$1"; shift
case "$host" in
  up) exec sh -c "$*" ;;
  down) echo "cannot reach $host" >&2; exit 255 ;;
  slow) exec sleep 30 ;;
  leaves) setsid sleep 8.25 & echo "left one behind" ;;
esac
"""


def _launcher(tmp_path: Path) -> str:
    script = tmp_path / "launcher"
    script.write_text(LAUNCHER)
    script.chmod(0o755)
    return str(script)


def test_each_host_answers_for_itself_in_the_order_asked(tmp_path: Path) -> None:
    reach = Reach(_launcher(tmp_path))
    marker = tmp_path / "ran"
    answers = run_on_hosts(reach, ["down", "up"], f"echo done > {marker}; echo said")
    assert answers == [HostAnswer("down", 255, "cannot reach down"), HostAnswer("up", 0, "said")]
    assert marker.read_text() == "done\n"
    assert answers[0].describe("L down true") == "L down true exited with status 255: cannot reach down"


def test_a_host_past_the_time_limit_is_killed_and_says_so(tmp_path: Path) -> None:
    start = time.monotonic()
    [answer] = run_on_hosts(Reach(_launcher(tmp_path)), ["slow"], "true", timeout_seconds=0.5)
    assert time.monotonic() - start < 10
    assert answer.returncode is None and answer.started and not answer.ok
    assert answer.describe("L slow true") == "L slow true ran past the time limit"


def test_a_launcher_that_leaves_a_process_holding_its_output_answers_at_once(tmp_path: Path) -> None:
    start = time.monotonic()
    [answer] = run_on_hosts(Reach(_launcher(tmp_path)), ["leaves"], "true", timeout_seconds=5)
    subprocess.run(["pkill", "-f", "sleep 8.25"], check=False)
    assert time.monotonic() - start < 4  # its exit is the answer, not the end of its output
    assert answer == HostAnswer("leaves", 0, "left one behind")


def test_a_missing_launcher_is_not_a_host_failure(tmp_path: Path) -> None:
    [answer] = run_on_hosts(Reach(str(tmp_path / "missing")), ["up"], "true")
    assert not answer.started and not answer.ok
    assert answer.describe("M up true").startswith("could not run M up true: ")


def test_reach_follows_the_jobs_launcher() -> None:
    assert Reach("/x/exec").command("h1", "rm -rf /d") == ["/x/exec", "h1", "rm -rf /d"]
    assert Reach().command("h1", "true")[0] == "ssh" and Reach().command("h1", "true")[-2:] == ["h1", "true"]
    assert reach_of("", "") == Reach("", usable=True)
    assert reach_of("", "-launcher slurm") == Reach("", usable=False)
    assert reach_of("", "--mca plm_rsh_agent /x/agent") == Reach("", usable=False)
    assert reach_of("/x/exec", "-launcher-exec=/y") == Reach("/x/exec", usable=True)


def test_the_driver_blacklists_no_host_when_every_host_fails_alike(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from unison.elastic.membership import Epoch, Host
    from unison.launcher.elastic.driver import _unreachable

    alike = tmp_path / "alike"
    alike.write_text('#!/bin/sh\necho "ssh: Could not resolve hostname $1" >&2; exit 255\n')
    alike.chmod(0o755)
    epoch = Epoch(0, (Host("down", 1), Host("other-down", 1)))
    assert _unreachable(epoch, [], Reach(str(alike)), {}) == {}
    assert "none of down, other-down could be reached, all alike" in capsys.readouterr().err
    # One host failing on its own is blamed as before.
    found = _unreachable(Epoch(0, (Host("down", 1), Host("up", 1))), [], Reach(_launcher(tmp_path)), {})
    assert list(found) == ["down"] and "exited with status 255: cannot reach down" in found["down"]
