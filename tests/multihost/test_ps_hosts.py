"""`unisonrun --pservers` across emulated hosts: servers dealt round robin over the hosts, reached by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unison.testing.hosts import EmulatedHosts, unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(bool(REASON), reason=f"{REASON}; this test runs servers across emulated hosts")]

SCRIPT = """
import json, os, socket, sys
import numpy as np
import unison.ps as ps
# servers run this too; one write per line (print writes the newline apart: under PYTHONUNBUFFERED two
# servers sharing the launcher's stderr can interleave their halves)
sys.stderr.write(f"SEEN {os.environ.get('UNISON_PS_ROLE', '?')} {socket.gethostname()} "
                 f"{os.environ.get('MY_FLAG', '(unset)')}\\n")
client = ps.init()
ps.declare_dense({"w": np.zeros(3, np.float32)}, ps.SGD(1.0))
ps.declare_table("emb", dim=4, capacity=1000)
for step in range(3):
    ps.pull_dense()
    rows = ps.pull_sparse("emb", np.arange(100))
    ps.push(dense={"w": np.ones(3)}, sparse={"emb": (np.arange(100), np.ones((100, 4)))})
stats = ps.server_statistics()
sys.stdout.write("RESULT " + json.dumps({"trainer": client.trainer, "host": socket.gethostname(),
                                         "endpoints": list(client.endpoints), "w": ps.pull_dense()["w"].tolist(),
                                         "trainer_hosts": [sorted(t["host"] for t in s["trainers"].values()) for s in stats],
                                         "rows": [s["tables"]["emb"]["rows"] for s in stats]}) + "\\n")
sys.stdout.flush()
ps.shutdown()
"""


def test_servers_are_placed_round_robin_on_the_hosts_and_reached_by_name(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # synchronous: every trainer's steps reach every server before the statistics are read
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}, "UNISON_PS_MODE": "sync"}
    with EmulatedHosts(hosts=2, slots=1) as cluster:
        done = cluster.run([sys.executable, str(script)], env=env, timeout=150,
                           unisonrun_args=["--pservers", "3", "-x", "MY_FLAG=a b 'c' $HOME"])
    results = sorted((json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
                      if line.startswith("RESULT ")), key=lambda r: r["trainer"])
    assert done.returncode == 0 and len(results) == 2, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert [r["host"] for r in results] == ["h0", "h1"]
    for r in results:
        # each namespace has its own network: h1:PORT reaches only a server running in h1
        assert [e.rpartition(":")[0] for e in r["endpoints"]] == ["h0", "h1", "h0"]
        assert r["endpoints"] == results[0]["endpoints"]
        assert r["trainer_hosts"] == [["h0", "h1"]] * 3  # both trainers reached every server
        assert sum(r["rows"]) == 100
    assert results[0]["w"] == results[1]["w"] == [-3.0] * 3  # 3 steps of the average gradient, one each
    assert "returned on a server" not in done.stderr
    # the -x pair reached every server, the one on h1 through its launcher's standard input, unexpanded
    seen = sorted(line for line in done.stderr.splitlines() if line.startswith("SEEN"))
    assert seen == sorted(["SEEN server h0 a b 'c' $HOME"] * 2 + ["SEEN server h1 a b 'c' $HOME"]
                          + [f"SEEN trainer h{i} a b 'c' $HOME" for i in range(2)]), done.stderr[-3000:]


FAILING = """
import numpy as np
import unison.ps as ps
client = ps.init()
ps.declare_dense({"w": np.zeros(3, np.float32)})
raise SystemExit(f"trainer {client.trainer} fails before it finishes")
"""


def test_servers_on_other_hosts_are_stopped_when_the_trainers_fail(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAILING)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNISON_")}
    with EmulatedHosts(hosts=2, slots=1) as cluster:
        done = cluster.run([sys.executable, str(script)], env=env, timeout=150, unisonrun_args=["--pservers", "2"])
        # the servers wait for trainers that never finish; unisonrun stops them, the one on h1 by
        # closing its launcher's input
        left = subprocess.run(["ip", "netns", "pids", cluster.namespaces[1]], capture_output=True, text=True,
                              timeout=30).stdout.split()
    assert done.returncode != 0 and "trainer 1 fails before it finishes" in done.stderr, done.stderr[-3000:]
    assert left == []
