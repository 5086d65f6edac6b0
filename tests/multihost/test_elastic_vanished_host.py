"""An elastic job whose discovery script keeps listing a host that has vanished (emulated hosts).

h1's network namespace is gone before the job starts, but discovery lists h0, h1, h2 throughout. The
first launch fails inside mpiexec (its launcher cannot start Hydra's proxy on h1, so no rank is ever
named); the driver must find h1 unreachable, blacklist it and go on with h0 and h2, instead of
relaunching onto h1 until --reset-limit stops the job.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from elastic._harness import check_committed, run

from unison.testing.hosts import EmulatedHosts, _remove_namespace, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(bool(REASON), reason=f"{REASON}; this test runs a job across emulated hosts")]


@pytest.mark.parametrize(("cooldown", "duration"), [
    ([], "for good"),
    (["--blacklist-cooldown-range", "600", "600"],
     r"for 600\.0 s \(failure 1 of this host; --blacklist-cooldown-range backs off\)"),
])
def test_a_listed_but_vanished_host_is_blacklisted_not_relaunched_onto(
        tmp_path: Path, cooldown: list[str], duration: str) -> None:
    with EmulatedHosts(hosts=3, slots=1) as cluster:
        _remove_namespace(cluster.namespaces[1])
        job = run(tmp_path, ["h0", "h1", "h2"],
                  ["-np", "2", "--min-np", "2", "--reset-limit", "1", *cooldown,
                   "--launcher-exec", cluster.launcher_exec, "--iface", "eth0"],
                  env={"ELASTIC_SAMPLES": "12"}, timeout=120, wrap=lambda cmd: cluster.exec_command(0, cmd))
    check_committed(job, samples=12, epochs=2, size=2)
    assert "epoch 0: 3 ranks on h0:1,h1:1,h2:1" in job.stderr, job.stderr
    assert re.search(rf"epoch 0 failed \(exit status \d+\); blacklisting h1 {duration} \(unreachable: "
                     r"\S*launcher-exec h1 true exited with status \d+: Cannot open network namespace",
                     job.stderr), job.stderr
    assert "blacklisting h0" not in job.stderr and "blacklisting h2" not in job.stderr
    assert job.stderr.rstrip().splitlines()[-1].endswith("epoch 1: 2 ranks on h0:1,h2:1"), job.stderr
    assert {r["epoch"] for r in job.results} == {1}
