"""One rank of the CUDA SyncBatchNorm check (run by test_torch_sync_batch_norm_cuda.py under mpiexec).

Each rank normalizes its rows of a fixed global batch on its own GPU (or on a shared one, staged,
when the host has fewer GPUs than ranks) and compares output, input gradient, summed parameter
gradients and running statistics with torch's BatchNorm2d on the whole batch, on the same device.
"""

from __future__ import annotations

import torch

import unison.torch as hvd


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator().manual_seed(7)
    sizes = [2 + 3 * r for r in range(size)]  # uneven per-rank batches
    x_all = (torch.randn(sum(sizes), 5, 6, 6, generator=generator) * 2 + 0.5).to(device)
    w_all = torch.randn(sum(sizes), 5, 6, 6, generator=generator).to(device)
    start = sum(sizes[:rank])
    rows = slice(start, start + sizes[rank])

    reference = torch.nn.BatchNorm2d(5).to(device)
    with torch.no_grad():
        reference.weight.copy_(torch.linspace(0.5, 2, 5))
        reference.bias.copy_(torch.linspace(-1, 1, 5))
    sync = hvd.SyncBatchNorm(5).to(device)
    sync.load_state_dict(reference.state_dict())
    xr = x_all.clone().requires_grad_()
    (reference(xr) * w_all).sum().backward()
    xs = x_all[rows].clone().requires_grad_()
    ys = sync(xs)
    (ys * w_all[rows]).sum().backward()

    tolerance = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(xs.grad, xr.grad[rows], **tolerance)
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="wgrad"), reference.weight.grad,
                               **tolerance)
    torch.testing.assert_close(hvd.allreduce(sync.bias.grad, op=hvd.Sum, name="bgrad"), reference.bias.grad,
                               **tolerance)
    torch.testing.assert_close(sync.running_mean, reference.running_mean, **tolerance)
    torch.testing.assert_close(sync.running_var, reference.running_var, **tolerance)
    with torch.no_grad():
        fresh = torch.nn.BatchNorm2d(5, track_running_stats=False).to(device)
        fresh.load_state_dict({"weight": reference.weight, "bias": reference.bias})
        torch.testing.assert_close(ys.detach(), fresh(x_all)[rows], **tolerance)
    assert ys.device == device and xs.grad.device == device
    print(f"rank {rank}: OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
