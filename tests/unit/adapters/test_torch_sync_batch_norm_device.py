"""SyncBatchNorm's device-neutral statistics: equal to BatchNorm on the global batch, and never read by the host."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from unison.adapters.torch import sync_batch_norm as sbn  # noqa: E402
from unison.errors import InvalidArgumentError  # noqa: E402


class _ThreadWorld:
    """Ranks as threads: allgather concatenates and allreduce sums what every thread handed in."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=30)
        self._slots: list[Any] = [None] * size
        self._local = threading.local()

    def enter(self, rank: int) -> None:
        self._local.rank = rank

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self._slots[self._local.rank] = tensor
        self._barrier.wait()
        everyone = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every thread read them all
        return everyone

    def allgather_async(self, tensor: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        return torch.cat(self._exchange(tensor))

    def allreduce_async(self, tensor: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        return torch.stack(self._exchange(tensor)).sum(0)


class _Job:
    def __init__(self, size: int) -> None:
        self.size = size

    def next_name_index(self, key: Any) -> int:
        return 1


def _run_ranks(world: _ThreadWorld, fn: Any) -> list[Any]:
    results: list[Any] = [None] * world.size
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        world.enter(rank)
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> _ThreadWorld:
    made = _ThreadWorld(3)
    monkeypatch.setattr(sbn.c, "allgather_async", made.allgather_async)
    monkeypatch.setattr(sbn.c, "allreduce_async", made.allreduce_async)
    monkeypatch.setattr(sbn.c, "synchronize", lambda value: value)
    monkeypatch.setattr(sbn, "job", lambda: _Job(made.size))
    return made


@pytest.mark.parametrize("shape", [(2, 4), (2, 4, 5), (2, 4, 3, 3)])
def test_three_ranks_with_uneven_batches_match_batch_norm_on_the_global_batch(world: _ThreadWorld,
                                                                               shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    rows = [slice(0, 1), slice(1, 5), slice(5, 7)]  # 1, 4 and 2 samples
    x_all = torch.randn(7, *shape[1:], dtype=torch.float64) * 3 + 1
    w_all = torch.randn(7, *shape[1:], dtype=torch.float64)
    reference = (torch.nn.BatchNorm1d(4) if len(shape) <= 3 else torch.nn.BatchNorm2d(4)).double()
    with torch.no_grad():
        reference.weight.copy_(torch.linspace(0.5, 2, 4))
        reference.bias.copy_(torch.linspace(-1, 1, 4))
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    xr = x_all.clone().requires_grad_()
    (reference(xr) * w_all).sum().backward()

    def rank_step(rank: int) -> tuple[Any, ...]:
        layer = sbn.SyncBatchNorm(4).double()
        layer.load_state_dict(initial)
        xs = x_all[rows[rank]].clone().requires_grad_()
        ys = layer(xs)
        (ys * w_all[rows[rank]]).sum().backward()
        return ys.detach(), xs.grad, layer.weight.grad, layer.bias.grad, layer.running_mean, layer.running_var

    outcome = _run_ranks(world, rank_step)
    torch.testing.assert_close(torch.cat([o[0] for o in outcome]), _normalized(reference, x_all))
    torch.testing.assert_close(torch.cat([o[1] for o in outcome]), xr.grad)
    torch.testing.assert_close(sum(o[2] for o in outcome), reference.weight.grad)
    torch.testing.assert_close(sum(o[3] for o in outcome), reference.bias.grad)
    for o in outcome:
        torch.testing.assert_close(o[4], reference.running_mean)
        torch.testing.assert_close(o[5], reference.running_var)


def _normalized(reference: torch.nn.Module, x_all: torch.Tensor) -> torch.Tensor:
    flat = x_all.transpose(0, 1).reshape(4, -1)
    view = (1, 4) + (1,) * (x_all.dim() - 2)
    y = (x_all - flat.mean(1).view(view)) / torch.sqrt(flat.var(1, unbiased=False).view(view) + reference.eps)
    return (y * reference.weight.view(view) + reference.bias.view(view)).detach()


def test_a_global_batch_of_one_sample_keeps_the_running_variance_finite(world: _ThreadWorld) -> None:
    def rank_step(rank: int) -> torch.Tensor:
        layer = sbn.SyncBatchNorm(2)
        layer(torch.ones(1 if rank == 1 else 0, 2))
        return layer.running_var

    for running_var in _run_ranks(world, rank_step):
        torch.testing.assert_close(running_var, torch.full((2,), 0.9))  # 0.9 * 1 + 0.1 * 0


def test_an_empty_batch_on_every_rank_is_refused_on_every_rank(world: _ThreadWorld) -> None:
    failures: list[str] = []

    def rank_step(rank: int) -> None:
        try:
            sbn.SyncBatchNorm(2)(torch.ones(0, 2))
        except InvalidArgumentError as exc:
            failures.append(str(exc))

    _run_ranks(world, rank_step)
    assert failures == ["SyncBatchNorm got an empty batch on every rank."] * 3


def test_combine_statistics_equals_the_moments_of_the_concatenation() -> None:
    torch.manual_seed(1)
    parts = [torch.randn(n, 3, 2, dtype=torch.float64) * (n + 1) for n in (5, 1, 0, 8)]
    rows = torch.cat([sbn.local_statistics(p) for p in parts])
    mean, var, total = sbn.combine_statistics(rows, 3)
    flat = torch.cat(parts).transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(mean, flat.mean(1))
    torch.testing.assert_close(var, flat.var(1, unbiased=False))
    assert total.dim() == 0 and total.item() == 14 * 2  # samples times positions


def test_forward_and_backward_never_read_a_statistic_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the meta device any host read (``.item()``, ``float()``, ``if tensor``) raises: the code path a
    CUDA input takes must keep the statistics on the device from the exchange to the output."""
    exchanged: list[tuple[str, str]] = []

    def allgather_async(tensor: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        exchanged.append(("allgather", tensor.device.type))
        return torch.cat([tensor, tensor])

    def allreduce_async(tensor: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        exchanged.append(("allreduce", tensor.device.type))
        return tensor * 2

    monkeypatch.setattr(sbn.c, "allgather_async", allgather_async)
    monkeypatch.setattr(sbn.c, "allreduce_async", allreduce_async)
    monkeypatch.setattr(sbn.c, "synchronize", lambda value: value)
    x = torch.empty(8, 3, 4, device="meta", requires_grad=True)
    weight = torch.empty(3, device="meta", requires_grad=True)
    bias = torch.empty(3, device="meta", requires_grad=True)
    running_mean, running_var = torch.empty(3, device="meta"), torch.empty(3, device="meta")
    y = sbn._SyncBatchNormFunction.apply(x, weight, bias, running_mean, running_var, 1e-5, 0.1, "sbn")
    y.backward(torch.empty_like(y))
    assert y.device.type == "meta" and x.grad is not None and x.grad.shape == x.shape
    assert exchanged == [("allgather", "meta"), ("allreduce", "meta")]
