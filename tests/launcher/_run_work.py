"""A function that tests run on several ranks through unison.run with horovod.run's arguments."""

import os


def rank_size_and_start_timeout() -> tuple[int, int, str]:
    import unison

    unison.init()
    return unison.rank(), unison.size(), os.environ.get("UNISON_START_TIMEOUT_SECONDS", "")


def horovod_variables() -> dict[str, str]:
    """The HOROVOD_* variables this rank was started with."""
    return {name: value for name, value in os.environ.items() if name.startswith("HOROVOD_")}
