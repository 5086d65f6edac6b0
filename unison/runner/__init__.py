"""``horovod.runner``: `run`, which starts a function on every rank (`unison.run`)."""

from ..launcher import run

__all__ = ["run"]
