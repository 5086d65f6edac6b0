"""torch CUDA tensors: DLPack without a copy, stream order under a slow producer, DistributedOptimizer."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.plane_job import respond, single_plane
from unison.dtypes import DType
from unison.engine.handles import Entry, Handle
from unison.ops import CollectiveKind
from unison.protocol.messages import Request

torch = pytest.importorskip("torch")
AR = CollectiveKind.ALLREDUCE


def _submit(tensor: torch.Tensor) -> tuple[Entry, DType]:
    from unison.adapters.torch.buffers import cuda_buffer

    buffer, dtype = cuda_buffer(tensor, in_place=True)
    request = Request("t", AR, 0, dtype, tuple(tensor.shape), device="cuda")
    return Entry(request, buffer, buffer, Handle("t")), dtype


@pytest.mark.parametrize("torch_dtype", ["float32", "float16", "bfloat16", "int64"])
def test_dlpack_hand_off_shares_memory_both_ways(torch_dtype: str) -> None:
    from unison.adapters.torch.buffers import from_device_result

    plane = single_plane()
    x = torch.arange(12, device="cuda:0").to(getattr(torch, torch_dtype)).reshape(3, 4)
    entry, dtype = _submit(x)
    assert entry.input.array.data.ptr == x.data_ptr()  # no copy on the way in
    (result,) = plane.run(respond(AR, ["t"], dtype, [tuple(x.shape)], prescale=2.0), [entry])
    back = from_device_result(result, dtype)
    assert back.data_ptr() == x.data_ptr() and back.dtype == x.dtype  # nor on the way out
    torch.testing.assert_close(back.cpu(), (torch.arange(12).reshape(3, 4) * 2).to(x.dtype))


def test_unison_waits_for_a_slow_producer_and_the_consumer_waits_for_unison() -> None:
    from unison.adapters.torch.buffers import from_device_result

    torch.cuda.set_device(0)
    plane = single_plane()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(int(5e8))  # the producer is still busy when the collective is submitted
        x.fill_(3.0)
        entry, dtype = _submit(x)
    # the prescale reads x on unison's stream: before fill_ it would see zeros and fill_ would leave 3
    (result,) = plane.run(respond(AR, ["t"], dtype, [tuple(x.shape)], prescale=2.0), [entry])
    with torch.cuda.stream(side):
        out = from_device_result(result, dtype)
        out.add_(1.0)  # the consumer's kernel runs after unison's writes
        assert torch.all(out.cpu() == 7.0)


def test_distributed_optimizer_on_cuda_matches_one_process_on_the_global_batch() -> None:
    import unison.torch as hvd

    hvd.init()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
        reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
        reference.load_state_dict(model.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        data = torch.randn(32, 8, device="cuda")
        for _ in range(3):
            for m, o in ((model, opt), (reference, ref_opt)):
                o.zero_grad()
                m(data).pow(2).mean().backward()
                o.step()
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b)
        assert hvd.allreduce(torch.ones(3, device="cuda")).device.type == "cuda"
        x = torch.arange(12, device="cuda", dtype=torch.float32).reshape(6, 2)
        out, received = hvd.alltoall(x, splits=torch.tensor([4]))  # rows past the splits are not sent
        assert out.device.type == "cuda" and received.tolist() == [4]
        torch.testing.assert_close(out, x[:4])
    finally:
        hvd.shutdown()


def test_cupy_arrays_through_the_numpy_style_api() -> None:
    import cupy

    import unison

    unison.init()
    try:
        x = cupy.arange(6, dtype=cupy.float32)
        out = unison.allreduce(x, op=unison.Sum, name="cupy.sum")
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(out), np.arange(6))
        out, received = unison.alltoall(cupy.arange(8, dtype=cupy.int64).reshape(4, 2), splits=[3])
        assert isinstance(out, cupy.ndarray) and received.tolist() == [3]
        np.testing.assert_array_equal(cupy.asnumpy(out), np.arange(6).reshape(3, 2))
    finally:
        unison.shutdown()
