"""The GPU data plane's device-neutral parts: which rank uses which GPU, and one NCCL communicator per set and device.

Nothing here imports CUDA, CuPy or NCCL: these are the decisions the data plane makes from plain data,
unit-tested on CPU machines. `placement.py` checks the rank-to-GPU map (NCCL refuses two ranks on one
device, with an error that does not say which ranks); `communicators.py` keeps the lazily made
communicators, keyed by process set and device.
"""
