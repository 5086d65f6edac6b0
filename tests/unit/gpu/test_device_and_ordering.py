"""Device arithmetic (the same code CuPy runs) and the stream rules, read from the fake device's log."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.unit.gpu.fake_job import DeviceContext, device_entry, make_planes
from unison.dtypes import DType, bfloat16_to_float32, float32_to_bfloat16
from unison.engine.executor import Executor
from unison.gpu.device import DeviceBuffer
from unison.gpu.fake import FakeDevice
from unison.gpu.ordering import Retention, consume, mark_ready, publish, wait_for_inputs
from unison.ops import CollectiveKind
from unison.protocol.messages import Response

AR = CollectiveKind.ALLREDUCE


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT32, DType.INT64, DType.UINT8], ids=lambda d: d.value)
def test_integers_scale_through_float64_truncated_toward_zero(dtype: DType) -> None:
    device = FakeDevice()
    buf = np.array([7, 9, 100, 3], dtype=dtype.storage) * (1 if dtype is DType.UINT8 else -1)
    device.scale_(buf, 0.5, dtype, device.stream())
    assert buf.tolist() == [int(v * 0.5) for v in (np.array([7, 9, 100, 3]) * (1 if dtype is DType.UINT8 else -1))]


def test_half_precision_scales_in_float32_and_rounds_once() -> None:
    device = FakeDevice()
    values = np.array([1.0, 3.0, 65504.0, -0.1], np.float32)
    half = values.astype(np.float16)
    device.scale_(half, 1 / 3, DType.FLOAT16, device.stream())
    np.testing.assert_array_equal(half, (values.astype(np.float16).astype(np.float32) * np.float32(1 / 3)).astype(np.float16))
    bits = float32_to_bfloat16(values)
    device.scale_(bits, 1 / 3, DType.BFLOAT16, device.stream())
    np.testing.assert_array_equal(bits, float32_to_bfloat16(bfloat16_to_float32(float32_to_bfloat16(values)) * np.float32(1 / 3)))


def test_bfloat16_rounding_matches_the_host_conversion_including_nan_and_ties() -> None:
    device = FakeDevice()
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x7FC00001, 0xFF800000, 0x00000001], np.uint32)
    values = bits.view(np.float32)
    assert device.narrow(values, DType.BFLOAT16).tolist() == float32_to_bfloat16(values).tolist()
    assert np.isnan(bfloat16_to_float32(device.narrow(values[3:4], DType.BFLOAT16))).all()


def test_pack_scales_and_fills_zeros_and_unpack_splits_back() -> None:
    device = FakeDevice()
    a, b = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32).reshape(2, 2)
    buf = np.full(9, -1, np.float32)
    device.pack(buf, [a, None, b], [3, 2, 4], 2.0, DType.FLOAT32, device.stream())
    assert buf.tolist() == [0, 2, 4, 0, 0, 0, 2, 4, 6]
    out_a, out_b = np.empty(3, np.float32), np.empty((2, 2), np.float32)
    device.unpack(buf, [out_a, None, out_b], [3, 2, 4], device.stream())
    assert out_a.tolist() == [0, 2, 4] and out_b.tolist() == [[0, 2], [4, 6]]


def test_the_four_stream_rules_in_order() -> None:
    device = FakeDevice()
    producer = device.current_stream()
    first = mark_ready(device, np.ones(2))  # rule 1: an event on the framework's stream at submission
    second = DeviceBuffer(np.ones(2), first.ready)  # the same event is waited on once
    assert wait_for_inputs(device, device.stream(), [first, second, None]) == 1  # rule 2
    event, (result, nothing) = publish(device, device.stream(), [np.zeros(2), None])  # rule 3
    assert nothing is None and result is not None and result.ready is event
    consume(device, result)  # rule 4
    assert device.log == [("record", producer.name, first.ready.id), ("wait", "unison", first.ready.id),
                          ("record", "unison", event.id), ("wait", "cupy", event.id)]


def test_nccl_reads_only_after_the_producer_and_the_consumer_waits_for_unison() -> None:
    (plane,) = make_planes(1)
    device = plane.device
    assert isinstance(device, FakeDevice)
    producer = device.current_stream()
    device.hold(producer)  # the producer's kernels are still running
    ready = device.record_event(producer)
    entries = [device_entry(f"g{i}", AR, 0, np.full(3, float(i)), dtype=DType.FLOAT64, ready=ready) for i in range(2)]
    device.log.clear()
    results = plane.run(Response("allreduce", ("g0", "g1"), DType.FLOAT64, ((3,), (3,)), postscale=0.5, device="cuda"),
                        entries)
    ops = [(op, stream) for op, stream, _ in device.log if op != "allocate"]
    assert ops == [("wait", "unison"), ("pack", "unison"), ("nccl.allreduce", "unison"), ("scale", "unison"),
                   ("unpack", "unison"), ("record", "unison")]
    assert "synchronize" not in device.operations()  # the host never waits on the NCCL path
    assert plane.statistics()["retained"] == 1  # inputs kept while unison's stream may still use them
    consume(device, results[0])
    assert device.log[-1] == ("wait", "cupy", results[0].ready.id)
    device.finish(producer)
    plane.run(Response("allreduce", ("g0",), DType.FLOAT64, ((3,),), device="cuda"), entries[:1])
    assert plane.statistics()["retained"] == 1  # the first response's buffers were released


def test_staging_waits_for_the_producer_before_copying_to_the_host() -> None:
    (plane,) = make_planes(1, operations="mpi")
    device = plane.device
    assert isinstance(device, FakeDevice)
    ready = device.record_event(device.current_stream())
    device.log.clear()
    plane.run(Response("allreduce", ("g",), DType.FLOAT32, ((2,),), device="cuda"),
              [device_entry("g", AR, 0, np.ones(2, np.float32), dtype=DType.FLOAT32, ready=ready)])
    assert device.operations()[:3] == ["wait", "to_host", "synchronize"]
    assert device.operations()[-2:] == ["from_host", "record"]


def test_retention_releases_in_order_and_stops_at_a_pending_event() -> None:
    device = FakeDevice()
    keep = Retention(device)
    stream = device.stream()
    keep.hold(device.record_event(stream), ["a"])
    device.hold(stream)
    keep.hold(device.record_event(stream), ["b"])
    keep.hold(device.record_event(stream), ["c"])
    assert keep.release() == 1 and len(keep) == 2
    device.finish(stream)
    assert keep.release() == 2 and len(keep) == 0


def test_the_executor_routes_device_responses_to_the_plane_and_keeps_cpu_ones() -> None:
    (plane,) = make_planes(1)
    executor = Executor(plane.backend, 0, {0: (0,)})
    executor.device_plane = plane
    (out,) = executor.run(Response("allreduce", ("g",), DType.FLOAT32, ((2,),), device="cuda"),
                          [device_entry("g", AR, 0, np.ones(2, np.float32), dtype=DType.FLOAT32)])
    assert isinstance(out, DeviceBuffer) and plane.statistics()["responses"] == 1
    executor.close()
    assert plane.statistics()["communicators"] == 0


def test_cpu_jobs_import_nothing_of_the_gpu_plane() -> None:
    code = ("import sys, numpy as np, unison; from unison.engine.executor import Executor; "
            "import unison.gpu.placement, unison.gpu.communicators, unison.gpu.build, unison.gpu.handoff; "
            "print(sorted(m for m in sys.modules if m.startswith(('cupy', 'unison.gpu.plane', 'unison.gpu.cupy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_each_framework_orders_against_its_own_stream() -> None:
    from unison.gpu.handoff import device_results, prepare_arrays, reset

    device = FakeDevice()
    reset()
    try:
        torch_in = mark_ready(device, np.ones(2), "torch")  # a torch tensor: torch's current stream
        (cupy_in,), _, _ = prepare_arrays([np.ones(2)], in_place=False, with_outputs=False,
                                          make=lambda ordinal: device, convert=lambda a: a, xp=np)
        event, (torch_out, cupy_out) = publish(device, device.stream(), [np.zeros(2), np.zeros(2)])
        consume(device, torch_out, "torch")
        device_results([cupy_out], make=lambda ordinal: device)  # NumPy-style results: CuPy's stream
    finally:
        reset()
    assert [(op, stream) for op, stream, _ in device.log] == [
        ("record", "torch"), ("record", "cupy"), ("record", "unison"), ("wait", "torch"), ("wait", "cupy")]
    assert torch_in.ready.stream.name == "torch" and cupy_in.ready.stream.name == "cupy"


def test_the_cupy_device_takes_torchs_stream_only_for_torch_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from unison.gpu.cupy_device import CupyDevice

    class Stream:
        @staticmethod
        def from_external(obj: object) -> str:
            return f"external {obj.__cuda_stream__()[1]:#x}"  # type: ignore[attr-defined]

    cuda = types.SimpleNamespace(Device=DeviceContext, Stream=Stream, get_current_stream=lambda: "cupy's current")
    torch_cuda = types.SimpleNamespace(is_initialized=lambda: True,
                                       current_stream=lambda ordinal: types.SimpleNamespace(cuda_stream=0xBEEF))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda, __version__="14.0.0"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=torch_cuda))
    device = CupyDevice(0)
    # torch is in use in this process, yet a CuPy array's producer is CuPy's current stream
    assert device.current_stream() == "cupy's current"
    assert device.current_stream("torch") == "external 0xbeef"


def test_of_one_producer_streams_events_only_the_last_is_waited_on() -> None:
    device = FakeDevice()
    grads = [mark_ready(device, np.ones(2), "torch") for _ in range(3)]  # a backward pass, hook by hook
    other = mark_ready(device, np.ones(2), "cupy")
    device.log.clear()
    assert wait_for_inputs(device, device.stream(), [grads[1], other, grads[2], grads[0]]) == 2
    assert sorted(event for op, stream, event in device.log) == sorted([grads[2].ready.id, other.ready.id])


def test_record_numbers_follow_the_order_events_were_recorded_on_a_shared_stream() -> None:
    import threading
    import time

    class Slow(FakeDevice):
        def record_event(self, stream: Any) -> Any:
            event = super().record_event(stream)
            time.sleep(0.002 if event.id % 2 else 0.0)  # other threads record on the same stream meanwhile
            return event

    device = Slow()
    shared = device.current_stream("torch")
    marked: list[DeviceBuffer] = []

    def submit() -> None:
        with device.using(shared, "torch"):
            for _ in range(4):
                marked.append(mark_ready(device, np.ones(1), "torch"))

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({b.producer[0] for b in marked}) == 1  # type: ignore[index]  # one stream
    by_number = sorted(marked, key=lambda b: b.producer[1])  # type: ignore[index]
    assert [b.ready.id for b in by_number] == sorted(b.ready.id for b in marked)  # FakeEvent ids count records


def test_a_consumer_stream_waits_once_for_the_results_of_one_response() -> None:
    from unison.gpu.ordering import forget_waits

    device = FakeDevice()
    event, results = publish(device, device.stream(), [np.zeros(2)] * 3)
    later, (again,) = publish(device, device.stream(), [np.zeros(2)])
    device.log.clear()
    for result in results:
        consume(device, result)
    consume(device, results[0], "torch")  # another stream: it waits too
    consume(device, again)  # a later response's event
    forget_waits()
    consume(device, again)
    assert device.log == [("wait", "cupy", event.id), ("wait", "torch", event.id), ("wait", "cupy", later.id),
                          ("wait", "cupy", later.id)]


def test_the_per_thread_default_stream_is_a_stream_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import types

    from unison.gpu.cupy_device import CupyDevice

    cuda = types.SimpleNamespace(Device=DeviceContext)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda, __version__="14.0.0"))
    device = CupyDevice(0)
    legacy, per_thread = types.SimpleNamespace(ptr=0), types.SimpleNamespace(ptr=2)
    keys: list[object] = []
    thread = threading.Thread(target=lambda: keys.extend([device.stream_key(legacy), device.stream_key(per_thread)]))
    thread.start()
    thread.join()
    assert keys[0] == device.stream_key(legacy) == 0  # one legacy default stream for every thread
    assert keys[1] != device.stream_key(per_thread)
