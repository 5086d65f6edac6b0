"""A Keras 3 optimizer whose updates the parameter servers apply: the model's dense variables live there.

`ServerOptimizer` is what ``model.compile(optimizer=...)`` takes. At its first step (Keras builds it
before the first batch of ``model.fit``) it declares the model's trainable variables on the servers,
trainer 0's values starting them, and assigns the servers' values to every trainer's variables. Each
step then sends the gradients to the servers in one push, pulls the updated values and assigns them to
the Keras variables. Both calls run in a ``tf.py_function``, so the optimizer works in ``model.fit``'s
traced ``train_step`` as well as with ``run_eagerly=True``.

A `DistributedEmbedding` layer's own weight (its zero scalar) is not declared: the layer keeps its
table. Under this optimizer the layer hands its rows' gradients over instead of pushing them itself,
and the optimizer sends them in the same push as the dense gradients: one push per step.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ...errors import ConfigError, InvalidArgumentError
from ...ps import _api
from ...ps.client import Client
from ...ps.optim import Optimizer, from_fields

try:
    import keras
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - keras is optional
    from ...errors import MissingDependencyError

    raise MissingDependencyError("unison.ps.keras needs Keras 3 on TensorFlow: `pip install tensorflow keras` "
                                 f"(importing them failed: {exc}).") from exc

__all__ = ["ServerOptimizer", "check_backend", "register_embedding"]

log = logging.getLogger(__name__)


class _Embedding(Protocol):
    """What the optimizer needs of a `DistributedEmbedding`: hand its gradients over instead of pushing them."""

    table: str

    def defer_pushes(self) -> None: ...

    def take_gradients(self) -> tuple[np.ndarray, np.ndarray] | None: ...


# the anchor variable of each built DistributedEmbedding, by id, so the optimizer can tell them apart
_EMBEDDINGS: weakref.WeakValueDictionary[int, _Embedding] = weakref.WeakValueDictionary()


def register_embedding(anchor: keras.Variable, layer: _Embedding) -> None:
    """Record that `anchor` is the weight of an embedding layer, not a dense parameter."""
    _EMBEDDINGS[id(anchor)] = layer


def check_backend(what: str) -> None:
    """Raise `ConfigError` unless Keras runs on TensorFlow, which `tf.py_function` and `tf.custom_gradient` need."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ConfigError(f"{what} needs Keras's TensorFlow backend; this process runs Keras on {backend!r}. "
                          "Set KERAS_BACKEND=tensorflow before keras is first imported (or \"backend\": "
                          "\"tensorflow\" in ~/.keras/keras.json).")


def _in_xla() -> bool:
    """Whether the graph being traced is compiled by XLA, which cannot call Python."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without the helper: let XLA report it
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


@dataclasses.dataclass
class _Declared:
    """What the first step declared: the dense variables by id, their names on the servers and shapes."""

    names: dict[int, str] = dataclasses.field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    paths: dict[str, str] = dataclasses.field(default_factory=dict)  # variable path -> name on the servers
    embeddings: list[_Embedding] = dataclasses.field(default_factory=list)
    anchors: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Counters:
    """The optimizer's counters (a plain object: Keras would track a dict attribute)."""

    steps: int = 0
    variables: int = 0
    elements: int = 0
    rows_pushed: int = 0
    seconds: float = 0.0


@keras.saving.register_keras_serializable(package="unison.ps")
class ServerOptimizer(keras.optimizers.Optimizer):
    """A Keras optimizer that trains the model's dense variables on the parameter servers.

    Pass it to ``model.compile`` as any Keras optimizer. The update rule is `optimizer`, a
    `unison.ps` optimizer (`SGD`, `Momentum`, `Adagrad`, `Adam`) that the servers apply, as with
    TensorFlow's ParameterServerStrategy, where every variable lives on the servers. Keras's
    own options (clipping, weight decay, EMA, gradient accumulation, learning-rate schedules) are not
    taken: the update happens on the servers, and changing this object's ``learning_rate`` changes
    nothing there.

    Each dense variable is declared as ``"<name>/<variable path>"`` (``name`` is this optimizer's
    Keras name), so every trainer must build the same model with the same layer names, as the same
    script does. In synchronous mode every trainer's step waits for the others' gradients of that
    step, and the servers apply their average. XLA cannot call Python: compile with
    ``jit_compile=False`` where Keras would choose XLA (``"auto"`` on a GPU, for a model without a
    `DistributedEmbedding`).

    Args:
        optimizer: the update rule the servers apply to the dense variables (default: ``SGD(0.01)``).
        client: the connection to use (default: the one `unison.ps.init` made).
        name: the Keras name, also the prefix of the variables' names on the servers.

    Raises:
        ConfigError: Keras runs on a backend other than TensorFlow.
        InvalidArgumentError: `optimizer` is not a `unison.ps` optimizer.

    Example:
        >>> import keras, unison.ps as ps, unison.ps.keras as psk                    # doctest: +SKIP
        >>> ps.init()                                                              # doctest: +SKIP
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
        ...                           keras.layers.Dense(1)])                      # doctest: +SKIP
        >>> model.compile(optimizer=psk.ServerOptimizer(ps.Adam(0.001)), loss="mse")  # doctest: +SKIP
        >>> model.fit(x, y, batch_size=64)         # the servers apply Adam        # doctest: +SKIP
        >>> ps.shutdown()                                                          # doctest: +SKIP
    """

    def __init__(self, optimizer: Optimizer | None = None, *, client: Client | None = None,
                 name: str | None = None) -> None:
        check_backend("unison.ps.keras.ServerOptimizer")
        if optimizer is None:
            optimizer = from_fields("sgd", {"learning_rate": 0.01})
        if not isinstance(optimizer, Optimizer):
            raise InvalidArgumentError(
                "optimizer must be a unison.ps optimizer (ps.SGD, ps.Momentum, ps.Adagrad or ps.Adam), which the "
                f"servers apply. Got {type(optimizer).__name__}: {optimizer!r}. For a Keras optimizer trained "
                "on each trainer, compile with it directly instead of ServerOptimizer.")
        super().__init__(learning_rate=float(optimizer.learning_rate), name=name)
        self.server_optimizer = optimizer
        self._client = client
        self._declared = _Declared()
        self._counts = _Counters()

    def __repr__(self) -> str:
        return (f"<ServerOptimizer {self.name!r} {self.server_optimizer} {'built' if self.built else 'not built'} "
                f"variables={len(self._declared.names)} embeddings={len(self._declared.embeddings)} "
                f"steps={self._counts.steps}>")

    @property
    def client(self) -> Client:
        return self._client or _api.client()

    def statistics(self) -> dict[str, float]:
        """Steps pushed, variables and elements declared, table rows pushed for the layers, and seconds in calls."""
        return dataclasses.asdict(self._counts)

    def get_config(self) -> dict[str, object]:
        return {"name": self.name, "optimizer": {"kind": self.server_optimizer.kind,
                                                 "fields": self.server_optimizer.fields()}}

    @classmethod
    def from_config(cls, config: dict[str, Any],  # Keras's config: nested JSON values
                    custom_objects: dict[str, object] | None = None) -> ServerOptimizer:
        spec = config["optimizer"]
        return cls(from_fields(spec["kind"], dict(spec["fields"])), name=config.get("name"))

    # ---- the first step

    def build(self, variables: Sequence[keras.Variable]) -> None:
        """Declare the dense `variables` on the servers and assign their values (trainer 0's) to them.

        Keras calls this while tracing ``model.fit``'s first step; the declaration runs outside the
        graph (``tf.init_scope``), before the first step runs.
        """
        if self.built:
            return
        variables = list(variables)
        # Keras builds it while tracing the first train step: lift the declaration out of the graph
        with tf.init_scope():
            if not tf.executing_eagerly():
                raise InvalidArgumentError(
                    f"ServerOptimizer {self.name!r} must be built eagerly: it declares the variables on the servers "
                    "and assigns their values before the first step. Call optimizer.build(model.trainable_variables) "
                    "outside any tf.Graph.")
            declared = self._declare(variables)
        super().build(variables)
        self._declared = declared

    def _declare(self, variables: list[keras.Variable]) -> _Declared:
        declared = _Declared()
        values: dict[str, np.ndarray] = {}
        for v in variables:
            layer = _EMBEDDINGS.get(id(v))
            if layer is not None:
                layer.defer_pushes()
                declared.anchors.add(id(v))
                if all(e is not layer for e in declared.embeddings):
                    declared.embeddings.append(layer)
                continue
            if not np.issubdtype(np.dtype(keras.backend.standardize_dtype(v.dtype)), np.floating):
                raise InvalidArgumentError(f"ServerOptimizer trains floating-point variables; {v.path!r} has dtype "
                                           f"{v.dtype}. Make it non-trainable.")
            name = f"{self.name}/{v.path}"
            if name in declared.shapes:
                raise InvalidArgumentError(
                    f"two trainable variables have the path {v.path!r}, so they would share one name on the "
                    "parameter servers. Give their layers distinct names.")
            declared.names[id(v)] = name
            declared.shapes[name] = tuple(int(d) for d in v.shape)
            declared.paths[v.path] = name
            values[name] = np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float32)
        started = time.perf_counter()
        if values:
            self.client.declare_dense(values, self.server_optimizer)
            pulled = self.client.pull_dense(list(values))
            for v in variables:
                if id(v) in declared.names:
                    v.assign(pulled[declared.names[id(v)]].astype(np.dtype(v.dtype)))
        self._counts.variables = len(values)
        self._counts.elements = sum(a.size for a in values.values())
        self._counts.seconds += time.perf_counter() - started
        return declared

    def _check_known(self, variables: Sequence[keras.Variable]) -> None:
        declared = self._declared
        for v in variables:
            if id(v) in declared.names or id(v) in declared.anchors:
                continue
            shape = tuple(int(d) for d in v.shape)
            name = declared.paths.get(v.path)
            if name is not None and declared.shapes[name] != shape:
                raise InvalidArgumentError(
                    f"variable {v.path!r} had shape {declared.shapes[name]} when ServerOptimizer {self.name!r} "
                    f"declared it on the parameter servers; now it has shape {shape}. The servers hold the first "
                    "shape: keep the model's shapes fixed while training, or compile with a new ServerOptimizer "
                    "(another name) to declare the new ones.")
            raise InvalidArgumentError(
                f"variable {v.path!r} (shape {shape}) was created after ServerOptimizer {self.name!r} declared the "
                f"model's {len(declared.names)} dense variables on the parameter servers at its first step, so the "
                "servers do not hold it. Create every layer before the first step (build the model before fit), "
                "or compile with a new ServerOptimizer to declare the new variables.")

    # ---- every step

    def apply(self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None],
              trainable_variables: Sequence[keras.Variable] | None = None) -> None:
        """Push the gradients (and the embedding layers' rows) to the servers; assign the values pulled back."""
        if trainable_variables is None:
            if not self.built:
                raise InvalidArgumentError(f"ServerOptimizer {self.name!r} is not built: pass trainable_variables "
                                           "with the gradients, or call build(variables) first.")
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                if tf.executing_eagerly():
                    # Keras builds an eager step's optimizer after its forward pass: too late for it to have
                    # used the servers' values (and for the embedding layers to hand their rows over)
                    raise InvalidArgumentError(
                        f"ServerOptimizer {self.name!r} must be built before the first step when the step runs "
                        "eagerly (run_eagerly=True or a custom loop): its forward pass has already used this "
                        "trainer's own starting values, not the servers'. Call "
                        "optimizer.build(model.trainable_variables) after compile, before fit.")
                self.build(variables)
        grads = list(grads)
        if len(grads) != len(variables):
            raise InvalidArgumentError(f"apply needs one gradient per variable. Got {len(grads)} gradients for "
                                       f"{len(variables)} variables.")
        self._check_known(variables)
        if _in_xla():
            raise InvalidArgumentError(
                f"ServerOptimizer {self.name!r} calls the parameter servers from Python (tf.py_function), which "
                "XLA cannot compile. Compile the model with jit_compile=False.")
        dense = [(g, v) for g, v in zip(grads, variables) if id(v) in self._declared.names]
        inputs = [tf.zeros(v.shape, tf.float32) if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32)
                  for g, v in dense]
        # the layers' zero gradients: the step waits for their backward passes, which hand over the rows
        inputs += [tf.convert_to_tensor(g) for g, v in zip(grads, variables)
                   if id(v) in self._declared.anchors and g is not None]
        names = [self._declared.names[id(v)] for _, v in dense]
        outputs = tf.py_function(lambda *t: self._step(names, t), inputs, [tf.float32] * len(dense) + [tf.int64])
        for value, (_, v) in zip(outputs, dense):
            v.assign(tf.cast(tf.reshape(value, v.shape), v.dtype))
        with tf.control_dependencies([outputs[-1]]):
            self._iterations.assign_add(1)

    def _step(self, names: list[str], tensors: Sequence[tf.Tensor]) -> list[np.ndarray]:
        started = time.perf_counter()
        dense = {name: np.asarray(t.numpy(), np.float32) for name, t in zip(names, tensors)}
        pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for layer in self._declared.embeddings:
            taken = layer.take_gradients()
            if taken is not None:
                pieces.setdefault(layer.table, []).append(taken)
        sparse = {table: (np.concatenate([i for i, _ in parts]), np.concatenate([r for _, r in parts]))
                  for table, parts in pieces.items()}
        try:
            self.client.push(dense=dense, sparse=sparse)
            values = self.client.pull_dense(names) if names else {}
        except Exception as exc:
            # in graph mode TensorFlow re-raises it as its own error, the text deep in a traceback: say it plainly
            log.error("ServerOptimizer %r: step %d failed: %s: %s", self.name, self._counts.steps + 1,
                      type(exc).__name__, exc)
            raise
        self._counts.steps += 1
        self._counts.rows_pushed += sum(len(ids) for ids, _ in sparse.values())
        self._counts.seconds += time.perf_counter() - started
        return [values[n] for n in names] + [np.int64(self._counts.steps)]
