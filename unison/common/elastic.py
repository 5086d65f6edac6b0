"""``horovod.common.elastic``: the framework-neutral elastic states and ``run_fn``."""

from ..elastic._state import ObjectState, State, run_fn

__all__ = ["ObjectState", "State", "run_fn"]
