"""What the Keras 3 and Keras 2 (tf_keras) DistributedOptimizers share, importing neither Keras.

The two wrappers differ in how they hook into their Keras (variables, slots, tracking), not in what
they tell the user about XLA or in how a partial synchronization averages a slice of variables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..._job.gradients import GradientPolicy, gradient_group_name
from ...compression._exchange import average_slices_
from .naming import Shaped, variable_keys

__all__ = ["JIT_WARNING", "XLA_ERROR", "partial_averager", "tf_in_xla_context"]

JIT_WARNING = (
    "unison: the model was compiled with jit_compile=True, but the gradient allreduce cannot run "
    "inside an XLA-compiled step; switching this model to jit_compile=False. Pass "
    "jit_compile=False to model.compile() to silence this warning."
)
XLA_ERROR = (
    "unison's DistributedOptimizer cannot apply gradients inside an XLA-compiled function "
    "(tf.function(jit_compile=True) or model.compile(jit_compile=True) on an already built optimizer): "
    "the cross-rank reduction runs in Python. Compile the step with jit_compile=False."
)


def tf_in_xla_context() -> bool:
    """True while TensorFlow traces a graph inside an XLA-compiled function (never when eager)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def partial_averager(policy: GradientPolicy, variables: Sequence[Shaped]) -> Callable[..., list[np.ndarray]]:
    """The function that averages this step's slice of `variables` across the ranks: it takes their
    values as arrays and returns the averaged copies, in order (partial synchronization)."""
    group = gradient_group_name(variable_keys(list(variables)))

    def average(*arrays: np.ndarray) -> list[np.ndarray]:
        copies = [np.array(a, copy=True, order="C") for a in arrays]
        average_slices_(policy.compression, copies, group, policy.process_set)
        return copies

    return average
