"""The protocol, as pure functions and classes over plain data: no threads, no sockets, no MPI.

- ``messages.py``: requests and responses, and their JSON wire format.
- ``cycle.py``: the status row every rank sends each cycle, and what the gathered matrix decides.
- ``negotiation.py``: rank 0's `Coordinator`, which orders the collectives and checks that ranks agree.
- ``names.py``: checks across names (one name under two kinds, unnamed calls out of step).
- ``cache.py``: the response cache, identical on every rank.
- ``partition.py``: how counts split among ranks (reducescatter rows, the pieces of a half-precision sum).
- ``fusion.py``: which responses run fused, and in what order.
- ``dispatch.py``: what each response kind does, and which ranks act on it.
- ``stall.py``: the stall inspector.
- ``autotune.py``: the autotuner's search.

`unison.engine` runs them: its package docstring walks one cycle through these files in order.
"""
