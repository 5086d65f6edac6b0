"""The public surface of unison.torch: Horovod's export list, sorted __all__, lazy imports, buffers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import unison.torch as hvd  # noqa: E402
from unison.adapters.torch.buffers import from_result, to_buffer  # noqa: E402
from unison.dtypes import DType  # noqa: E402

HOROVOD_TORCH_EXPORTS = """Compression allgather_object broadcast_object broadcast_optimizer_state
broadcast_parameters allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce
grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather
allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_
broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized start_timeline
stop_timeline size local_size cross_size rank local_rank cross_rank mpi_threads_supported mpi_enabled
mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built rocm_built ProcessSet
global_process_set add_process_set remove_process_set Average Sum Adasum Min Max Product
HorovodInternalError DistributedOptimizer SyncBatchNorm""".split()


def test_all_is_sorted_and_covers_horovod_torch() -> None:
    assert hvd.__all__ == sorted(hvd.__all__)
    missing = [name for name in HOROVOD_TORCH_EXPORTS if name not in hvd.__all__]
    assert missing == []
    for name in hvd.__all__:
        assert hasattr(hvd, name), name
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def test_imports_stay_apart() -> None:
    code = ("import sys, unison.torch; print('tensorflow' in sys.modules, 'mpi4py.MPI' in sys.modules); "
            "import subprocess")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    out = subprocess.run([sys.executable, "-c", "import sys, unison; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cpu_buffers_are_zero_copy_and_bfloat16_travels_as_bits() -> None:
    t = torch.arange(4, dtype=torch.float32)
    array, dtype = to_buffer(t, in_place=True)
    array[0] = 42.0
    assert dtype is DType.FLOAT32 and t[0].item() == 42.0
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    bits, dtype = to_buffer(b, in_place=True)
    assert dtype is DType.BFLOAT16 and bits.dtype == np.uint16
    assert torch.equal(from_result(bits.copy(), dtype), b)


def test_buffer_errors() -> None:
    with pytest.raises(ValueError, match=r"Tensor is required to be contiguous."):
        to_buffer(torch.ones(3, 3).t(), in_place=True)
    assert to_buffer(torch.ones(3, 2).t(), in_place=False)[0].flags.c_contiguous
    with pytest.raises(ValueError, match=r"Tensor type torch.ComplexFloatTensor is not supported."):
        to_buffer(torch.ones(2, dtype=torch.complex64), in_place=False)


def test_compression_round_trip() -> None:
    t = torch.tensor([1.0, 2.5], dtype=torch.float64)
    sent, ctx = hvd.Compression.fp16.compress(t)
    assert sent.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == torch.float64 and torch.equal(back, t)
    ints = torch.tensor([1, 2])
    assert hvd.Compression.fp16.compress(ints)[0] is ints
    assert issubclass(hvd.Compression.none, hvd.Compressor)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_cuda_tensor_becomes_a_device_buffer_sharing_its_memory() -> None:
    pytest.importorskip("cupy", reason="the GPU data plane needs CuPy")
    tensor = torch.ones(2, device="cuda")
    buffer, _ = to_buffer(tensor, in_place=True)
    assert buffer.array.data.ptr == tensor.data_ptr()  # DLPack: no copy


def test_single_process_job_works_end_to_end() -> None:
    code = """
import torch, unison.torch as hvd
hvd.init()
m = torch.nn.Linear(3, 1)
opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters()), named_parameters=m.named_parameters())
hvd.broadcast_parameters(m.state_dict(), 0); hvd.broadcast_optimizer_state(opt, 0)
m(torch.ones(2, 3)).sum().backward(); opt.step()
print(type(opt).__name__, hvd.allreduce(torch.ones(2)).tolist(), hvd.SyncBatchNorm(3)(torch.randn(4, 3)).shape[0])
hvd.shutdown()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["Adam", "[1.0,", "1.0]", "4"]
