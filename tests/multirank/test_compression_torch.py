"""Gradient compression in the torch DistributedOptimizer across real processes: bytes each scheme
sends, cast precision, convergence of sparsified and partially synchronized training, digits accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import unison  # noqa: E402
import unison.torch as hvd  # noqa: E402

torch.set_num_threads(1)
DIM = 16
ROWS = 48  # divisible by 2 and 3 ranks

# At one rank the DistributedOptimizer exchanges nothing (as Horovod's), so no scheme compresses.
pytestmark = pytest.mark.min_ranks(2)


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def wire_bytes() -> int:
    return int(unison.statistics().backend["data_bytes"])


def least_squares() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, DIM, generator=g, dtype=torch.float64).float()
    w_true = torch.randn(DIM, 1, generator=g)
    y = x @ w_true + 0.1 * torch.randn(ROWS, 1, generator=g)
    optimum = torch.linalg.lstsq(x.double(), y.double()).solution.float()
    return x, y, optimum


def shard(t: torch.Tensor) -> torch.Tensor:
    per = t.shape[0] // hvd.size()
    return t[hvd.rank() * per : (hvd.rank() + 1) * per]


def gathered(t: torch.Tensor) -> torch.Tensor:
    return hvd.allgather(t.detach().reshape(1, -1))


def train_least_squares(compression, steps: int, lr: float = 0.05):
    x, y, optimum = least_squares()
    xs, ys = shard(x), shard(y)
    model = torch.nn.Linear(DIM, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), compression=compression)
    spread = 0.0  # largest replica disagreement over the second half of training
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()
        everywhere = gathered(model.weight)
        if step >= steps // 2:
            spread = max(spread, float((everywhere - everywhere[0]).abs().max()))
    return model.weight.detach().reshape(-1, 1), optimum, spread, opt


def test_fp16_and_bf16_stay_within_their_precision_of_the_uncompressed_average() -> None:
    base = torch.linspace(-3, 3, 1000) * (1 + hvd.rank())
    results = {}
    for name, compression in [("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16),
                              ("bf16", hvd.Compression.bf16)]:
        p = torch.nn.Parameter(torch.zeros(1000))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[(f"p.{name}", p)],
                                       compression=compression)
        (p * base).sum().backward()
        opt.synchronize()
        results[name] = p.grad.clone()
        assert p.grad.dtype == torch.float32
        stats = opt.statistics()
        assert stats["dense_bytes"] == 4000
        assert stats["payload_bytes"] == (4000 if name == "none" else 2000)
    want = results["none"]
    # one rounding of each input and one of the sum: 2 ulp at 11 (fp16) and 8 (bf16) mantissa bits
    for name, bits in [("fp16", 11), ("bf16", 8)]:
        error = (results[name] - want).abs()
        assert bool((error <= 2.0 ** (1 - bits) * want.abs() + 1e-6).all()), (name, float(error.max()))
        assert float(error.max()) > 0, f"{name} sent uncompressed gradients"


def test_fp16_and_bf16_halve_the_bytes_the_engine_sends() -> None:
    sent = {}
    for name, compression in [("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16),
                              ("bf16", hvd.Compression.bf16)]:
        p = torch.nn.Parameter(torch.zeros(4096))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[(f"w.{name}", p)],
                                       compression=compression)
        before = wire_bytes()  # before backward(): the hook may start the exchange at once
        p.sum().backward()
        opt.synchronize()
        sent[name] = wire_bytes() - before
    assert sent["fp16"] * 2 == sent["none"] == sent["bf16"] * 2


@pytest.mark.parametrize("ratio", [0.01, 0.25])
def test_topk_sends_exactly_k_index_value_pairs_per_tensor(ratio) -> None:
    sizes = {"a": 1000, "b": 37, "c": 1}
    params = {n: torch.nn.Parameter(torch.zeros(s)) for n, s in sizes.items()}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(params.values()), lr=1.0),
                                   named_parameters=list(params.items()),
                                   compression=hvd.Compression.topk(ratio))
    g = torch.Generator().manual_seed(hvd.rank())
    before = wire_bytes()  # before backward(): the hooks may start the exchanges at once
    sum((p * torch.randn(p.shape, generator=g)).sum() for p in params.values()).backward()
    opt.synchronize()
    sent = wire_bytes() - before
    k = {n: max(1, math.ceil(ratio * s)) for n, s in sizes.items()}
    payload = sum(8 * v for v in k.values())  # int32 index + float32 value
    stats = opt.statistics()
    assert stats["payload_bytes"] == payload
    assert stats["dense_bytes"] == 4 * sum(sizes.values())
    assert sent == hvd.size() * payload  # every rank receives every rank's pairs
    assert int((params["a"].grad != 0).sum()) <= hvd.size() * k["a"]


def test_threshold_sends_only_entries_above_it_and_keeps_the_rest() -> None:
    p = torch.nn.Parameter(torch.zeros(8))
    compression = hvd.Compression.threshold(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("t", p)],
                                   compression=compression)
    grad = torch.tensor([0.5, -2.0, 0.9, 3.0, 0.0, -0.6, 1.5, 0.1])
    (p * grad).sum().backward()
    opt.synchronize()
    assert opt.statistics()["payload_bytes"] == 3 * 8
    torch.testing.assert_close(p.grad, torch.tensor([0, -2.0, 0, 3.0, 0, 0, 1.5, 0]))
    np.testing.assert_allclose(compression.residual("t"), [0.5, 0, 0.9, 0, 0, -0.6, 0, 0.1])
    opt.zero_grad()
    (p * grad).sum().backward()  # residual + gradient: 1.0 stays, 1.8 and -1.2 go out
    opt.synchronize()
    torch.testing.assert_close(p.grad, torch.tensor([0, -2.0, 1.8, 3.0, 0, -1.2, 1.5, 0]))


@pytest.mark.convergence
@pytest.mark.parametrize("make", [lambda: hvd.Compression.none, lambda: hvd.Compression.topk(0.125),
                                  lambda: hvd.Compression.threshold(0.05)],
                         ids=["none", "topk", "threshold"])
def test_sparsified_training_with_error_feedback_reaches_the_least_squares_optimum(make) -> None:
    # 300 steps: 0.003 away (topk) and 0.001 (threshold), as after 1000
    w, optimum, spread, _ = train_least_squares(make(), steps=300)
    assert spread == 0.0, "replicas must stay identical when gradients are exchanged"
    assert float((w - optimum).abs().max()) < 1e-2  # from an initial distance of 1.8


@pytest.mark.convergence
def test_topk_without_error_feedback_would_not_reach_the_optimum() -> None:
    # Guards the test above: dropping the residual each step leaves a visible gap after as many steps.
    class NoFeedback(type(hvd.Compression.topk(0.125))):
        def compress(self, tensor, name=""):
            self.reset()
            return super().compress(tensor, name)

    w, optimum, _, _ = train_least_squares(NoFeedback(0.125), steps=60)
    w_ef, _, _, _ = train_least_squares(hvd.Compression.topk(0.125), steps=60)
    assert float((w - optimum).abs().max()) > float((w_ef - optimum).abs().max())


@pytest.mark.convergence
def test_partial_synchronization_keeps_replicas_close_and_converges() -> None:
    partial = hvd.Compression.partial(0.25)
    w, optimum, spread, opt = train_least_squares(partial, steps=600)
    # replicas differ (local steps on different shards) but stay within a bounded distance; the
    # optimum itself has entries of size ~1
    assert 0.0 < spread < 0.05, spread
    assert float((w - optimum).abs().max()) < 0.02
    assert partial.statistics()["steps"] == 600
    assert opt.statistics()["payload_bytes"] * 4 == opt.statistics()["dense_bytes"]


def test_powersgd_sends_the_low_rank_factors_and_small_tensors_dense() -> None:
    model = torch.nn.Linear(32, 64)  # weight 64 x 32: compressed; bias 64: dense
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.powersgd(2))
    g = torch.Generator().manual_seed(hvd.rank())
    before = wire_bytes()
    (model(torch.randn(5, 32, generator=g)) ** 2).sum().backward()
    local = model.weight.grad.clone()
    opt.synchronize()
    sent = wire_bytes() - before
    factors = 2 * (64 + 32) * 4
    assert sent == factors + 64 * 4
    stats = opt.statistics()
    assert stats["payload_bytes"] == factors + 64 * 4
    assert stats["dense_bytes"] == (64 * 32 + 64) * 4
    everywhere = gathered(model.weight.grad)
    assert bool((everywhere == everywhere[0]).all()), "ranks must apply the same approximation"
    assert torch.linalg.matrix_rank(model.weight.grad) <= 2
    assert not torch.equal(model.weight.grad, local)


def test_powersgd_on_bfloat16_parameters_factors_in_float32_and_keeps_their_dtype() -> None:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(32, 64).to(torch.bfloat16)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.powersgd(1))
    g = torch.Generator().manual_seed(hvd.rank())
    (model(torch.randn(5, 32, generator=g).to(torch.bfloat16)) ** 2).sum().backward()
    opt.step()
    assert model.weight.grad.dtype == torch.bfloat16
    everywhere = gathered(model.weight.float())
    assert bool((everywhere == everywhere[0]).all())


@pytest.mark.convergence
def test_powersgd_with_error_feedback_reaches_the_least_squares_optimum() -> None:
    """A multi-output least-squares problem (8 x 16 weight, rank-1 factors): error feedback makes the
    low-rank approximation reach the same optimum as uncompressed training; replicas stay equal."""
    outputs = 8
    g = torch.Generator().manual_seed(5)
    x = torch.randn(ROWS, DIM, generator=g)
    y = x @ torch.randn(DIM, outputs, generator=g) + 0.1 * torch.randn(ROWS, outputs, generator=g)
    optimum = torch.linalg.lstsq(x.double(), y.double()).solution.float().T
    model = torch.nn.Linear(DIM, outputs, bias=False)
    torch.nn.init.zeros_(model.weight)
    compression = hvd.Compression.powersgd(1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=compression)
    xs, ys = shard(x), shard(y)
    for _ in range(500):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys, reduction="sum").div(len(xs) * 1.0).backward()
        opt.step()
    everywhere = gathered(model.weight)
    assert bool((everywhere == everywhere[0]).all())
    distance = float((model.weight.detach() - optimum).abs().max())
    # from an initial distance of 2.9; without error feedback the same run is still 0.13 away
    assert distance < 1e-3, distance
    assert compression.statistics()["payload_bytes"] == 500 * (outputs + DIM) * 4


def test_partial_synchronization_averages_every_element_once_per_rotation() -> None:
    start = float(hvd.rank() ** 2 + 1)  # no rank starts at the mean, for any size
    params = [torch.nn.Parameter(torch.full((5,), start)), torch.nn.Parameter(torch.full((3,), start))]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), compression=hvd.Compression.partial(0.5))
    mean = sum(r ** 2 + 1 for r in range(hvd.size())) / hvd.size()
    averaged = []
    for _ in range(2):
        opt.zero_grad()
        sum(p.sum() for p in params).backward()
        opt.step()
        flat = torch.cat([p.detach() for p in params])
        averaged.append(torch.isclose(flat, torch.tensor(mean)).nonzero().reshape(-1).tolist())
    assert averaged == [list(range(4)), list(range(8))], averaged


def digits_accuracy(compression, epochs: int = 15) -> float:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=compression)
    per = 1500 // hvd.size() // 25 * 25
    mine_x, mine_y = train_x[hvd.rank() * per : (hvd.rank() + 1) * per], train_y[hvd.rank() * per : (hvd.rank() + 1) * per]
    for _ in range(epochs):
        for start in range(0, per, 25):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(mine_x[start : start + 25]), mine_y[start : start + 25]).backward()
            opt.step()
    with torch.no_grad():
        return float((model(test_x).argmax(1) == test_y).float().mean())


@pytest.mark.convergence
def test_digits_accuracy_per_scheme() -> None:
    base = digits_accuracy(hvd.Compression.none)
    assert base > 0.95
    assert digits_accuracy(hvd.Compression.fp16) >= base - 0.01
    assert digits_accuracy(hvd.Compression.bf16) >= base - 0.01
    assert digits_accuracy(hvd.Compression.topk(0.01)) >= base - 0.03
    assert digits_accuracy(hvd.Compression.threshold(0.01)) >= base - 0.03
    assert digits_accuracy(hvd.Compression.partial(0.25)) >= base - 0.03
    assert digits_accuracy(hvd.Compression.powersgd(2)) >= base - 0.03


def test_unsupported_op_is_refused() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match=r"supports op=Average .* Got op=MAX"):
        hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), compression=hvd.Compression.topk(0.5),
                                 op=hvd.Max)
