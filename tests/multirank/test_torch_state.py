"""Initial-state sync and SyncBatchNorm across real processes."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
import unison.torch as hvd  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def all_optimizer_classes() -> list[type]:
    return sorted((c for _, c in inspect.getmembers(torch.optim, inspect.isclass)
                   if issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer),
                  key=lambda c: c.__name__)


def make(cls: type, params) -> torch.optim.Optimizer:
    return cls(params, lr=0.01 * (hvd.rank() + 1))


def fingerprint(opt: torch.optim.Optimizer) -> torch.Tensor:
    """All state tensors and numeric hyperparameters flattened into one float64 vector."""
    sd = opt.state_dict()
    values = []
    for pid in sorted(sd["state"]):
        for key in sorted(sd["state"][pid]):
            v = sd["state"][pid][key]
            values.append(torch.as_tensor(v, dtype=torch.float64).reshape(-1))
    for group in sd["param_groups"]:
        for key in sorted(group):
            v = group[key]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                values.append(torch.tensor([float(v)], dtype=torch.float64))
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)


def same_on_every_rank(t: torch.Tensor, name: str) -> bool:
    lengths = hvd.allgather(torch.tensor([t.numel()]), name=f"{name}.len")
    if len(set(lengths.tolist())) != 1:
        return False
    gathered = hvd.allgather(t.unsqueeze(0), name=f"{name}.values")
    return bool(torch.equal(gathered.min(0).values, gathered.max(0).values))


@pytest.mark.parametrize("cls", all_optimizer_classes(), ids=lambda c: c.__name__)
def test_broadcast_optimizer_state_for_every_optimizer(cls) -> None:
    torch.manual_seed(hvd.rank())
    sparse = cls.__name__ == "SparseAdam"
    model = torch.nn.Embedding(5, 3, sparse=True) if sparse else torch.nn.Linear(3, 2, bias=cls.__name__ != "Muon")
    opt = make(cls, model.parameters())
    if cls is torch.optim.LBFGS:
        with pytest.raises(ValueError, match=r"cannot broadcast torch.optim.LBFGS state"):
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        return
    # rank 0 has taken steps (state exists); the others have none yet (lazily created state)
    if hvd.rank() == 0:
        for _ in range(2):
            opt.zero_grad()
            out = model(torch.tensor([1, 2])) if sparse else model(torch.randn(4, 3))
            out.pow(2).sum().backward()
            opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before_root = fingerprint(opt) if hvd.rank() == 0 else None
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert same_on_every_rank(fingerprint(opt), f"fp.{cls.__name__}")
    if before_root is not None:
        assert torch.equal(fingerprint(opt), before_root)  # the root's state is untouched (no dummy step)
    assert opt.param_groups[0]["lr"] == 0.01
    # and training continues identically everywhere
    opt.zero_grad()
    out = model(torch.tensor([0, 3])) if sparse else model(torch.ones(2, 3))
    out.pow(2).sum().backward()
    opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert same_on_every_rank(params, f"params.{cls.__name__}")


@pytest.mark.parametrize("cls", [c for c in all_optimizer_classes() if c is not torch.optim.LBFGS],
                         ids=lambda c: c.__name__)
def test_broadcast_optimizer_state_gives_every_trainable_parameter_a_grad(cls) -> None:
    """As after Horovod's: a zero .grad where there was none; nothing else changes, bit for bit."""
    torch.manual_seed(hvd.rank())
    sparse = cls.__name__ == "SparseAdam"
    model = torch.nn.Embedding(5, 3, sparse=True) if sparse else torch.nn.Linear(3, 2, bias=cls.__name__ != "Muon")
    frozen = torch.nn.Parameter(torch.ones(2, 3), requires_grad=False)
    opt = make(cls, [*model.parameters(), frozen])
    if hvd.rank() == 0:
        for _ in range(2):
            out = model(torch.tensor([1, 2])) if sparse else model(torch.randn(4, 3))
            out.pow(2).sum().backward()
            opt.step()
            opt.zero_grad()  # set_to_none: the root has state but no grads, the others neither
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    existing = None
    if not sparse:
        existing = model.weight.grad = torch.full_like(model.weight, hvd.rank() + 0.5)
    values = [p.detach().clone() for p in model.parameters()]
    root_state = fingerprint(opt) if hvd.rank() == 0 else None
    states_before = len(opt.state)

    hvd.broadcast_optimizer_state(opt, root_rank=0)

    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype
        assert p.grad.is_sparse == sparse  # as Horovod's: SparseAdam's zero gradients are sparse
        if p.grad is not existing:
            assert not p.grad.to_dense().any()
    if existing is not None:  # a gradient that was there is left alone
        assert model.weight.grad is existing
        assert torch.equal(existing, torch.full_like(existing, hvd.rank() + 0.5))
    assert frozen.grad is None
    assert all(torch.equal(p.detach(), v) for p, v in zip(model.parameters(), values))
    assert same_on_every_rank(fingerprint(opt), f"grad.fp.{cls.__name__}")
    if root_state is not None:
        assert torch.equal(fingerprint(opt), root_state) and len(opt.state) == states_before
    # backward() accumulates into the zero gradients and the next step runs as usual
    out = model(torch.tensor([0, 3])) if sparse else model(torch.ones(2, 3))
    out.pow(2).sum().backward()
    if existing is not None:
        model.weight.grad = None  # the rank-specific gradient above is not part of training
        model(torch.ones(2, 3)).pow(2).sum().backward()
    opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert same_on_every_rank(params, f"grad.params.{cls.__name__}")


def test_broadcast_parameters_forms_and_errors() -> None:
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model[1].running_mean.fill_(hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=hvd.size() - 1)
    flat = torch.cat([t.reshape(-1).double() for t in model.state_dict().values()])
    assert same_on_every_rank(flat, "sd")
    assert model[1].running_mean.tolist() == [float(hvd.size() - 1)] * 3
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    with pytest.raises(ValueError, match=r"invalid params of type: <class 'int'>"):
        hvd.broadcast_parameters(3, root_rank=0)


@pytest.mark.parametrize("shape", [(6, 4), (6, 4, 5), (6, 4, 3, 3)], ids=["1d", "2d-seq", "image"])
def test_sync_batch_norm_matches_batch_norm_on_the_concatenated_batch(shape) -> None:
    size, rank = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(7)
    # uneven per-rank batches: rank r holds r + 2 samples
    counts = [r + 2 for r in range(size)]
    x_all = torch.randn(sum(counts), *shape[1:], generator=g, dtype=torch.float64) * 3 + 1
    w_all = torch.randn(x_all.shape, generator=g, dtype=torch.float64)
    start = sum(counts[:rank])
    rows = slice(start, start + counts[rank])

    reference = torch.nn.BatchNorm1d(4) if len(shape) < 4 else torch.nn.BatchNorm2d(4)
    reference = reference.double()
    with torch.no_grad():
        reference.weight.copy_(torch.linspace(0.5, 2, 4))
        reference.bias.copy_(torch.linspace(-1, 1, 4))
    sync = hvd.SyncBatchNorm(4).double()
    sync.load_state_dict(reference.state_dict())

    xr = x_all.clone().requires_grad_()
    (reference(xr) * w_all).sum().backward()
    xs = x_all[rows].clone().requires_grad_()
    ys = sync(xs)
    (ys * w_all[rows]).sum().backward()

    torch.testing.assert_close(ys.detach(), _ref_out(reference, x_all, rows))
    torch.testing.assert_close(xs.grad, xr.grad[rows])
    weight_grad = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name=f"wgrad.{len(shape)}")
    bias_grad = hvd.allreduce(sync.bias.grad, op=hvd.Sum, name=f"bgrad.{len(shape)}")
    torch.testing.assert_close(weight_grad, reference.weight.grad)
    torch.testing.assert_close(bias_grad, reference.bias.grad)
    torch.testing.assert_close(sync.running_mean, reference.running_mean)
    torch.testing.assert_close(sync.running_var, reference.running_var)
    sync.eval()
    reference.eval()
    torch.testing.assert_close(sync(x_all[rows]), reference(x_all[rows]))


def _ref_out(reference: torch.nn.Module, x_all: torch.Tensor, rows: slice) -> torch.Tensor:
    """BatchNorm output on the whole batch without touching the reference's running statistics."""
    with torch.no_grad():
        mean = x_all.transpose(0, 1).reshape(4, -1).mean(1)
        var = x_all.transpose(0, 1).reshape(4, -1).var(1, unbiased=False)
        view = (1, 4) + (1,) * (x_all.dim() - 2)
        y = (x_all - mean.view(view)) / torch.sqrt(var.view(view) + reference.eps)
        return (y * reference.weight.view(view) + reference.bias.view(view))[rows]


def test_sync_batch_norm_backward_from_another_thread_as_torch_runs_it_on_cuda() -> None:
    """torch runs backward of CUDA tensors in its own device thread; the layers' exchanges are named
    per layer, so they pair across ranks from any thread, and two layers never pair with each other."""
    import threading

    if hvd.size() == 1:
        pytest.skip("SyncBatchNorm is plain BatchNorm at size 1: nothing is exchanged")
    torch.manual_seed(3)
    model = torch.nn.Sequential(hvd.SyncBatchNorm(3), torch.nn.Linear(3, 3), hvd.SyncBatchNorm(3)).double()
    reference = torch.nn.Sequential(torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(11)
    x_all = torch.randn(2 * hvd.size(), 3, generator=g, dtype=torch.float64)
    rows = slice(2 * hvd.rank(), 2 * hvd.rank() + 2)
    xr = x_all.clone().requires_grad_()
    reference(xr).pow(2).sum().backward()
    for _ in range(2):  # the second step reuses the layers' names
        xs = x_all[rows].clone().requires_grad_()
        loss = model(xs).pow(2).sum()
        failures: list[BaseException] = []

        def backward(loss: torch.Tensor, failures: list[BaseException]) -> None:
            try:
                loss.backward()
            except BaseException as exc:  # noqa: BLE001 - reported below, on this rank
                failures.append(exc)

        worker = threading.Thread(target=backward, args=(loss, failures), name="autograd-like")
        worker.start()
        worker.join(60)
        assert not worker.is_alive() and not failures, failures
        torch.testing.assert_close(xs.grad, xr.grad[rows])
    names = [m._collective_name[1] for m in model if isinstance(m, hvd.SyncBatchNorm)]
    assert len(set(names)) == 2 and all(n.startswith("sync_batch_norm.") for n in names)


def test_sync_batch_norm_input_check() -> None:
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        hvd.SyncBatchNorm(3)(torch.ones(3))
