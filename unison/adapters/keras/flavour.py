"""Which Keras unison's Keras modules serve: Keras 3, or Keras 2 (tf_keras) when ``tf.keras`` is Keras 2.

TensorFlow 2.16 and later bring Keras 3; with ``TF_USE_LEGACY_KERAS=1`` and the ``tf-keras``
package installed, ``tf.keras`` is Keras 2 instead (the ``tf_keras`` package). unison has no flag of
its own: ``unison.tensorflow.keras`` serves whatever ``tf.keras`` is when it is imported, and
``unison.keras`` does the same when Keras 3 runs on the TensorFlow backend (on torch it serves
Keras 3). The optimizer wrapper needs no choice: it looks at the optimizer it is given.

Example:
    >>> tf_keras_is_keras2()   # doctest: +SKIP
    False
"""

from __future__ import annotations

__all__ = ["is_tf_keras_object", "keras_path_is_keras2", "tf_keras_is_keras2"]


def tf_keras_is_keras2() -> bool:
    """True when ``tf.keras`` is Keras 2 (tf_keras); resolves TensorFlow's lazy ``tf.keras``."""
    import tensorflow as tf

    try:
        model_class = tf.keras.Model
    except (ImportError, AttributeError):
        # TF_USE_LEGACY_KERAS=1 without tf-keras installed: TensorFlow has warned; tf.keras is unusable,
        # so the only Keras a script can use is Keras 3.
        return False
    return model_class.__module__.split(".")[0] == "tf_keras"


def keras_path_is_keras2() -> bool:
    """True when ``unison.keras`` serves Keras 2: Keras 3's backend is TensorFlow and tf.keras is Keras 2."""
    import keras

    return keras.backend.backend() == "tensorflow" and tf_keras_is_keras2()


def is_tf_keras_object(obj: object) -> bool:
    """True if `obj`'s class comes from the tf_keras package (Keras 2), without importing it."""
    return any(cls.__module__.split(".")[0] == "tf_keras" for cls in type(obj).__mro__)
