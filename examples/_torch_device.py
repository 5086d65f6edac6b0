"""The PyTorch examples' --device option: refuse cuda without a GPU, and give each rank its local GPU.

Shared by examples/pytorch_mnist.py, pytorch_ddp_digits.py and pytorch_synthetic_benchmark.py, which import it from
this directory (``python examples/NAME.py`` puts it on the path).
"""

from __future__ import annotations

import socket

import torch

import unison.torch as hvd


def require_cuda(device: str) -> None:
    """Exit with the reason when `--device cuda` is asked for and PyTorch sees no GPU (before any rank waits)."""
    if device == "cuda" and not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise SystemExit(
            f"--device cuda needs a GPU that PyTorch can use, and torch.cuda.is_available() is False on "
            f"{socket.gethostname()} (torch {torch.__version__}, {build}). "
            "Install a CUDA build of PyTorch, check CUDA_VISIBLE_DEVICES, or run with --device cpu."
        )


def rank_device(device: str) -> torch.device:
    """This rank's device: the CPU, or the GPU numbered by its local rank (one GPU per rank, as NCCL wants)."""
    if device == "cpu":
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if hvd.local_rank() >= gpus:
        raise SystemExit(
            f"--device cuda gives each rank the GPU numbered by its local rank, and local rank "
            f"{hvd.local_rank()} (rank {hvd.rank()}) has none: {gpus} GPU(s) are visible on "
            f"{socket.gethostname()}. Start at most {gpus} rank(s) per host."
        )
    torch.cuda.set_device(hvd.local_rank())
    return torch.device("cuda", hvd.local_rank())
