"""torch.distributed on the "unison" backend across real processes: every collective against its
definition, DDP (its options, no_sync, a comm hook, Join), ZeroRedundancyOptimizer and FSDP2 against one
process on the global batch, a desynchronised rank named at once, and the calls it refuses.

``UNISON_TEST_TORCH_DEVICE=cuda`` runs every case on CUDA tensors (tests/gpu/test_torch_distributed_cuda.py
does, on the GPU data plane): the group's fixture makes the local GPU torch's default device.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import unison.torch as hvd  # noqa: E402
from unison.adapters.torch.call_names import MIN_WINDOW  # noqa: E402
from unison.errors import MismatchError, UnisonNotImplementedError  # noqa: E402

torch.set_num_threads(1)
DEVICE = torch.device(os.environ.get("UNISON_TEST_TORCH_DEVICE", "cpu"))
GLOBAL_BATCH = 12  # divisible by 1, 2 and 3 ranks
STEPS = 3


@pytest.fixture(scope="module", autouse=True)
def group():
    hvd.init()
    if DEVICE.type == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch.set_default_device(DEVICE)
    dist.init_process_group("unison")
    yield
    dist.destroy_process_group()
    torch.set_default_device("cpu")
    hvd.shutdown()


def rank() -> int:
    return dist.get_rank()


def size() -> int:
    return dist.get_world_size()


def test_the_group_is_the_unison_job() -> None:
    assert dist.get_backend() == "unison"
    assert (dist.get_rank(), dist.get_world_size()) == (hvd.rank(), hvd.size())


@pytest.mark.parametrize(("op", "expected"), [
    (dist.ReduceOp.SUM, lambda values: sum(values)),
    (dist.ReduceOp.AVG, lambda values: sum(values) / len(values)),
    (dist.ReduceOp.PRODUCT, lambda values: torch.prod(torch.tensor(values)).item()),
    (dist.ReduceOp.MIN, min),
    (dist.ReduceOp.MAX, max),
])
def test_all_reduce_with_every_arithmetic_op(op, expected) -> None:
    values = [float(r + 2) for r in range(size())]
    tensor = torch.full((5,), values[rank()])
    dist.all_reduce(tensor, op=op)
    assert torch.equal(tensor, torch.full((5,), float(expected(values))))


@pytest.mark.parametrize(("op", "fold"), [(dist.ReduceOp.BAND, int.__and__), (dist.ReduceOp.BOR, int.__or__),
                                          (dist.ReduceOp.BXOR, int.__xor__)])
def test_all_reduce_with_bitwise_ops(op, fold) -> None:
    values = [0b1101 + 3 * r for r in range(size())]
    tensor = torch.full((3,), values[rank()], dtype=torch.int64)
    dist.all_reduce(tensor, op=op)
    result = values[0]
    for value in values[1:]:
        result = fold(result, value)
    assert tensor.tolist() == [result] * 3


def test_premul_sum_scales_before_summing() -> None:
    tensor = torch.full((4,), float(rank() + 1))
    dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(0.25))
    assert torch.allclose(tensor, torch.full((4,), 0.25 * sum(range(1, size() + 1))))


def test_all_reduce_coalesced_and_a_non_contiguous_tensor() -> None:
    base = torch.arange(12.0).reshape(3, 4) * (rank() + 1)
    column = base.t()  # not contiguous
    dist.all_reduce(column)
    total = sum(range(1, size() + 1))
    assert torch.equal(base, torch.arange(12.0).reshape(3, 4) * total)
    tensors = [torch.ones(2) * rank(), torch.ones(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced(tensors)
    assert tensors[0].tolist() == [float(sum(range(size())))] * 2 and tensors[1].tolist() == [float(size())] * 3


def test_gathers_and_scatters() -> None:
    n, r = size(), rank()
    outputs = [torch.empty(2) for _ in range(n)]
    dist.all_gather(outputs, torch.full((2,), float(r)))
    assert [o.tolist() for o in outputs] == [[float(i)] * 2 for i in range(n)]
    into = torch.empty(2 * n)
    dist.all_gather_into_tensor(into, torch.full((2,), float(r)))
    assert into.tolist() == [float(i) for i in range(n) for _ in range(2)]
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * n) + r)
    assert out.tolist() == [float(n * (2 * r + k) + sum(range(n))) for k in range(2)]
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(i + r)) for i in range(n)])
    assert out.tolist() == [float(n * r + sum(range(n)))] * 2
    gathered = [torch.empty(3) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((3,), float(r)), gathered, dst=0)
    if r == 0:
        assert [g.tolist() for g in gathered] == [[float(i)] * 3 for i in range(n)]
    out = torch.empty(3)
    dist.scatter(out, [torch.full((3,), 10.0 * i) for i in range(n)] if r == n - 1 else None, src=n - 1)
    assert out.tolist() == [10.0 * r] * 3


def test_broadcast_reduce_and_all_to_all() -> None:
    n, r = size(), rank()
    tensor = torch.full((3,), float(r))
    dist.broadcast(tensor, src=n - 1)
    assert tensor.tolist() == [float(n - 1)] * 3
    tensor = torch.full((3,), float(r + 1))
    dist.reduce(tensor, dst=0)
    assert tensor.tolist() == [float(sum(range(1, n + 1)) if r == 0 else r + 1)] * 3
    out = torch.empty(n)
    dist.all_to_all_single(out, torch.arange(float(n)) + 10 * r)
    assert out.tolist() == [float(r + 10 * i) for i in range(n)]
    # uneven splits: rank i sends i + 1 rows to each rank
    sent = torch.full(((r + 1) * n, 2), float(r))
    out = torch.empty((sum(i + 1 for i in range(n)), 2))
    dist.all_to_all_single(out, sent, [i + 1 for i in range(n)], [r + 1] * n)
    assert out[:, 0].tolist() == [float(i) for i in range(n) for _ in range(i + 1)]
    outputs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outputs, [torch.full((2,), float(10 * r + i)) for i in range(n)])
    assert [o.tolist() for o in outputs] == [[float(10 * i + r)] * 2 for i in range(n)]
    dist.barrier()


def test_async_work_completes_through_its_future() -> None:
    tensor = torch.ones(4)
    work = dist.all_reduce(tensor, async_op=True)
    chained = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    assert work.is_completed() and work.is_success()
    assert chained.wait().tolist() == [2.0 * size()] * 4


# -- training against one process on the global batch -----------------------------------------------


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)  # on the CPU: the same numbers on every device
    x, y = torch.randn(GLOBAL_BATCH, 6, generator=g, device="cpu"), torch.randn(GLOBAL_BATCH, 3, generator=g, device="cpu")
    return x.to(DEVICE), y.to(DEVICE)


def shard(t: torch.Tensor) -> torch.Tensor:
    per = GLOBAL_BATCH // size()
    return t[rank() * per:(rank() + 1) * per]


def reference(steps: int = STEPS) -> list[torch.Tensor]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_on_shards(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """`STEPS` steps, each rank on its shard of the global batch."""
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(shard(x)), shard(y)).backward()
        opt.step()


def assert_equals_reference(parameters: list[torch.Tensor], tolerance: float = 1e-5) -> None:
    """The parameters equal one process's on the global batch (to float32 rounding by default)."""
    for got, want in zip(parameters, reference()):
        torch.testing.assert_close(got.detach(), want, rtol=tolerance, atol=tolerance / 10 if tolerance < 1e-4 else tolerance)


@pytest.mark.parametrize("options", [{}, {"gradient_as_bucket_view": True}, {"static_graph": True},
                                     {"find_unused_parameters": True}, {"bucket_cap_mb": 0.0001}],
                         ids=["default", "bucket_view", "static_graph", "find_unused", "tiny_buckets"])
def test_ddp_equals_one_process_on_the_global_batch(options) -> None:
    model = torch.nn.parallel.DistributedDataParallel(make_model(), **options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_on_shards(model, opt)
    assert_equals_reference(list(model.parameters()))


def test_ddp_no_sync_accumulates_then_reduces() -> None:
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = data(step)
        xs, ys = shard(x), shard(y)
        half = xs.shape[0] // 2 if xs.shape[0] > 1 else 1
        opt.zero_grad()
        with model.no_sync():  # the first micro-batch stays local
            (torch.nn.functional.mse_loss(model(xs[:half]), ys[:half], reduction="sum") / ys.numel()).backward()
        (torch.nn.functional.mse_loss(model(xs[half:]), ys[half:], reduction="sum") / ys.numel()).backward()
        opt.step()
    assert_equals_reference(list(model.parameters()))


def test_ddp_with_the_fp16_compression_hook() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = torch.nn.parallel.DistributedDataParallel(make_model())
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_on_shards(model, opt)
    assert_equals_reference(list(model.parameters()), tolerance=2e-3)  # gradients travel in float16


def test_ddp_join_with_uneven_inputs() -> None:
    from torch.distributed.algorithms.join import Join

    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = 2 + rank()  # rank r has r more batches than rank 0
    with Join([model]):
        for step in range(batches):
            x, y = data(step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(shard(x)), shard(y)).backward()
            opt.step()
    # every replica took the same steps (the joined ranks shadowed the others' reductions)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(size())]
    dist.all_gather(gathered, flat)
    for other in gathered:
        torch.testing.assert_close(other, flat)


def test_zero_redundancy_optimizer_equals_one_process() -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9)
    train_on_shards(model, opt)
    assert_equals_reference(list(model.parameters()))


def test_fsdp2_fully_shard_equals_one_process() -> None:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_on_shards(model, opt)
    assert_equals_reference([_unshard(p.to_local().detach()) for p in model.parameters()])


def _unshard(local: torch.Tensor) -> torch.Tensor:
    """A parameter sharded on dimension 0 (as FSDP2 shards it, unevenly at 3 ranks), gathered whole.

    Not `full_tensor()`: DTensor's redistribution calls torch's functional collectives, which reach a
    backend written in Python only in their `_out` forms (docs/torch.md, "Limits").
    """
    rows = torch.tensor([local.shape[0]])
    counts = [torch.empty_like(rows) for _ in range(size())]
    dist.all_gather(counts, rows)
    pieces = [torch.empty((int(c), *local.shape[1:])) for c in counts]
    dist.all_gather(pieces, local.contiguous())
    return torch.cat(pieces)


@pytest.mark.min_ranks(2)
def test_groups_of_some_ranks_run_on_unison_process_sets() -> None:
    n, r = size(), rank()
    others, ends = list(range(1, n)), [0, n - 1]  # at 2 ranks: a group of one, and the whole job
    sub, again, pair = dist.new_group(others), dist.new_group(others), dist.new_group(ends)
    if r in others:
        for group in (sub, again):  # two torch groups on one unison set: their calls' names differ
            tensor = torch.full((2,), float(r))
            dist.all_reduce(tensor, group=group)
            assert tensor.tolist() == [float(sum(others))] * 2
        tensor = torch.full((3,), float(r))
        dist.broadcast(tensor, src=n - 1, group=sub)  # torch's src is a global rank
        assert tensor.tolist() == [float(n - 1)] * 3
        outputs = [torch.empty(1) for _ in others]
        dist.all_gather(outputs, torch.full((1,), float(r)), group=sub)
        assert [o.item() for o in outputs] == [float(i) for i in others]
        out = torch.empty(len(others))
        dist.all_to_all_single(out, torch.arange(float(len(others))) + 10 * r, group=sub)
        assert out.tolist() == [float(others.index(r) + 10 * i) for i in others]
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    if r in ends:
        out = torch.empty(2)
        dist.scatter(out, [torch.full((2,), 10.0 * i) for i in ends] if r == n - 1 else None, src=n - 1, group=pair)
        assert out.tolist() == [10.0 * r] * 2
        tensor = torch.full((1,), float(r + 1))
        dist.reduce(tensor, dst=n - 1, group=pair)
        assert tensor.item() == (float(n + 1) if r == n - 1 else 1.0)
    dist.barrier()


@pytest.mark.min_ranks(3)
def test_a_rank_out_of_step_in_a_group_of_some_ranks_is_named() -> None:
    members = [1, 2]
    group = dist.new_group(members)
    if rank() in members:
        with pytest.raises(MismatchError, match=r"torch\.s\d+\.\d+") as caught:
            dist.all_reduce(torch.ones(3 if rank() == 1 else 4), group=group)
        assert "[3]" in str(caught.value) and "[4]" in str(caught.value)
    dist.barrier()


@pytest.mark.min_ranks(2)
def test_a_group_made_on_its_members_alone_is_refused_on_every_rank() -> None:
    with pytest.raises(UnisonNotImplementedError, match="use_local_synchronization=True"):
        dist.new_group([rank()], use_local_synchronization=True)


def test_a_device_mesh_of_one_dimension() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(DEVICE.type, (size(),))
    tensor = torch.ones(2)
    dist.all_reduce(tensor, group=mesh.get_group())
    assert tensor.tolist() == [float(size())] * 2


def test_a_cpu_tensor_beside_the_devices_in_one_job() -> None:
    """Under CUDA the two go to different data planes, one after the other, in one group."""
    on_device, on_host = torch.full((3,), float(rank() + 1)), torch.full((2,), float(rank() + 1), device="cpu")
    works = [dist.all_reduce(on_device, async_op=True), dist.all_reduce(on_host, async_op=True)]
    for work in works:
        work.wait()
    total = float(sum(range(1, size() + 1)))
    assert on_device.device.type == DEVICE.type and on_host.device.type == "cpu"
    assert on_device.tolist() == [total] * 3 and on_host.tolist() == [total] * 2


@pytest.mark.min_ranks(4)
def test_a_two_dimensional_device_mesh() -> None:
    """Its groups of some ranks (rows and columns of a 2 x n/2 grid) run on unison process sets."""
    from torch.distributed.device_mesh import init_device_mesh

    n, r = size(), rank()
    columns = n // 2
    if n % 2:
        pytest.skip("a 2 x n/2 mesh needs an even number of ranks")
    mesh = init_device_mesh(DEVICE.type, (2, columns), mesh_dim_names=("dp", "tp"))
    row, column = divmod(r, columns)
    across_row, down_column = torch.full((1,), float(r)), torch.full((1,), float(r))
    dist.all_reduce(across_row, group=mesh.get_group("tp"))
    dist.all_reduce(down_column, group=mesh.get_group("dp"))
    assert across_row.item() == float(sum(range(row * columns, (row + 1) * columns)))
    assert down_column.item() == float(column + column + columns)


def test_mixed_with_unisons_own_api() -> None:
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    x, y = data(0)
    loss = torch.nn.functional.mse_loss(model(shard(x)), shard(y))
    loss.backward()
    mean = hvd.allreduce(loss.detach(), name="metric.loss")
    _, y_all = data(0)
    assert mean.shape == ()


# -- errors ---------------------------------------------------------------------------------------------


@pytest.mark.min_ranks(2)
def test_a_rank_out_of_step_is_a_mismatch_named_on_every_rank_at_once() -> None:
    shape = (3,) if rank() == 0 else (4,)
    start = time.monotonic()
    with pytest.raises(MismatchError, match=r"torch\.pg\.(p\d+\.)?\d+") as caught:
        dist.all_reduce(torch.ones(shape))
    assert time.monotonic() - start < 5.0
    text = str(caught.value)
    assert "[3]" in text and "[4]" in text and "rank" in text
    dist.barrier()  # the group goes on


@pytest.mark.min_ranks(2)
def test_a_rank_out_of_step_in_a_repeating_program_is_caught_too() -> None:
    # once the calls repeat, their names recur (unison's cache serves them); a rank that issues one
    # more call still meets the others under one name
    for _ in range(4 * MIN_WINDOW):
        dist.all_reduce(torch.ones(8))
        dist.broadcast(torch.ones(2), src=0)
    with pytest.raises(MismatchError, match=r"torch\.pg\.p\d+\.\d+"):
        dist.all_reduce(torch.ones(5) if rank() == 1 else torch.ones(8))
    dist.barrier()


def test_more_calls_in_flight_than_the_names_window() -> None:
    tensors = [torch.full((4,), float(i)) for i in range(4 * MIN_WINDOW)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for work in works:
        work.wait()
    assert [t[0].item() for t in tensors] == [float(i * size()) for i in range(4 * MIN_WINDOW)]


@pytest.mark.min_ranks(2)
def test_a_different_collective_at_the_same_point_is_a_mismatch() -> None:
    with pytest.raises(MismatchError, match=r"ALLREDUCE on rank \[0\]; BROADCAST on rank"):
        if rank() == 0:
            dist.all_reduce(torch.ones(2))
        else:
            dist.broadcast(torch.ones(2), src=0)
    dist.barrier()


@pytest.mark.min_ranks(2)
def test_a_barrier_against_an_allreduce_of_one_float_is_a_mismatch() -> None:
    # A barrier was an allreduce of one float32 zero: against another rank's all_reduce of one float32
    # it passed, and that rank's sum lacked the barrier rank's part.
    value = torch.ones(1)
    with pytest.raises(MismatchError, match=r"BARRIER on rank \[0\]; ALLREDUCE on rank"):
        if rank() == 0:
            dist.barrier()
        else:
            dist.all_reduce(value)
    dist.barrier()
    dist.all_reduce(value)  # the group goes on: every rank's one, untouched by the failed call, summed
    assert value.item() == float(size()), value


@pytest.mark.min_ranks(2)
def test_point_to_point_is_refused_with_what_to_use() -> None:
    other = (rank() + 1) % size()
    with pytest.raises(UnisonNotImplementedError, match=r"dist\.send .* not available on the unison backend"):
        dist.send(torch.ones(1), dst=other)
    with pytest.raises(UnisonNotImplementedError, match=r"dist\.recv is not available .* \(send, recv, isend"):
        dist.recv(torch.ones(1), src=other)


@pytest.mark.min_ranks(3)
def test_a_group_in_another_order_than_its_ranks_is_refused_on_its_members() -> None:
    if rank() in (0, 2):
        with pytest.raises(UnisonNotImplementedError, match=r"dist\.new_group\(ranks=\[2, 0\]\) .* increasing order"):
            dist.new_group([2, 0], sort_ranks=False)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert dist.new_group([2, 0], sort_ranks=False) == dist.GroupMember.NON_GROUP_MEMBER
