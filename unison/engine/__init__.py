"""The engine: one thread per process that runs the protocol (`unison.protocol`) and the collectives.

Here live the threaded parts: the loop (``loop.py``, the `Engine`: exchange, decide, act), the
submission queue framework threads fill and the loop drains (``queue.py``), this rank's pending work
against the response cache (``pending.py``), the executor that packs,
reduces and unpacks buffers (``executor.py``), the autotuner's run-time side (``autotuning.py``), and
what watches the cycles without steering them (``observer.py``): rank 0's timeline writer
(``timeline.py``) and stall feed (``stall_feed.py``). Every decision they act on comes from
`unison.protocol`, pure code unit-tested without MPI; which action a response of each kind takes is
the table in ``protocol/dispatch.py``.

One cycle, as run by the engine thread of every rank (``loop.py``, `Engine._cycle`):

1. **Drain.** Requests enqueued by framework threads since the last cycle (``queue.py``) are classified
   (``pending.py``) against the
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
   run in the same order on every rank, each as ``protocol/dispatch.py`` routes its kind (a collective
   by the executor, ``executor.py``; a stop, an error, a join or a process set by the loop); handles
   complete.
5. **Cache update.** Fresh allreduce responses are inserted into every rank's cache, in the same order,
   so the caches never need comparing; erased or evicted slots send their pending requests back
   through negotiation.

Rank 0 also feeds the stall inspector (``protocol/stall.py``) from the coordinator's table and the vote matrix
(``stall_feed.py``), and writes the timeline (``timeline.py``): both observe the cycle (``observer.py``).
With ``UNISON_AUTOTUNE``, rank 0 measures each cycle and every rank applies the autotuner's changes at
the end of the same cycle (``autotuning.py``; the search is ``protocol/autotune.py``).
"""
