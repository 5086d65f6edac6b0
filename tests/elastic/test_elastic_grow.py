"""A job that starts on one rank and grows, its torch DistributedOptimizer built once, at size 1.

The first worker keeps its process when the second host arrives, so the optimizer it built at size 1
must reduce the gradients at size 2 (Horovod registers its hooks in every elastic job for this).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from ._harness import HOSTS, run

pytestmark = [pytest.mark.long_jobs, pytest.mark.timeout(150)]

PROGRAM = """\
import json, os, time
from pathlib import Path
import torch
import unison.torch as hvd
hvd.init()
out = Path(os.environ["ELASTIC_OUT"])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0)

@hvd.elastic.run
def train(state):
    while state.step < 40:
        x = torch.full((2, 4), float(hvd.rank() + 1))  # each rank its own data: only the average agrees
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        state.step += 1
        state.commit()
        if hvd.rank() == 0:
            (out / "progress.tmp").write_text(f"{state.step} {hvd.size()}")
            os.replace(out / "progress.tmp", out / "progress")
        time.sleep(0.05)

train(state)
(out / f"result-{hvd.rank()}.json").write_text(json.dumps({"size": hvd.size(), "weight": model.weight.tolist()}))
"""


def test_a_job_started_on_one_rank_grows_and_reduces_with_the_optimizer_it_built(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)

    def schedule(steps: int, size: int) -> Sequence[str] | None:
        return HOSTS[:2] if steps >= 5 else None

    job = run(tmp_path, HOSTS[:1], ["-np", "1", "--min-np", "1", "--max-np", "2",
                                    "--elastic-timeout", "20"], schedule=schedule, program=str(program),
              env={"UNISON_START_TIMEOUT_SECONDS": "20"}, timeout=100)
    assert job.returncode == 0, job.stderr
    assert "epoch 1: 2 ranks on" in job.stderr and "failed" not in job.stderr, job.stderr
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result-*.json"))]
    assert [r["size"] for r in results] == [2, 2]
    assert results[0]["weight"] == results[1]["weight"]  # the same average on both ranks
