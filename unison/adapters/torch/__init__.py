"""The PyTorch adapter (private): collectives on torch tensors, autograd, optimizer wrapper, SyncBatchNorm.

Users import ``unison.torch``, which re-exports the public names of these modules.
"""
