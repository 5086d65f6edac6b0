"""The CuPy and NCCL calls of `unison.gpu.cupy_device`: argument order and units against recording fakes
(everywhere), and against the installed CuPy's own signatures and constants where CuPy is installed."""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from typing import Any

import numpy as np
import pytest

from tests.unit.gpu.fake_job import DeviceContext
from unison.dtypes import DType
from unison.gpu import cupy_device
from unison.gpu import nccl as unison_nccl
from unison.ops import ReduceOp

# NcclCommunicator's methods as CuPy (13 and 14) declares them; the recording fake takes exactly these.
SIGNATURES = {
    "allReduce": ("sendbuf", "recvbuf", "count", "datatype", "op", "stream"),
    "allGather": ("sendbuf", "recvbuf", "count", "datatype", "stream"),
    "broadcast": ("sendbuff", "recvbuff", "count", "datatype", "root", "stream"),
    "reduceScatter": ("sendbuf", "recvbuf", "recvcount", "datatype", "op", "stream"),
    "send": ("sendbuf", "count", "datatype", "peer", "stream"),
    "recv": ("recvbuf", "count", "datatype", "peer", "stream"),
}
UINT8 = 1  # ncclUint8: gathers, broadcasts and send/recv move bytes


class RecordingCommunicator:
    """Records each call by parameter name; a wrong argument count fails as CuPy's would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        for method, names in SIGNATURES.items():
            setattr(self, method, self._recorder(method, names))

    def _recorder(self, method: str, names: tuple[str, ...]) -> Any:
        def record(*args: Any) -> None:
            if len(args) != len(names):
                raise TypeError(f"{method}() takes {len(names)} arguments ({len(args)} given)")
            self.calls.append((method, dict(zip(names, args))))

        return record

    def destroy(self) -> None:
        self.calls.append(("destroy", {}))


class FakeArray:
    """What CupyComm reads from a CuPy array: the device pointer and sizes."""

    def __init__(self, ptr: int, size: int, itemsize: int) -> None:
        self.data = types.SimpleNamespace(ptr=ptr)
        self.size, self.itemsize, self.nbytes = size, itemsize, size * itemsize


def make_comm(size: int = 3, index: int = 1) -> tuple[Any, RecordingCommunicator, list[str]]:
    groups: list[str] = []
    nccl = types.SimpleNamespace(groupStart=lambda: groups.append("start"), groupEnd=lambda: groups.append("end"))
    inner = RecordingCommunicator()
    return cupy_device.CupyComm(inner, nccl, size, index), inner, groups


STREAM = types.SimpleNamespace(ptr=0xABC)


def test_reductions_count_elements_in_nccl_types() -> None:
    comm, inner, _ = make_comm()
    comm.allreduce_(FakeArray(1000, 6, 2), DType.BFLOAT16, ReduceOp.AVERAGE, STREAM)
    comm.reducescatter(FakeArray(2000, 12, 4), FakeArray(3000, 4, 4), DType.FLOAT32, ReduceOp.MAX, STREAM)
    assert inner.calls == [
        ("allReduce", {"sendbuf": 1000, "recvbuf": 1000, "count": 6, "datatype": 9, "op": 0, "stream": 0xABC}),
        ("reduceScatter", {"sendbuf": 2000, "recvbuf": 3000, "recvcount": 4, "datatype": 7, "op": 2,
                           "stream": 0xABC}),
    ]
    with pytest.raises(ValueError, match="NCCL cannot reduce int16"):
        comm.allreduce_(FakeArray(1, 1, 2), DType.INT16, ReduceOp.SUM, STREAM)


def test_moves_count_bytes() -> None:
    comm, inner, groups = make_comm(size=3, index=1)
    comm.allgather(FakeArray(100, 4, 4), FakeArray(200, 12, 4), STREAM)
    comm.broadcast_(FakeArray(300, 5, 8), 2, STREAM)
    assert inner.calls == [
        ("allGather", {"sendbuf": 100, "recvbuf": 200, "count": 16, "datatype": UINT8, "stream": 0xABC}),
        ("broadcast", {"sendbuff": 300, "recvbuff": 300, "count": 40, "datatype": UINT8, "root": 2,
                       "stream": 0xABC}),
    ]
    inner.calls.clear()
    # uneven gather: one grouped broadcast per member with rows, each from its place in recv (own: send)
    comm.allgatherv(FakeArray(100, 2, 4), FakeArray(200, 5, 4), [3, 2, 0], STREAM)
    assert groups == ["start", "end"]
    assert inner.calls == [
        ("broadcast", {"sendbuff": 200, "recvbuff": 200, "count": 12, "datatype": UINT8, "root": 0,
                       "stream": 0xABC}),
        ("broadcast", {"sendbuff": 100, "recvbuff": 212, "count": 8, "datatype": UINT8, "root": 1,
                       "stream": 0xABC}),
    ]


def test_alltoall_is_grouped_send_and_recv() -> None:
    comm, inner, groups = make_comm(size=3, index=0)
    comm.alltoallv(FakeArray(100, 6, 2), [1, 0, 5], FakeArray(500, 4, 2), [2, 2, 0], STREAM)
    assert groups == ["start", "end"]
    assert inner.calls == [
        ("send", {"sendbuf": 100, "count": 2, "datatype": UINT8, "peer": 0, "stream": 0xABC}),
        ("recv", {"recvbuf": 500, "count": 4, "datatype": UINT8, "peer": 0, "stream": 0xABC}),
        ("recv", {"recvbuf": 504, "count": 4, "datatype": UINT8, "peer": 1, "stream": 0xABC}),
        ("send", {"sendbuf": 102, "count": 10, "datatype": UINT8, "peer": 2, "stream": 0xABC}),
    ]
    comm.close()
    comm.close()  # once only
    assert inner.calls[-1] == ("destroy", {}) and inner.calls[-2][0] == "send"


def test_a_failing_call_inside_a_group_still_ends_the_group() -> None:
    comm, inner, groups = make_comm(size=2, index=0)

    def refuse(*args: Any) -> None:
        raise RuntimeError("NCCL_ERROR_INVALID_USAGE")

    inner.send = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        comm.alltoallv(FakeArray(100, 2, 1), [1, 1], FakeArray(200, 2, 1), [1, 1], STREAM)
    assert groups == ["start", "end"]


def test_the_unique_id_travels_as_bytes_and_goes_to_each_cupy_as_it_wants() -> None:
    signed = tuple(range(-128, 0))
    as_bytes = cupy_device.id_bytes(signed)
    assert as_bytes == bytes(range(128, 256)) and cupy_device.id_bytes(as_bytes) == as_bytes
    assert cupy_device.comm_id(as_bytes, "13.6.0") == signed  # CuPy before 14: signed chars
    assert cupy_device.comm_id(as_bytes, "14.0.0rc1") == as_bytes  # CuPy 14 refuses anything but bytes


def test_a_foreign_stream_is_wrapped_without_the_deprecated_class_where_cupy_has_from_external() -> None:
    made: list[Any] = []

    class Stream:
        @staticmethod
        def from_external(obj: Any) -> Any:
            made.append(("from_external", obj.__cuda_stream__()))
            return "stream"

    def external(ptr: int, device_id: int) -> str:
        made.append(("ExternalStream", (ptr, device_id)))
        return "old"

    new = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=Stream, ExternalStream=external))
    old = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=object, ExternalStream=external))
    assert cupy_device.external_stream(new, 0x77, 1) == "stream"
    assert cupy_device.external_stream(old, 0x77, 1) == "old"
    assert made == [("from_external", (0, 0x77)), ("ExternalStream", (0x77, 1))]


class FakeStream(DeviceContext):
    """A stream for the stand-in CuPy: its handle, and a context (``with stream``) that does nothing."""

    def __init__(self, ptr: int) -> None:
        super().__init__(0)
        self.ptr = ptr


def fake_cupy(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[Any, ...]], raw_kernel: Any = None) -> Any:
    runtime = types.SimpleNamespace(memcpyDeviceToDevice=3, memcpyAsync=lambda *a: calls.append(("memcpy", *a)),
                                    memsetAsync=lambda *a: calls.append(("memset", *a)))
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=DeviceContext, runtime=runtime), __version__="14.0.0")
    if raw_kernel is not None:
        cupy.RawKernel = raw_kernel
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


def test_fusion_without_the_batched_kernel_moves_bytes_with_one_memcpy_per_tensor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    fake_cupy(monkeypatch, calls)
    device = cupy_device.CupyDevice(0)
    device.batched_copies = False
    stream = FakeStream(0xABC)
    buf = FakeArray(1000, 10, 4)
    device.pack(buf, [FakeArray(2000, 3, 4), None, FakeArray(3000, 5, 4), FakeArray(4000, 0, 4)], [3, 2, 5, 0],
                1.0, DType.FLOAT32, stream)
    # a joined rank's zeros are a memset; an empty tensor moves nothing
    assert calls == [("memset", 1012, 0, 8, 0xABC), ("memcpy", 1000, 2000, 12, 3, 0xABC),
                     ("memcpy", 1020, 3000, 20, 3, 0xABC)]
    calls.clear()
    device.unpack(buf, [FakeArray(5000, 3, 4), None, FakeArray(6000, 5, 4)], [3, 2, 5], stream)
    device.copy_(FakeArray(7000, 2, 8), FakeArray(8000, 2, 8), stream)
    assert calls == [("memcpy", 5000, 1000, 12, 3, 0xABC), ("memcpy", 6000, 1020, 20, 3, 0xABC),
                     ("memcpy", 7000, 8000, 16, 3, 0xABC)]


class RecordingKernel:
    """``cupy.RawKernel`` for the stand-in CuPy: compiles once, records each launch."""

    made: list[tuple[str, str]] = []
    launches: list[tuple[tuple[int, ...], tuple[int, ...], Any]] = []

    def __init__(self, code: str, name: str) -> None:
        RecordingKernel.made.append((code, name))

    def compile(self) -> None:
        return None

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        RecordingKernel.launches.append((grid, block, args))


def test_fusion_launches_the_batched_kernel_once_per_128_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    from unison.gpu import batched_copy

    RecordingKernel.made.clear()
    RecordingKernel.launches.clear()
    calls: list[tuple[Any, ...]] = []
    fake_cupy(monkeypatch, calls, RecordingKernel)
    device = cupy_device.CupyDevice(0)
    stream = FakeStream(0xABC)
    counts = [(i % 7) * 3 for i in range(200)]  # some empty
    memory = np.zeros(4 * (2 * sum(counts) + 64), dtype=np.uint8)
    parts = []
    offset = 4 * sum(counts) + 64
    for i, count in enumerate(counts):
        parts.append(FakeArray(offset, count, 4))
        memory[offset : offset + 4 * count] = np.arange(4 * count) % 251 + i % 5
        offset += 4 * count
    buf = FakeArray(0, sum(counts), 4)
    device.pack(buf, parts, counts, 1.0, DType.FLOAT32, stream)
    device.pack(buf, parts, counts, 1.0, DType.FLOAT32, stream)
    assert calls == [] and len(RecordingKernel.made) == 1  # compiled once, no memcpy
    nonempty = sum(1 for c in counts if c)
    assert len(RecordingKernel.launches) == 2 * -(-nonempty // batched_copy.MAX_PARTS)
    assert all(block == (batched_copy.THREADS,) for _, block, _ in RecordingKernel.launches)
    half = RecordingKernel.launches[: len(RecordingKernel.launches) // 2]
    batched_copy.emulate(memory, [(args[0], grid[0]) for grid, _, args in half])
    expected = np.concatenate([memory[p.data.ptr : p.data.ptr + p.nbytes] for p in parts])
    np.testing.assert_array_equal(memory[: 4 * sum(counts)], expected)


def test_a_kernel_that_cannot_be_built_is_named_once_and_each_tensor_is_copied(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def no_compiler(code: str, name: str) -> Any:
        raise RuntimeError("nvrtc: libnvrtc.so.13 not found")

    calls: list[tuple[Any, ...]] = []
    fake_cupy(monkeypatch, calls, no_compiler)
    device = cupy_device.CupyDevice(0)
    stream = FakeStream(0xABC)
    for _ in range(2):
        device.unpack(FakeArray(1000, 4, 4), [FakeArray(5000, 3, 4), FakeArray(6000, 1, 4)], [3, 1], stream)
    assert calls == [("memcpy", 5000, 1000, 12, 3, 0xABC), ("memcpy", 6000, 1012, 4, 3, 0xABC)] * 2
    warnings = [r.getMessage() for r in caplog.records if "batched copy kernel" in r.getMessage()]
    assert len(warnings) == 1 and "libnvrtc.so.13 not found" in warnings[0]


def test_a_launch_the_driver_refuses_falls_back_for_the_whole_set(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    class Refused(RecordingKernel):
        def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    calls: list[tuple[Any, ...]] = []
    fake_cupy(monkeypatch, calls, Refused)
    device = cupy_device.CupyDevice(0)
    device.unpack(FakeArray(1000, 4, 4), [FakeArray(5000, 3, 4), FakeArray(6000, 1, 4)], [3, 1], FakeStream(7))
    assert calls == [("memcpy", 5000, 1000, 12, 3, 7), ("memcpy", 6000, 1012, 4, 3, 7)]
    assert any("could not be launched" in r.getMessage() for r in caplog.records)


# -- against the installed CuPy (skipped where CuPy is not installed, as in CI) ---------------------

def _real_nccl() -> Any:
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed (pip install -e '.[gpu-cuda12]')")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy warns when libnccl cannot be loaded
        from cupy.cuda import nccl
    if not getattr(nccl, "available", True):
        pytest.skip("this CuPy has no NCCL")
    return nccl


def test_the_nccl_codes_are_cupys() -> None:
    nccl = _real_nccl()
    names = {DType.INT8: "NCCL_INT8", DType.UINT8: "NCCL_UINT8", DType.INT32: "NCCL_INT32",
             DType.INT64: "NCCL_INT64", DType.FLOAT16: "NCCL_FLOAT16", DType.FLOAT32: "NCCL_FLOAT32",
             DType.FLOAT64: "NCCL_FLOAT64", DType.BFLOAT16: "NCCL_BFLOAT16"}
    for dtype, name in names.items():
        assert unison_nccl.nccl_dtype(dtype) == getattr(nccl, name), name
    assert UINT8 == nccl.NCCL_UINT8
    ops = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVERAGE: "NCCL_SUM", ReduceOp.PRODUCT: "NCCL_PROD",
           ReduceOp.MAX: "NCCL_MAX", ReduceOp.MIN: "NCCL_MIN"}
    for op, name in ops.items():
        assert unison_nccl.nccl_op(op) == getattr(nccl, name), name


def test_the_communicator_methods_take_what_cupy_communicator_declares() -> None:
    nccl = _real_nccl()
    for method, names in SIGNATURES.items():
        line = getattr(nccl.NcclCommunicator, method).__doc__.strip().splitlines()[0]
        declared = tuple(p.split()[-1] for p in line.split("(", 1)[1].rstrip(")").split(",")[1:])
        assert declared == names, line


def test_the_id_is_accepted_by_this_cupys_communicator() -> None:
    nccl = _real_nccl()
    import cupy

    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver: no GPU
        gpus = 0
    if gpus:
        pytest.skip("a GPU is visible: tests/gpu makes real communicators")
    unique_id = cupy_device.comm_id(bytes(128), cupy.__version__)
    with pytest.raises(Exception) as caught:  # no GPU: NCCL fails, but not on the id's type
        nccl.NcclCommunicator(1, unique_id, 0)
    assert not isinstance(caught.value, TypeError), caught.value


def test_a_foreign_stream_with_this_cupy_gives_no_warning() -> None:
    _real_nccl()
    import cupy

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = cupy_device.external_stream(cupy, 0, 0)  # the legacy default stream: valid on any GPU
    assert stream.ptr == 0


def test_the_byte_moves_are_cupys_runtime_calls() -> None:
    _real_nccl()
    from cupy.cuda import runtime

    assert runtime.memcpyAsync.__doc__.splitlines()[0] == (
        "memcpyAsync(intptr_t dst, intptr_t src, size_t size, int kind, intptr_t stream)")
    assert runtime.memsetAsync.__doc__.splitlines()[0] == (
        "memsetAsync(intptr_t ptr, int value, size_t size, intptr_t stream)")
    assert runtime.memcpyDeviceToDevice == 3


def test_the_host_copies_use_cupys_keywords() -> None:
    _real_nccl()
    import cupy
    import cupyx

    assert "stream=None" in cupy.ndarray.get.__doc__ and "out=None" in cupy.ndarray.get.__doc__
    assert "stream=None" in cupy.ndarray.set.__doc__
    assert callable(cupyx.empty_pinned) and callable(cupy.from_dlpack)
    assert hasattr(cupy.cuda.Device, "pci_bus_id") and hasattr(cupy.cuda.Stream, "wait_event")
    assert {"done", "record", "synchronize"} <= set(dir(cupy.cuda.Event))
    assert np.dtype(cupy.uint16) == np.uint16


def test_torchs_stream_is_wrapped_once_per_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each submission asks for torch's current stream; the CuPy wrapper is made once per stream handle."""
    torch = pytest.importorskip("torch")
    made: list[int] = []

    class Stream:
        @staticmethod
        def from_external(obj: Any) -> Any:
            made.append(obj.__cuda_stream__()[1])
            return types.SimpleNamespace(ptr=obj.__cuda_stream__()[1])

    fake_cupy(monkeypatch, [])
    sys.modules["cupy"].cuda.Stream = Stream
    current = {"handle": 0x10}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda ordinal: types.SimpleNamespace(cuda_stream=current["handle"]))
    device = cupy_device.CupyDevice(0)
    first = device.current_stream("torch")
    assert device.current_stream("torch") is first and first.ptr == 0x10
    current["handle"] = 0x20
    assert device.current_stream("torch").ptr == 0x20
    current["handle"] = 0x10
    assert device.current_stream("torch") is first
    assert made == [0x10, 0x20]
