"""Functions that tests run on several ranks through unison.run (importable by name)."""

import numpy as np


def total_of_ranks(scale: float) -> tuple[int, float]:
    import unison

    unison.init()
    total = unison.allreduce(np.full(2, unison.rank() + 1.0) * scale, op=unison.Sum, name="sum")
    return unison.rank(), float(total[0])


def fail_on_rank_1() -> None:
    import unison

    unison.init()
    if unison.rank() == 1:
        raise KeyError("missing key on rank 1")
    unison.allreduce(np.ones(2), name="never.completes")


def sleep_in_a_loop() -> None:
    import time

    import unison

    unison.init()
    for _ in range(600):
        time.sleep(0.1)
