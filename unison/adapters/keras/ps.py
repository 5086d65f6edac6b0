"""Keras 3 on parameter servers: an embedding layer whose table is held by the servers.

`DistributedEmbedding` stands in for ``keras.layers.Embedding``: its forward pulls only the rows of
the batch's unique ids, and its backward pushes only their gradients to the servers, which apply the
table's optimizer. The layer's one Keras weight is a scalar that is always zero: reading it puts the
lookup on the gradient tape, so ``model.fit``'s backward reaches the layer's gradient function
(``tf.custom_gradient``), which does the push. The pull and the push are ``tf.py_function`` calls, so
the layer runs in ``model.fit`` in graph mode as well as with ``run_eagerly=True``; it opts out of XLA
(``supports_jit = False``). Dense layers are trained by the model's own Keras optimizer, or on the
servers by `ServerOptimizer`, which then sends the layer's rows in its own push (one push per step).

Example:
    >>> import keras, unison.ps as ps, unison.ps.keras as psk                     # doctest: +SKIP
    >>> ps.init()                                                               # doctest: +SKIP
    >>> model = keras.Sequential([psk.DistributedEmbedding("ads", 1_000_000, 16, optimizer=ps.Adagrad(0.05)),
    ...                           keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])  # doctest: +SKIP
    >>> model.compile(optimizer=psk.ServerOptimizer(ps.Adam(0.001)), loss="mse")  # doctest: +SKIP
    >>> model.fit(ids, labels)                                                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import MissingDependencyError
from ...ps import _api
from ...ps.client import Client
from ...ps.optim import Optimizer
from ...ps.table import Initializer
from .ps_optimizer import ServerOptimizer, check_backend, register_embedding

try:
    import keras
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - keras is optional
    raise MissingDependencyError("unison.ps.keras needs Keras 3 on TensorFlow: `pip install tensorflow keras` "
                                 f"(importing them failed: {exc}).") from exc

__all__ = ["DistributedEmbedding", "ServerOptimizer"]


class _KeptRows:
    """Backward passes' (ids, rows) kept for a `ServerOptimizer`; a plain object, so Keras does not track them."""

    def __init__(self) -> None:
        self.deferred = False
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []


class DistributedEmbedding(keras.layers.Layer):
    """An embedding table that lives on the parameter servers, looked up like ``keras.layers.Embedding``.

    Each backward pass pushes the gradients of the rows it looked up (one push per layer per
    step), so every trainer of a synchronous job must call the layer the same number of times per
    step. The servers apply ``optimizer`` to the rows; the model's Keras optimizer never sees them.
    Under a `ServerOptimizer` the layer hands the rows over instead, and the optimizer pushes them
    with the dense gradients: one push per step, however many times the layer ran.

    Args:
        table: the table's name on the servers (the same on every trainer).
        input_dim: the table's capacity: the most distinct ids it holds (ids are any int64).
        output_dim: the width of a row.
        initializer: how rows start (default: uniform in [-0.05, 0.05)).
        optimizer: applied by the servers to this table's rows (default: SGD).
        mask_zero: treat id 0 as padding, as ``keras.layers.Embedding`` does: the layer gives the mask
            ``ids != 0`` to the layers after it (which must support masking), so padding does not
            count in their results, and its row gets a zero gradient. Id 0 is then not a row to
            train; `input_dim` counts it as one all the same.
        client: the connection to use (default: the one `unison.ps.init` made).
        **kwargs: Keras layer arguments (``name``, ``dtype`` ...).

    Example:
        >>> emb = DistributedEmbedding("users", 100_000, 8, optimizer=ps.SGD(0.1))   # doctest: +SKIP
        >>> emb(np.array([[3, 7], [7, 9]])).shape                                   # doctest: +SKIP
        TensorShape([2, 2, 8])
    """

    def __init__(self, table: str, input_dim: int, output_dim: int, *, initializer: Initializer | None = None,
                 optimizer: Optimizer | None = None, mask_zero: bool = False, client: Client | None = None,
                 **kwargs: object) -> None:
        check_backend("unison.ps.keras.DistributedEmbedding")
        super().__init__(**kwargs)
        if int(input_dim) < 1 or int(output_dim) < 1:
            raise ValueError(f"input_dim and output_dim must be at least 1. Got input_dim={input_dim}, "
                             f"output_dim={output_dim}.")
        self.table, self.input_dim, self.output_dim = table, int(input_dim), int(output_dim)
        self._client = client
        self._initializer, self._optimizer = initializer, optimizer
        self._declared = False
        self._kept = _KeptRows()
        self.mask_zero = bool(mask_zero)
        self.supports_masking = self.mask_zero
        self.supports_jit = False  # the pull and push are Python calls
        self._counts = {"pulls": 0, "pushes": 0, "rows_pulled": 0, "rows_pushed": 0}

    def __repr__(self) -> str:
        return (f"<DistributedEmbedding {self.table!r} {self.input_dim}x{self.output_dim} "
                f"pulls={self._counts['pulls']} pushes={self._counts['pushes']}>")

    @property
    def client(self) -> Client:
        return self._client or _api.client()

    def statistics(self) -> dict[str, int]:
        """This layer's pulls, pushes, and rows moved by them."""
        return dict(self._counts)

    def build(self, input_shape: tuple[int | None, ...] | None = None) -> None:
        # always zero; its gradient is zero too: it only makes the tape record the lookup
        self._anchor = self.add_weight(name="gradient_anchor", shape=(), initializer="zeros", trainable=True)
        register_embedding(self._anchor, self)
        self.built = True

    def compute_mask(self, inputs: tf.Tensor, mask: tf.Tensor | None = None) -> tf.Tensor | None:
        """``inputs != 0`` with `mask_zero`, else no mask (as ``keras.layers.Embedding``)."""
        if not self.mask_zero:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        return (*tuple(input_shape), self.output_dim)

    def _declare(self) -> None:
        if not self._declared:
            self.client.declare_table(self.table, self.output_dim, self.input_dim,
                                      initializer=self._initializer, optimizer=self._optimizer)
            self._declared = True

    def _pull(self, unique: tf.Tensor) -> np.ndarray:
        self._declare()
        ids = np.asarray(unique.numpy(), dtype=np.int64)
        rows = self.client.pull(sparse={self.table: ids})[1][self.table]
        self._counts["pulls"] += 1
        self._counts["rows_pulled"] += len(ids)
        return np.asarray(rows, dtype=np.float32).reshape(len(ids), self.output_dim)

    def defer_pushes(self) -> None:
        """Keep each backward pass's rows for `take_gradients` instead of pushing them (a `ServerOptimizer` does)."""
        self._kept.deferred = True

    def take_gradients(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The (ids, gradient rows) kept since the last call, or None when there are none."""
        parts, self._kept.parts = self._kept.parts, []
        if not parts:
            return None
        return np.concatenate([i for i, _ in parts]), np.concatenate([r for _, r in parts])

    def _push(self, unique: tf.Tensor, grad: tf.Tensor) -> np.ndarray:
        ids = np.asarray(unique.numpy(), dtype=np.int64)
        rows = np.asarray(grad.numpy(), dtype=np.float32).reshape(len(ids), self.output_dim)
        if self._kept.deferred:
            self._kept.parts.append((ids, rows))
        else:
            self.client.push(sparse={self.table: (ids, rows)})
        self._counts["pushes"] += 1
        self._counts["rows_pushed"] += len(ids)
        return np.zeros((), np.float32)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        ids = tf.cast(inputs, tf.int64)
        unique, inverse = tf.unique(tf.reshape(ids, [-1]))
        dim = self.output_dim

        @tf.custom_gradient
        def lookup(anchor: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
            rows = tf.py_function(self._pull, [unique], tf.float32)
            rows.set_shape([None, dim])

            def grad(dy: tf.Tensor) -> tf.Tensor:
                # the zero returned depends on the push, so graph mode cannot prune it
                return tf.py_function(self._push, [unique, tf.convert_to_tensor(dy)], tf.float32)

            return rows + anchor, grad

        rows = lookup(tf.convert_to_tensor(self._anchor))
        out = tf.gather(rows, inverse)
        return tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], 0))

    def get_config(self) -> dict[str, object]:
        config = super().get_config()
        config.update(table=self.table, input_dim=self.input_dim, output_dim=self.output_dim,
                      mask_zero=self.mask_zero)
        return config
