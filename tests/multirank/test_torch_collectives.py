"""Torch collectives across real processes: dtypes, in-place/async forms, op names, errors, autograd."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import unison.torch as hvd  # noqa: E402

torch.set_num_threads(1)
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def ranks_sum(values) -> float:
    return float(sum(values(r) for r in range(hvd.size())))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_dtype_sum_and_inplace(dtype) -> None:
    x = torch.arange(1, 5).to(dtype) * (hvd.rank() + 1)
    out = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{dtype}")
    want = torch.arange(1, 5).double() * ranks_sum(lambda r: r + 1)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=0)
    y = x.clone()
    assert hvd.allreduce_(y, None, f"inplace.{dtype}", hvd.Sum) is y
    torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=0)


def test_average_default_and_scale_factors() -> None:
    x = torch.tensor([2.0, 4.0]) * (hvd.rank() + 1)
    mean = ranks_sum(lambda r: r + 1) / hvd.size()
    torch.testing.assert_close(hvd.allreduce(x), torch.tensor([2.0, 4.0]) * mean)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    torch.testing.assert_close(out, torch.tensor([2.0, 4.0]) * 1.5 * ranks_sum(lambda r: r + 1))
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_async_poll_synchronize_and_unnamed_op_names() -> None:
    handle = hvd.allreduce_async(torch.ones(1000) * hvd.rank(), op=hvd.Sum)
    out = hvd.synchronize(handle)
    assert out.sum().item() == 1000 * ranks_sum(lambda r: r)
    with pytest.raises(ValueError, match=rf"Handle {handle} was not created or has been cleared."):
        hvd.poll(handle)
    handles = [hvd.allreduce_async_(torch.full((3,), float(i)), name=f"many.{i}", op=hvd.Max) for i in range(20)]
    assert [hvd.synchronize(h)[0].item() for h in handles] == [float(i) for i in range(20)]


def test_grouped_forms_and_compression() -> None:
    xs = [torch.ones(3) * (hvd.rank() + 1), torch.ones(2, 2, dtype=torch.float64)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp")
    assert outs[0].tolist() == [ranks_sum(lambda r: r + 1)] * 3 and outs[1].dtype == torch.float64
    hvd.grouped_allreduce_(xs, op=hvd.Sum)
    assert xs[1][0, 0].item() == hvd.size()
    out = hvd.allreduce(torch.full((4,), 1.5), compression=hvd.Compression.fp16, op=hvd.Sum)
    assert out.dtype == torch.float32 and out.tolist() == [1.5 * hvd.size()] * 4
    gathered = hvd.grouped_allgather([torch.ones(1, 2) * hvd.rank(), torch.ones(2) * hvd.rank()])
    assert gathered[0].shape == (hvd.size(), 2) and gathered[1].shape == (2 * hvd.size(),)


def test_allgather_broadcast_alltoall_reducescatter() -> None:
    rank, size = hvd.rank(), hvd.size()
    g = hvd.allgather(torch.full((rank + 1, 2), rank, dtype=torch.bfloat16))
    assert g.dtype == torch.bfloat16 and g[:, 0].tolist() == [float(r) for r in range(size) for _ in range(r + 1)]
    b = hvd.broadcast(torch.full((3,), float(rank)), root_rank=size - 1)
    assert b.tolist() == [float(size - 1)] * 3
    t = torch.full((2,), float(rank))
    hvd.broadcast_(t, 0, name="bcast.inplace")
    assert t.tolist() == [0.0, 0.0]
    splits = [1 + r for r in range(size)]
    out, received = hvd.alltoall(torch.full((sum(splits),), float(rank)), splits=splits)
    assert received.dtype == torch.int32 and received.tolist() == [rank + 1] * size
    assert out.tolist() == [float(r) for r in range(size) for _ in range(rank + 1)]
    rs = hvd.reducescatter(torch.ones(size * 2, 3), op=hvd.Sum)
    assert rs.shape == (2, 3) and rs.flatten().tolist() == [float(size)] * 6


def test_errors_use_horovods_messages() -> None:
    with pytest.raises(ValueError, match=r"Tensor is required to be contiguous."):
        hvd.allreduce_(torch.ones(4, 4).t())
    assert hvd.allreduce(torch.ones(4, 2).t(), op=hvd.Sum).is_contiguous()  # out of place: copied
    with pytest.raises(ValueError, match=r"Tensor type torch.ComplexFloatTensor is not supported."):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    if hvd.size() > 1:  # every length divides evenly among one rank
        with pytest.raises(ValueError, match=r"splits not provided, but first dimension of tensor is not an even"):
            hvd.alltoall(torch.ones(hvd.size() + 1))


@pytest.mark.min_ranks(2)
def test_a_mismatch_between_ranks_uses_horovods_message() -> None:
    with pytest.raises(hvd.HorovodInternalError, match=r"Mismatched ALLREDUCE tensor shapes for 'allreduce.shape'"):
        hvd.allreduce(torch.ones(hvd.rank() + 1), name="shape")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the DLPack "
                    "hand-off to the GPU data plane cannot run here")
def test_cuda_tensor_is_refused_clearly() -> None:
    with pytest.raises(NotImplementedError, match=r"CUDA tensors need unison's GPU data plane"):
        hvd.allreduce(torch.ones(2, device="cuda"))


def test_sparse_allreduce_async() -> None:
    rank = hvd.rank()
    sparse = torch.sparse_coo_tensor([[rank, rank]], [1.0, 2.0], (hvd.size(),))  # duplicate index
    result = hvd.sparse_allreduce_async(sparse, name="emb", op=hvd.Sum)()
    assert result.to_dense().tolist() == [3.0] * hvd.size()
    result = hvd.sparse_allreduce_async(sparse, name="emb.avg", op=hvd.Average)()
    assert result.to_dense().tolist() == [3.0 / hvd.size()] * hvd.size()


def test_objects() -> None:
    assert hvd.broadcast_object({"r": hvd.rank()} if hvd.rank() == 0 else None) == {"r": 0}
    assert hvd.allgather_object(hvd.rank() * 10) == [r * 10 for r in range(hvd.size())]


# -- autograd: each gradient checked against its analytic value ------------------------------------


def weights(n: int) -> torch.Tensor:
    """A per-rank loss weight w_r, so loss_r = sum(w_r * y) has a distinct gradient on each rank."""
    return torch.arange(1.0, n + 1) * (hvd.rank() + 1)


def sum_over_ranks(f) -> torch.Tensor:
    return sum(f(r) for r in range(hvd.size()))


def test_allreduce_gradient() -> None:
    x = torch.ones(3, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0) * weights(3)).sum().backward()
    # d/dx of sum_r w_r * 2 * sum_s x_s, averaged over ranks as Horovod's backward does: allreduce(Sum)
    want = 2.0 * sum_over_ranks(lambda r: torch.arange(1.0, 4) * (r + 1))
    torch.testing.assert_close(x.grad, want)
    x.grad = None
    (hvd.grouped_allreduce([x], op=hvd.Average)[0] * weights(3)).sum().backward()
    torch.testing.assert_close(x.grad, sum_over_ranks(lambda r: torch.arange(1.0, 4) * (r + 1)) / hvd.size())


def test_allgather_gradient() -> None:
    n = hvd.rank() + 1
    x = torch.ones(n, requires_grad=True)
    total = sum(r + 1 for r in range(hvd.size()))
    (hvd.allgather(x) * torch.arange(1.0, total + 1) * (hvd.rank() + 1)).sum().backward()
    # Horovod: Average-allreduce of the gradient, then this rank's rows
    offset = sum(r + 1 for r in range(hvd.rank()))
    mean_factor = sum(r + 1 for r in range(hvd.size())) / hvd.size()
    torch.testing.assert_close(x.grad, torch.arange(1.0, total + 1)[offset : offset + n] * mean_factor)


def test_broadcast_gradient() -> None:
    x = torch.ones(2, requires_grad=True)
    (hvd.broadcast(x, root_rank=0) * weights(2)).sum().backward()
    mean = sum_over_ranks(lambda r: torch.arange(1.0, 3) * (r + 1)) / hvd.size()
    torch.testing.assert_close(x.grad, mean if hvd.rank() == 0 else torch.zeros(2))


def test_alltoall_and_reducescatter_gradients() -> None:
    size, rank = hvd.size(), hvd.rank()
    x = torch.arange(float(size), requires_grad=True)
    out = hvd.alltoall(x)  # out[s] came from rank s's element [rank]
    (out * (torch.arange(float(size)) + 10 * rank)).sum().backward()
    # element j of x went to rank j, where it was weighted by (rank + 10 * j)
    torch.testing.assert_close(x.grad, torch.tensor([rank + 10.0 * j for j in range(size)]))
    y = torch.ones(size, 2, requires_grad=True)
    (hvd.reducescatter(y, op=hvd.Sum) * (rank + 1)).sum().backward()
    # Horovod: allgather of the gradient, times the set size for Sum
    want = torch.tensor([[float(r + 1)] * 2 for r in range(size)]) * size
    torch.testing.assert_close(y.grad, want)


# Last in the module: ranks make different numbers of calls here, and unnamed op names count calls
# (Horovod's rule), so unnamed ops after it would not match across ranks until the next init().
def test_join_with_uneven_data() -> None:
    # rank r has r + 2 batches; joined ranks contribute zeros; Average still divides by size.
    steps = hvd.rank() + 2
    seen = []
    for step in range(steps):
        seen.append(hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"uneven.{step}")[0].item())
    last = hvd.join()
    assert last == hvd.size() - 1
    assert seen == [float(sum(1 for r in range(hvd.size()) if r + 2 > s)) for s in range(steps)]
    hvd.barrier()
