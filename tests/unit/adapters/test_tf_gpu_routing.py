"""TensorFlow GPU tensors: which collectives take the GPU data plane, the host fallbacks' reasons, the DLPack handoff."""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

from unison.adapters.tensorflow import _bridge, _gpu  # noqa: E402
from unison.adapters.tensorflow import collectives as tfc  # noqa: E402
from unison.errors import MissingDependencyError  # noqa: E402

GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"


def route(devices: list[str], dtypes: list[str], **kw: Any) -> _gpu.Route:
    args = {"eager": True, "device_path": True, "built_with_cuda": True, "op_name": "HorovodAllreduce"}
    args.update(kw)
    return _gpu.choose_route(devices, dtypes, **args)


# -- the decision -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("device", "ordinal"), [
    (GPU0, 0), ("/job:worker/replica:0/task:1/device:GPU:3", 3), ("GPU:2", 2), ("/device:gpu:1", 1),
    (CPU0, None), ("", None), ("/job:localhost/replica:0/task:0/device:XLA_GPU:0", None),
])
def test_gpu_ordinal_reads_the_device_string(device: str, ordinal: int | None) -> None:
    assert _gpu.gpu_ordinal(device) == ordinal


@pytest.mark.parametrize("dtype", sorted(_gpu.DEVICE_DTYPES))
def test_eager_gpu_tensors_of_carried_dtypes_go_to_the_device(dtype: str) -> None:
    assert route([GPU0, GPU0], [dtype, dtype]) == _gpu.Route("cuda")


def test_cpu_tensors_stay_on_the_host_without_a_reason() -> None:
    assert route([CPU0], ["float32"]) == _gpu.Route("cpu", "")
    assert route([CPU0], ["float32"], eager=False, built_with_cuda=False) == _gpu.Route("cpu", "")


@pytest.mark.parametrize(("kw", "devices", "dtypes", "reason"), [
    ({"eager": False}, [GPU0], ["float32"], r"HorovodAllreduce runs inside tf\.function or a graph.*call it eagerly"),
    ({"device_path": False, "op_name": "HorovodAlltoall"}, [GPU0], ["float32"],
     r"HorovodAlltoall has no GPU data-plane path"),
    ({"built_with_cuda": False}, [GPU0], ["float32"], r"not built with CUDA \(tf\.test\.is_built_with_cuda\(\)"),
    ({}, [GPU0, CPU0], ["float32", "float32"],
     r"on the GPU and on the CPU \(/job:localhost/replica:0/task:0/device:CPU:0, /job:localhost/replica:0/task:0/"
     r"device:GPU:0\).*Put them on one device"),
    ({}, [GPU0], ["bfloat16"], r"got a GPU tensor of dtype bfloat16, copied through the host \(CuPy has no bfloat16 dtype\)"),
    ({}, [GPU0, GPU0], ["float32", "int32"], r"dtype int32, copied.*keeps int32 tensors of a GPU device in host "
                                             r"memory"),
    ({}, [GPU0], ["complex64"], r"dtype complex64, copied.*does not carry it\); GPU tensors of float16, float32"),
])
def test_host_fallbacks_say_why(kw: dict[str, Any], devices: list[str], dtypes: list[str], reason: str) -> None:
    chosen = route(devices, dtypes, **kw)
    assert chosen.device == "cpu"
    assert chosen.reason
    import re

    assert re.search(reason, chosen.reason), chosen.reason


# -- the handoff ------------------------------------------------------------------------------------


class _Capsule:
    """NumPy reads a DLPack capsule only through an object with ``__dlpack__``."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, **kw: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class _HostCupy:
    """NumPy in CuPy's place: TensorFlow's real DLPack export and import run, on CPU memory."""

    ndarray = np.ndarray

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def from_dlpack(self, capsule: Any) -> np.ndarray:
        self.log.append("from_dlpack")
        return np.from_dlpack(_Capsule(capsule))


def _handoff(fn: Any, inputs: list[Any], dtypes: list[Any]) -> tuple[list[Any], list[str]]:
    log: list[str] = []

    def to_dlpack(t: Any) -> Any:
        log.append("to_dlpack")
        return tf.experimental.dlpack.to_dlpack(t)

    def from_dlpack(capsule: Any) -> Any:
        log.append("tf.from_dlpack")
        return tf.experimental.dlpack.from_dlpack(capsule)

    out = _gpu.run_on_device(fn, inputs, dtypes, xp=_HostCupy(log), to_dlpack=to_dlpack,
                             from_dlpack=from_dlpack, sync=lambda: log.append("sync"),
                             wait=lambda xp, outputs: log.append(f"wait {len(outputs)}"))
    return out, log


def test_the_handoff_waits_for_tensorflow_then_returns_results_after_unisons_stream() -> None:
    seen: list[Any] = []

    def fn(*arrays: np.ndarray) -> list[Any]:
        seen.extend(arrays)
        return [a * 2 for a in arrays]

    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    y = tf.constant([5, 6], tf.int64)
    out, log = _handoff(fn, [x, y], [tf.float32, tf.int64])
    assert log == ["sync", "to_dlpack", "from_dlpack", "to_dlpack", "from_dlpack", "wait 2", "tf.from_dlpack",
                   "tf.from_dlpack"]
    assert [type(a) for a in seen] == [np.ndarray, np.ndarray]
    np.testing.assert_array_equal(seen[0], x.numpy())
    assert [o.dtype for o in out] == [tf.float32, tf.int64]
    np.testing.assert_array_equal(out[0].numpy(), [[2.0, 4.0], [6.0, 8.0]])
    np.testing.assert_array_equal(out[1].numpy(), [10, 12])


def test_host_results_are_converted_without_a_device_wait() -> None:
    out, log = _handoff(lambda a: [[3, 4]], [tf.constant([1.0])], [tf.int32])
    assert "wait" not in log and "tf.from_dlpack" not in log
    assert out[0].dtype == tf.int32 and out[0].numpy().tolist() == [3, 4]


def test_missing_cupy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(MissingDependencyError,
                       match=r"TensorFlow GPU tensors need CuPy \(with NCCL\), which is not installed; .*"
                             r"pip install cupy-cuda12x \(CUDA 12; the gpu-cuda12 extra"):
        _gpu.run_on_device(lambda a: [a], [tf.constant([1.0])], [tf.float32])


# -- the bridge -------------------------------------------------------------------------------------


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every eager tensor looks placed on GPU:0 of a CUDA build; the device handoff is recorded."""
    calls: list[Any] = []
    monkeypatch.setattr(_gpu, "_device_of", lambda t: GPU0)
    monkeypatch.setattr(tf.test, "is_built_with_cuda", lambda: True)

    def fake_run_on_device(fn: Any, inputs: Any, dtypes: Any) -> list[Any]:
        calls.append([t.dtype.name for t in inputs])
        return [tf.identity(t) for t in inputs]

    monkeypatch.setattr(_bridge, "run_on_device", fake_run_on_device)
    return calls


def test_the_bridge_sends_gpu_tensors_to_the_device_only_with_a_device_path(on_gpu: list[Any]) -> None:
    host_args: list[Any] = []

    def fn(*arrays: Any) -> list[Any]:
        host_args.extend(arrays)
        return list(arrays)

    x = tf.constant([1.0, 2.0])
    _bridge.run(fn, [x], [tf.float32], "HorovodAllreduce_x", device_path=True)
    assert on_gpu == [["float32"]] and host_args == []
    _bridge.run(fn, [x], [tf.float32], "HorovodAlltoall_x")
    assert on_gpu == [["float32"]] and [type(a) for a in host_args] == [np.ndarray]
    _bridge.run(fn, [tf.constant([1, 2], tf.int32)], [tf.int32], "HorovodAllreduce_x", device_path=True)
    assert on_gpu == [["float32"]] and len(host_args) == 2


def test_the_bridge_surfaces_missing_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu, "_device_of", lambda t: GPU0)
    monkeypatch.setattr(tf.test, "is_built_with_cuda", lambda: True)
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(MissingDependencyError, match=r"pip install cupy-cuda12x"):
        _bridge.run(lambda a: [a], [tf.constant([1.0])], [tf.float32], "HorovodAllreduce_x", device_path=True)


@pytest.mark.parametrize(("call", "expected"), [
    (lambda x: tfc.allreduce(x, name="r"), True),
    (lambda x: tfc.grouped_allreduce([x, x], name="g"), True),
    (lambda x: tfc.allgather(x, name="a"), True),
    (lambda x: tfc.broadcast(x, 0, name="b"), True),
    (lambda x: tfc.reducescatter(x, name="s"), True),
    (lambda x: tfc.alltoall(x, name="t"), False),
])
def test_each_collective_declares_its_device_path(monkeypatch: pytest.MonkeyPatch, call: Any,
                                                  expected: bool) -> None:
    seen: list[bool] = []

    def recording_run(fn: Any, inputs: Any, dtypes: Any, op_name: str = "", blocking: bool = True,
                      device_path: bool = False) -> list[Any]:
        seen.append(device_path)
        return [tf.identity(t) for t in inputs][:len(dtypes)] + [tf.constant([1], tf.int32)] * (
            len(dtypes) - len(inputs))

    monkeypatch.setattr(tfc, "run", recording_run)
    call(tf.constant([[1.0, 2.0]]))
    assert seen and set(seen) == {expected}


def test_the_wait_for_results_is_made_on_each_results_gpu() -> None:
    import types

    log: list[Any] = []

    class Device:
        def __init__(self, ordinal: int) -> None:
            self.ordinal = ordinal

        def __enter__(self) -> None:
            log.append(("enter", self.ordinal))

        def __exit__(self, *exc: Any) -> None:
            log.append(("exit", self.ordinal))

    stream = types.SimpleNamespace(synchronize=lambda: log.append("synchronize"))
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device, get_current_stream=lambda: stream))
    on = [types.SimpleNamespace(device=types.SimpleNamespace(id=i)) for i in (1, 1, 0)]
    _gpu._wait_for_results(xp, on)  # CuPy's current stream is per device: each result's device is entered
    assert log == [("enter", 0), "synchronize", ("exit", 0), ("enter", 1), "synchronize", ("exit", 1)]
