"""The engine: one thread per process that runs the protocol (`unison.protocol`) and the collectives.

Here live the threaded parts: the engine (``loop.py``, `Engine`: its lifecycle, and which thread runs
each cycle), what a cycle does (``cycles.py``: exchange, decide, act), the status exchange
(``status.py``), the slow path (``slow_path.py``), each response kind's action (``actions.py``), the
submission queue framework threads fill (``queue.py``), this rank's pending work against the response
cache (``pending.py``), the executor that packs, reduces and unpacks buffers (``executor.py``), the
autotuner's run-time side (``autotuning.py``), and what watches the cycles without steering them
(``observer.py``): rank 0's timeline writer (``timeline.py``); rank 0's stall feed (``stall_feed.py``)
takes the cycles' votes. Every
decision they act on comes from `unison.protocol`, pure code unit-tested without MPI; which action a
response of each kind takes is the table in ``protocol/dispatch.py``.

One cycle runs at a time, under the engine's cycle lock, on the thread that waits for its result when
no other cycle runs (a blocking call's own, `Engine.drive`, `run_now`, `run_steady`), else on the engine
thread, which runs the cycles nobody waits in. One cycle, as every rank runs it (``cycles.py``):

1. **Drain.** Requests submitted since the last cycle (``queue.py``) are classified (``pending.py``)
   against the response cache (``protocol/cache.py``): a *hit* (same name and attributes as a response
   negotiated before) only needs a vote; a *miss* must go to the coordinator; an *invalid* entry (same
   name, other attributes) marks its slot for erasure on every rank.
2. **Status exchange** (``status.py``). Every rank reduces one vector of uint64 words with a bitwise
   AND: one bit per cache slot it votes for, and, complemented so that the AND gives their OR, its flags
   (joined, blocked, rank 0's news, uncached requests, rank 0's wish for detail), the slots it found
   invalid and the slots it waits in itself. Every rank computes the same decisions from the same
   result (``protocol/cycle.py``): the slots every rank voted for run now (in steady-state training
   this exchange is the whole negotiation, and its size does not depend on the number of ranks). Only
   when the result asks for it are the per-rank rows (payload lengths, votes, flags) gathered to rank 0.
3. **Slow path** (only if some rank has uncached requests, or rank 0 has news; ``slow_path.py``): the
   request lists are gathered to rank 0, whose `Coordinator` (``protocol/negotiation.py``, pure logic)
   remembers them across cycles, checks that ranks agree on each tensor that every member has
   submitted, and answers with an ordered response list (or error responses that name the ranks
   grouped by value). The list is broadcast.
4. **Execute.** Cached responses (ascending slot order) then fresh ones are fused (``protocol/fusion.py``) and
   run in the same order on every rank, each as ``protocol/dispatch.py`` routes its kind (a collective
   by the executor, ``executor.py``; a stop, an error, a join or a process set by ``actions.py``);
   handles complete.
5. **Cache update.** Fresh allreduce responses are inserted into every rank's cache, in the same order,
   so the caches never need comparing; erased or evicted slots send their pending requests back
   through negotiation.

The steady state's cycle (``cycles.py``, `Cycles.solo` and `Cycles.steady`): a rank whose only work is one
cached allreduce sends the slot's kept vector; when the reduced bytes are those of every rank sending the
same, that response runs at once; anything else continues as the whole cycle above.

Rank 0 also feeds the stall inspector (``protocol/stall.py``) from the coordinator's table, the summary and,
once a second while something waits, every rank's row (``stall_feed.py``), and writes the timeline
(``timeline.py``): both observe the cycle (``observer.py``).
With ``UNISON_AUTOTUNE``, rank 0 measures each cycle and every rank applies the autotuner's changes at
the end of the same cycle (``autotuning.py``; the search is ``protocol/autotune.py``).
"""
