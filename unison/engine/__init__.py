"""The engine: one thread per process that runs the protocol (`unison.protocol`) and the collectives.

Here live the threaded parts: the loop (``loop.py``, the `Engine`), the executor that packs, reduces
and unpacks buffers (``executor.py``), and the timeline writer (``timeline.py``). Every decision they
act on comes from `unison.protocol`, pure code unit-tested without MPI.

One cycle, as run by the engine thread of every rank (``loop.py``, `Engine._cycle`):

1. **Drain.** Requests enqueued by framework threads since the last cycle are classified against the
   response cache (``protocol/cache.py``): a *hit* (same name and attributes as a response negotiated before)
   only needs a vote; a *miss* must go to the coordinator; an *invalid* entry (same name, other
   attributes) marks its slot for erasure on every rank.
2. **Status exchange.** Every rank contributes one row of uint64 words: flags (joined, rank 0 has
   news), the byte length of its uncached requests, one bit per cache slot it votes for, and one bit per
   slot it found invalid. One allgather gives every rank the whole matrix, so every rank computes the
   same decisions from the same data (``protocol/cycle.py``): the slots every rank voted for run now
   (the *fast path*: in steady-state training this exchange is the whole negotiation).
3. **Slow path** (only if some row has uncached bytes, or rank 0 has news): the request lists are
   gathered to rank 0, whose `Coordinator` (``protocol/negotiation.py``, pure logic) remembers them across
   cycles, checks that ranks agree on each tensor that every member has submitted, and answers with an
   ordered response list (or error responses that name the ranks grouped by value). The list is
   broadcast.
4. **Execute.** Cached responses (ascending slot order) then fresh ones are fused (``protocol/fusion.py``) and
   run by the executor (``executor.py``) in the same order on every rank; handles complete.
5. **Cache update.** Fresh allreduce responses are inserted into every rank's cache, in the same order,
   so the caches never need comparing; erased or evicted slots send their pending requests back
   through negotiation.

Rank 0 also feeds the stall inspector (``protocol/stall.py``) from the coordinator's table and the vote matrix,
and writes the timeline (``timeline.py``).
"""
