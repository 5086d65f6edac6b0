"""DistributedOptimizer across real processes: equivalence with one process on the global batch,
gradient accumulation, torch.compile, the AMP recipe, missing gradients, and its error messages."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import unison.torch as hvd  # noqa: E402
from unison.engine.adasum import NORM_FLOOR  # noqa: E402

torch.set_num_threads(1)
GLOBAL_BATCH = 12  # divisible by 2 and 3 ranks
STEPS = 4


@pytest.fixture(scope="module", autouse=True)
def job():
    hvd.init()
    yield
    hvd.shutdown()


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)


def reductions(per_job: int) -> int:
    """The allreduces a DistributedOptimizer launches: none at one rank, where it is the plain optimizer."""
    return per_job if hvd.size() > 1 else 0


# At one rank the DistributedOptimizer installs no gradient hooks and reduces nothing (as Horovod's),
# so what the hooks check and warn about, and what only an exchange can change, needs two ranks.
NEEDS_AN_EXCHANGE = pytest.mark.min_ranks(2)


def shard(t: torch.Tensor) -> torch.Tensor:
    per = GLOBAL_BATCH // hvd.size()
    return t[hvd.rank() * per : (hvd.rank() + 1) * per]


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def train_reference(make_opt, steps: int = STEPS) -> list[torch.Tensor]:
    model = make_model()
    opt = make_opt(model.parameters())
    for step in range(steps):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_distributed(make_opt, passes: int = 1, compile_backend: str | None = None,
                      steps: int = STEPS, **kw) -> tuple[list[torch.Tensor], object]:
    model = make_model(seed=0 if hvd.rank() == 0 else 10 + hvd.rank())  # broadcast must fix the others
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kw)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    forward = torch.compile(model, backend=compile_backend) if compile_backend else model
    for step in range(steps):
        x, y = (shard(t) for t in data(step))
        opt.zero_grad()
        for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
            (torch.nn.functional.mse_loss(forward(xs), ys) / passes).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], opt


def assert_same_everywhere_and_close(got: list[torch.Tensor], want: list[torch.Tensor], atol: float) -> None:
    flat = torch.cat([p.reshape(-1) for p in got])
    gathered = hvd.allgather(flat.unsqueeze(0))
    assert torch.equal(gathered.min(0).values, gathered.max(0).values), "ranks diverged"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_one_process_on_the_global_batch(name, passes) -> None:
    want = train_reference(OPTIMIZERS[name])
    got, opt = train_distributed(OPTIMIZERS[name], passes=passes)
    assert type(opt).__name__ == OPTIMIZERS[name]([torch.zeros(1, requires_grad=True)]).__class__.__name__
    assert opt.statistics()["allreduces"] == reductions(4 * STEPS)
    assert_same_everywhere_and_close(got, want, atol=1e-5)


@NEEDS_AN_EXCHANGE
def test_cpu_gradients_are_submitted_at_step_in_one_batch_unless_cpu_overlap() -> None:
    import unison

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x = torch.full((1, 3), float(hvd.rank() + 1))
    model(x).sum().backward()
    local = [p.grad.clone() for p in model.parameters()]
    assert opt.statistics()["allreduces"] == 0, "a CPU gradient was submitted during backward()"
    before = unison.statistics().responses
    opt.step()
    assert opt.statistics()["allreduces"] == 4
    assert unison.statistics().responses - before == 1, "the four small gradients were not fused in one cycle"
    gathered = [hvd.allgather(g.unsqueeze(0)) for g in local]
    for p, g in zip(model.parameters(), gathered):
        torch.testing.assert_close(p.grad, g.mean(0))

    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    overlapping = hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1),
                                           named_parameters=other.named_parameters(), cpu_overlap=True)
    other(x).sum().backward()
    assert overlapping.statistics()["allreduces"] == 4  # submitted from the hooks
    overlapping.step()


def test_cpu_overlap_matches_one_process_on_the_global_batch() -> None:
    want = train_reference(OPTIMIZERS["adam"])
    got, opt = train_distributed(OPTIMIZERS["adam"], passes=2, cpu_overlap=True)
    assert opt.statistics()["allreduces"] == reductions(4 * STEPS)
    assert_same_everywhere_and_close(got, want, atol=1e-5)


@NEEDS_AN_EXCHANGE  # at one rank a sum is the average
def test_without_averaging_the_result_differs() -> None:
    # Guards the equivalence test itself: Sum instead of Average must not match.
    want = train_reference(OPTIMIZERS["sgd_momentum"])
    got, _ = train_distributed(OPTIMIZERS["sgd_momentum"], op=hvd.Sum)
    assert any(not torch.allclose(g, w, atol=1e-3) for g, w in zip(got, want))


def test_predivide_factor_and_fp16_compression_and_groups_keep_the_average() -> None:
    want = train_reference(OPTIMIZERS["sgd_momentum"])
    got, opt = train_distributed(OPTIMIZERS["sgd_momentum"], gradient_predivide_factor=2.0, num_groups=2)
    assert opt.statistics()["grouped_allreduces"] == reductions(2 * STEPS)
    assert_same_everywhere_and_close(got, want, atol=1e-5)
    got, _ = train_distributed(OPTIMIZERS["sgd_momentum"], compression=hvd.Compression.fp16)
    assert_same_everywhere_and_close(got, want, atol=2e-3)


def test_under_torch_compile() -> None:
    # aot_eager runs dynamo and AOT autograd (where module hooks are lost) without a C++ build.
    want = train_reference(OPTIMIZERS["adam"])
    got, opt = train_distributed(OPTIMIZERS["adam"], compile_backend="aot_eager")
    assert opt.statistics()["allreduces"] == reductions(4 * STEPS)
    assert_same_everywhere_and_close(got, want, atol=1e-5)


def amp_step(model, opt, scaler, x, y, distributed: bool) -> None:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    if distributed:
        opt.synchronize()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with opt.skip_synchronize() if distributed else contextlib.nullcontext():
        scaler.step(opt)
    scaler.update()


def test_amp_recipe_with_grad_scaler_and_clipping() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(STEPS):
        amp_step(model, opt, scaler, *data(step), distributed=False)
    want = [p.detach().clone() for p in model.parameters()]

    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(STEPS):
        x, y = (shard(t) for t in data(step))
        amp_step(model, opt, scaler, x, y, distributed=True)
    stats = opt.statistics()
    assert stats["allreduces"] == reductions(4 * STEPS) and stats["steps"] == STEPS  # one reduction per step
    got = [p.detach().clone() for p in model.parameters()]
    assert_same_everywhere_and_close(got, want, atol=2e-2)


def test_missing_gradient_is_zero_filled_without_hanging() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    params = [("a.weight", a.weight), ("a.bias", a.bias), ("b.weight", b.weight), ("b.bias", b.bias)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=1.0), named_parameters=params)
    x = torch.ones(1, 2)
    out = a(x) + (b(x) if hvd.rank() == 0 else 0)  # only rank 0 uses b
    out.sum().backward()
    opt.synchronize()
    # rank 0's grad of b.bias is [1, 1]; averaged with the others' zeros
    torch.testing.assert_close(b.bias.grad, torch.full((2,), 1.0 / hvd.size()))
    assert opt.statistics()["missing_filled"] == (0 if hvd.rank() == 0 else 2)
    opt.step()


def test_missing_gradient_error_names_the_parameters() -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    params = [("a.weight", a.weight), ("a.bias", a.bias), ("b.weight", b.weight), ("b.bias", b.bias)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=1.0), named_parameters=params,
                                   missing_grads="error")
    x = torch.ones(1, 2)
    (a(x) + (b(x) if hvd.rank() == 0 else 0)).sum().backward()
    error = None
    try:
        opt.step()
    except hvd.MissingGradientError as caught:
        error = str(caught)
    # every rank completed the same reductions, so the job goes on (named: rank 1 made two extra
    # submissions, and unnamed op names count submissions)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_missing").item() == hvd.size()
    if hvd.rank() == 0:
        assert error is None
    else:
        assert error is not None and error.startswith(
            f"2 parameter(s) produced no gradient on rank {hvd.rank()} before step(): b.bias, b.weight.")


@NEEDS_AN_EXCHANGE
def test_model_differing_across_ranks_names_the_parameter() -> None:
    width = 3 + hvd.rank() % 2
    model = torch.nn.Linear(width, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, width)).sum().backward()
    with pytest.raises(hvd.HorovodInternalError, match=r"Mismatched ALLREDUCE tensor shapes for 'allreduce\.weight': \[2, 3\] on rank"):
        opt.step()


@NEEDS_AN_EXCHANGE
def test_too_many_backward_passes_and_early_zero_grad_raise() -> None:
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(AssertionError, match=r"optimizer.zero_grad\(\) was called after loss.backward\(\)"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match=r"Gradients were computed more than backward_passes_per_step "
                       r"times before call to step\(\)\. Parameter '(weight|bias)'"):
        model(torch.ones(1, 2)).sum().backward()
    opt.step()


@NEEDS_AN_EXCHANGE
def test_a_user_hook_that_returns_a_value_is_named_instead_of_a_key_error() -> None:
    model = torch.nn.Linear(2, 1)
    model.weight.register_post_accumulate_grad_hook(lambda param: param.grad * 2)  # returns: a mistake
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match=r"gradient hook received a tensor that is not one of its parameters "
                       r"\(a Tensor of shape \[1, 2\]\): a post-accumulate-grad hook .* Make such hooks return None"):
        model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()  # the job goes on: what was launched completes on every rank


@NEEDS_AN_EXCHANGE
def test_partial_accumulation_window_warns_and_is_flushed() -> None:
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=3)
    model(torch.ones(1, 2) * (hvd.rank() + 1)).sum().backward()
    with pytest.warns(UserWarning, match=r"after 1 of backward_passes_per_step=3 backward passes"):
        opt.synchronize()
    mean = sum(range(1, hvd.size() + 1)) / hvd.size()
    torch.testing.assert_close(model.weight.grad, torch.full((1, 2), mean))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()


def test_argument_errors_use_horovods_messages() -> None:
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"named_parameters should be a sequence of tuples \(name, parameter\)"):
        hvd.DistributedOptimizer(sgd, named_parameters=list(model.parameters()))
    with pytest.raises(ValueError, match=r"Parameter names in named_parameters must be unique. Found duplicates: w"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("w", model.weight), ("w", model.bias)])
    with pytest.raises(ValueError, match=r"named_parameters was specified, but one or more model parameters "
                       r"were not named. Python object ids: \d+"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("w", model.weight)])
    with pytest.raises(ValueError, match=r"gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match=r"missing_grads must be one of \('zero', 'error'\)"):
        hvd.DistributedOptimizer(sgd, missing_grads="ignore")
    with pytest.raises(ValueError, match=r"backward_passes_per_step must be an integer >= 1. Got 0"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)


def test_wrapper_shares_state_with_the_wrapped_instance() -> None:
    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(sgd)
    assert opt.param_groups is sgd.param_groups and opt.state is sgd.state
    assert isinstance(opt, torch.optim.SGD) and type(opt) is not torch.optim.SGD
    assert sorted(opt._parameter_names.values()) == ["allreduce.noname.0.0", "allreduce.noname.0.1"]
    model(torch.ones(1, 2) * hvd.rank()).sum().backward()
    opt.step()
    np.testing.assert_allclose(model.bias.grad.numpy(), [1.0])


def _adasum_tree(deltas: list[torch.Tensor]) -> torch.Tensor:
    """Adasum of one tensor's per-rank values written out: pairs (0,1), (2,3), ..., then the results."""
    level = [d.double() for d in deltas]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            dot, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
            ca = 1.0 - dot / aa / 2 if aa >= NORM_FLOOR else 1.0
            cb = 1.0 - dot / bb / 2 if bb >= NORM_FLOOR else 1.0
            nxt.append(ca * a + cb * b)
        level = nxt
    return level[0].float()


def test_adasum_steps_locally_then_moves_by_the_adasum_of_the_ranks_changes() -> None:
    size, per = hvd.size(), GLOBAL_BATCH // hvd.size()
    if size & (size - 1):
        pytest.skip("Adasum needs 1, 2, 4, ... ranks")
    # the reference: every rank's model and Adam state in this process
    models = [make_model() for _ in range(size)]
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in models]
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    for step in range(3):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(shard(x)), shard(y)).backward()
        opt.step()
        before = [p.detach().clone() for p in models[0].parameters()]
        for r, (m, o) in enumerate(zip(models, opts)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per]).backward()
            o.step()
        with torch.no_grad():
            for i, old in enumerate(before):
                moved = old + _adasum_tree([list(m.parameters())[i].detach() - old for m in models])
                for m in models:
                    list(m.parameters())[i].copy_(moved)
    for got, want in zip(model.parameters(), models[0].parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather(torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], 1))
    assert all(torch.equal(gathered[0], row) for row in gathered), "ranks hold different parameters"
    if size > 1:
        assert opt.statistics()["grouped_allreduces"] == 3 and opt.statistics()["allreduces"] == 0
        with pytest.raises(ValueError, match=r"skip_synchronize\(\) cannot be used with op=Adasum"):
            with opt.skip_synchronize():
                pass


def test_adasum_optimizer_refuses_a_size_that_is_not_a_power_of_two() -> None:
    if hvd.size() & (hvd.size() - 1) == 0:
        pytest.skip("needs a size that is not a power of two")
    model = make_model()
    with pytest.raises(NotImplementedError, match=r"Running Adasum with non-power of 2 ranks is not supported yet"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)


@NEEDS_AN_EXCHANGE
def test_step_after_synchronize_without_skip_synchronize_warns_once_and_reduces_once() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    for step in range(2):
        opt.zero_grad()
        model(torch.ones(1, 2) * (hvd.rank() + 1)).sum().backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        messages = [str(w.message) for w in caught]
        if step == 0:
            assert len(messages) == 1 and messages[0].startswith(
                "optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize()."), messages
            assert "with optimizer.skip_synchronize():" in messages[0]
        else:
            assert messages == []  # once per optimizer
    assert opt.statistics()["allreduces"] == 2  # one per step: step() did not reduce again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()  # step() alone reduces and does not warn


def test_sparse_as_dense_hands_sparse_adam_a_sparse_gradient() -> None:
    def make() -> torch.nn.Embedding:
        torch.manual_seed(3)
        return torch.nn.Embedding(10, 3, sparse=True)

    def batch(step: int) -> torch.Tensor:
        return torch.randint(0, 10, (GLOBAL_BATCH,), generator=torch.Generator().manual_seed(7 + step))

    reference = make()
    ref_opt = torch.optim.SparseAdam(reference.parameters(), lr=0.1)
    for step in range(3):
        ref_opt.zero_grad()
        reference(batch(step)).square().mean().backward()
        ref_opt.step()

    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sparse_as_dense=True)
    for step in range(3):
        opt.zero_grad()
        model(shard(batch(step))).square().mean().backward()
        assert model.weight.grad is not None and model.weight.grad.is_sparse
        opt.synchronize()
        grad = model.weight.grad
        assert grad.is_sparse and grad.sparse_dim() == 1, grad.layout  # rows, as autograd made it
        with opt.skip_synchronize():
            opt.step()
    assert_same_everywhere_and_close([model.weight.detach()], [reference.weight.detach()], atol=1e-5)
