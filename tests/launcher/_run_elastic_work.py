"""An elastic training function that tests run through unison.run, written as in Horovod's elastic examples."""

from __future__ import annotations

import os
from pathlib import Path


def elastic_steps(steps: int, fail_once: str = "") -> dict[str, object]:
    """Sum each rank's (step + 1) over `steps` committed steps; return what the state went through.

    With `fail_once` (a file path), rank 1 raises before committing step 2 if that file does not exist
    yet, creating it, so only the first launch fails. It raises once rank 0 has committed step 1 too
    (rank 0 says so in a file beside it): the failure ends the launch, and a rank killed before its
    commit would go on from the one before, as it should, but not as the tests expect.
    """
    import time

    import torch

    import unison.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, total=0.0, history=[])

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> None:
        while state.step < steps:
            if fail_once and hvd.rank() == 1 and state.step == 2 and not os.path.exists(fail_once):
                deadline = time.monotonic() + 60
                while not os.path.exists(fail_once + ".rank0-at-2") and time.monotonic() < deadline:
                    time.sleep(0.01)
                Path(fail_once).touch()
                raise RuntimeError("rank 1 fails once, at step 2")
            summed = hvd.allreduce(torch.tensor([float(state.step + 1)]), op=hvd.Sum)
            state.total += float(summed[0])
            state.history.append((state.step, hvd.size()))
            state.step += 1
            state.commit()
            if fail_once and hvd.rank() == 0 and state.step == 2:
                Path(fail_once + ".rank0-at-2").touch()

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "total": state.total, "history": state.history}
