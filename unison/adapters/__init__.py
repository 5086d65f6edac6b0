"""Framework adapters: turn framework tensors into engine buffers; public paths are unison.torch etc.

Nothing here is public API; ``unison.torch`` (and the other framework modules) re-export what users see.
Each adapter imports its framework only when its own module is imported.
"""
