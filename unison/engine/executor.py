"""The executor: runs one negotiated response on this rank's buffers, with Horovod's numerics.

Numerics: Average is Sum followed by ``postscale / set_size``; float32/float64 are scaled in their own
precision; integers are scaled through float64 and truncated toward zero, as Horovod does.

float16 and bfloat16 cross the wire in their own 2 bytes but are never summed in half precision (which
MPICH cannot do and which loses accuracy): each rank receives its piece of every rank's buffer, widens
the pieces to float32, scales, reduces them in rank order and rounds once; the rounded pieces are then
allgathered (`Backend.allreduce_pieces_`). A reducescatter is the same without the allgather. The result is the float32 reduction rounded once, identical
on every rank, for half the bytes of reducing in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backends.base import Backend
from ..dtypes import DType
from ..errors import HorovodInternalError
from ..ops import CollectiveKind, ReduceOp
from ..protocol.messages import Request, Response
from ..protocol.negotiation import reducescatter_rows
from .adasum import adasum_
from .handles import Entry, Handle, main_thread_waits
from .numerics import copy_scaled_, elements, half_combiner, narrow, raw, scale_, widen

# Entry, Handle and main_thread_waits live in handles.py; engine/loop.py (Entry, main_thread_waits) and
# benchmarks/gpu.py (Entry, Handle) still import them from here.
__all__ = ["Entry", "Executor", "ExecutorStatistics", "Handle", "main_thread_waits"]

_ALLREDUCE = CollectiveKind.ALLREDUCE.value
_KEPT_PLANS = 4096  # one-tensor allreduce plans kept (the table is dropped past it)


@dataclasses.dataclass(frozen=True)
class ExecutorStatistics:
    """Counters of an `Executor`: responses and tensors run, fused responses, bytes, fusion buffer size."""

    responses: int
    tensors: int
    fused_responses: int
    bytes: int
    fusion_buffer_bytes: int


class Executor:
    """Runs responses on one rank; owns the persistent fusion buffer.

    Args:
        backend: the data plane.
        rank: this process's global rank.
        process_sets: live mapping of process set id -> sorted global ranks.
        activity: callback (name, activity or None) for the timeline; None when no timeline.
    """

    def __init__(self, backend: Backend, rank: int, process_sets: dict[int, tuple[int, ...]]) -> None:
        self.backend = backend
        self.rank = rank
        self.process_sets = process_sets
        self._fusion = np.empty(0, dtype=np.uint8)
        self.activity: Callable[[Sequence[str], str | None], None] | None = None
        self._stats = {"responses": 0, "tensors": 0, "fused_responses": 0, "bytes": 0}
        # Responses on device buffers go to the GPU data plane, made on the first one by the factory the
        # job hands over (unison/gpu/plane.py's create_device_plane, imported only then: CPU jobs never
        # import it) with these keyword arguments (operations, init_timeout_seconds) and `run_on_host`.
        self.device_plane: Any = None
        self.device_plane_factory: Callable[..., Any] | None = None
        self.device_plane_options: dict[str, Any] = {}
        self._host_executor: Executor | None = None
        # id(response) -> (response, op, set id, pre, post, dtype, bytes): what a
        # one-tensor allreduce computes from its response, kept per response (responses in the cache
        # recur: the steady state's calls); the response itself is kept to check the id.
        self._single: dict[int, tuple[Response, ReduceOp, int, float, float, DType, int]] = {}

    def __repr__(self) -> str:
        return f"<Executor rank={self.rank} fusion_buffer_bytes={self._fusion.nbytes}>"

    def statistics(self) -> ExecutorStatistics:
        """Counters: responses and tensors executed, fused responses, bytes reduced or moved."""
        return ExecutorStatistics(**self._stats, fusion_buffer_bytes=self._fusion.nbytes)

    def set_chunk_bytes(self, chunk_bytes: int) -> None:
        """Make the data plane split later reductions into chunks of `chunk_bytes` (the autotuner's knob).

        Only how a buffer is split into calls changes, never its contents, so ranks may switch at
        different points without harm; the engine switches them at the same cycle anyway.
        """
        self.backend.set_chunk_bytes(chunk_bytes)

    def _mark(self, names: Sequence[str], activity: str | None) -> None:
        if self.activity is not None:
            self.activity(names, activity)

    def _fusion_view(self, nbytes: int, dtype: np.dtype) -> np.ndarray:
        if self._fusion.nbytes < nbytes:
            self._fusion = np.empty(nbytes, dtype=np.uint8)
        return self._fusion[:nbytes].view(dtype)

    def run(self, response: Response, entries: Sequence[Entry | None]) -> list[Any]:
        """Execute `response`; `entries[i]` is this rank's entry for ``response.names[i]`` or None
        (a joined rank, which contributes zeros). Returns one result per name."""
        self._stats["responses"] += 1
        self._stats["tensors"] += len(response.names)
        if response.device != "cpu":
            return self._run_on_device(response, entries)
        if response.kind == _ALLREDUCE:
            return self._allreduce(response, entries)
        kind = CollectiveKind(response.kind)
        entry = entries[0]
        assert entry is not None and entry.input is not None  # only allreduce runs without an entry
        if kind is CollectiveKind.ALLGATHER:
            return [self._allgather(response, entry)]
        if kind is CollectiveKind.BROADCAST:
            return [self._broadcast(response, entry)]
        if kind is CollectiveKind.ALLTOALL:
            return [self._alltoall(response, entry)]
        if kind is CollectiveKind.REDUCESCATTER:
            return [self._reducescatter(response, entry)]
        raise ValueError(f"executor cannot run {response.kind!r}")

    def _run_on_device(self, response: Response, entries: Sequence[Entry | None]) -> list[Any]:
        """Run a response on device buffers on the GPU data plane, made (importing CuPy) on first use."""
        if self.device_plane is None:
            if self.device_plane_factory is None:
                raise HorovodInternalError(
                    f"rank {self.rank} got a response on {response.device} buffers ({', '.join(response.names)}) "
                    "but its executor was given no GPU data plane (Executor.device_plane_factory)."
                )
            self.device_plane = self.device_plane_factory(self.backend, self.rank, self.process_sets,
                                                          run_on_host=self.run_on_host,
                                                          **self.device_plane_options)
        results: list[Any] = self.device_plane.run(response, entries)
        return results

    def run_on_host(self, response: Response, entries: Sequence[Entry | None]) -> list[Any]:
        """Run a response on host copies of device buffers (the GPU plane stages what it cannot run).

        A second executor, made on first use, runs them: its fusion buffer and counters stay apart
        from this one's, and ``response.device`` must be ``cpu``.
        """
        if self._host_executor is None:
            self._host_executor = Executor(self.backend, self.rank, self.process_sets)
        return self._host_executor.run(response, entries)

    def close(self) -> None:
        """Release the GPU data plane's communicators, if one was made (at shutdown)."""
        if self.device_plane is not None:
            self.device_plane.close()

    def _set_rank(self, response: Response) -> tuple[int, int]:
        members = self.process_sets[response.process_set_id]
        return members.index(self.rank), len(members)

    @staticmethod
    def _scaler(factor: float, dtype: DType) -> Callable[[np.ndarray], None] | None:
        """The per-chunk postscale (None when there is nothing to scale)."""
        if factor == 1.0:
            return None
        return lambda chunk: scale_(chunk, factor, dtype)

    @staticmethod
    def _mpi_op(op: ReduceOp) -> ReduceOp:
        return ReduceOp.SUM if op in (ReduceOp.AVERAGE, ReduceOp.SUM) else op

    def run_single(self, response: Response, source: np.ndarray, output: np.ndarray) -> None:
        """Run a one-tensor host allreduce of `source` into `output` (the steady state's own call: no
        entry was made for it, `unison.engine.cycles.Cycles.steady`, which counts it as a response of one
        tensor: `Cycles.steady_calls`)."""
        plan = self._single.get(id(response))
        if plan is None or plan[0] is not response:
            self._allreduce(response, [Entry(Request(response.names[0], response.kind, self.rank), source, output,
                                             Handle(response.names[0]))])
            return
        self._run_plan(plan, source, output)

    def _run_plan(self, plan: tuple[Response, ReduceOp, int, float, float, DType, int], source: np.ndarray,
                  output: np.ndarray) -> None:
        """The steady state's one-tensor allreduce, from what was kept of its response (`_single`)."""
        response, op, set_id, pre, post, dtype, nbytes = plan
        self._stats["bytes"] += nbytes
        out = output if output.ndim == 1 else output.reshape(-1)
        if output is not source:
            if pre == 1.0:
                out[:] = source if source.ndim == 1 else source.reshape(-1)  # np.copyto costs 0.2-0.3 us more
            else:
                copy_scaled_(out, source, pre, dtype)
        elif pre != 1.0:
            scale_(out, pre, dtype)
        if self.activity is not None:
            self.activity(response.names, "MPI_ALLREDUCE")
        self.backend.allreduce_(out, op, set_id, None if post == 1.0 else self._scaler(post, dtype))
        if self.activity is not None:
            self.activity(response.names, None)

    def _allreduce(self, response: Response, entries: Sequence[Entry | None]) -> list[Any]:
        if len(entries) == 1 and response.reduce_op is not ReduceOp.ADASUM:
            single = entries[0]
            plan = self._single.get(id(response))
            if single is not None and plan is not None and plan[0] is response:
                # The steady state: one tensor, this response seen before (held by the cache).
                assert single.input is not None and single.output is not None
                self._run_plan(plan, single.input, single.output)
                return [single.output]
        dtype = response.dtype
        _, set_size = self._set_rank(response)
        pre, post = response.prescale, response.post_factor(set_size)
        op = self._mpi_op(response.reduce_op)
        set_id = response.process_set_id
        total = sum(elements(s) for s in response.shapes)
        self._stats["bytes"] += total * dtype.itemsize
        names = response.names
        single = entries[0] if len(entries) == 1 else None
        if response.reduce_op is ReduceOp.ADASUM:
            return self._adasum(response, entries, pre, post)
        if dtype.is_half:
            return self._allreduce_half(response, entries, pre, post, total)
        if single is not None:
            # One tensor: reduce directly in its output buffer, no fusion copy.
            assert single.input is not None and single.output is not None
            if len(self._single) >= _KEPT_PLANS:
                self._single.clear()
            self._single[id(response)] = (response, op, set_id, pre, post, dtype, total * dtype.itemsize)
            out = single.output.reshape(-1)
            if single.output is not single.input:
                copy_scaled_(out, single.input, pre, dtype)
            else:
                scale_(out, pre, dtype)
            self._mark(names, "MPI_ALLREDUCE")
            self.backend.allreduce_(out, op, set_id, self._scaler(post, dtype))
            self._mark(names, None)
            return [single.output]
        self._stats["fused_responses"] += len(entries) > 1
        buf = self._fusion_view(total * dtype.storage.itemsize, dtype.storage)
        self._fusion_in(buf, entries, response,
                        lambda source, part: copy_scaled_(part, source, pre, dtype))
        self._mark(names, "MPI_ALLREDUCE")
        self.backend.allreduce_(buf, op, set_id, self._scaler(post, dtype))
        self._mark(names, None)
        return self._fusion_out(buf, entries, response)

    def _fusion_in(self, buf: np.ndarray, entries: Sequence[Entry | None], response: Response,
                   copy: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """Pack each entry's input into its part of the fusion buffer with `copy(input, part)`; a
        joined rank (no entry) contributes zeros."""
        self._mark(response.names, "MEMCPY_IN_FUSION_BUFFER")
        offset = 0
        for entry, shape in zip(entries, response.shapes):
            count = elements(shape)
            part = buf[offset : offset + count]
            if entry is None:
                part[...] = 0
            else:
                assert entry.input is not None
                copy(entry.input, part)
            offset += count
        self._mark(response.names, None)

    def _fusion_out(self, buf: np.ndarray, entries: Sequence[Entry | None],
                    response: Response) -> list[Any]:
        """Copy each entry's part of the reduced fusion buffer to its output (raw bytes)."""
        self._mark(response.names, "MEMCPY_OUT_FUSION_BUFFER")
        results: list[Any] = []
        offset = 0
        for entry, shape in zip(entries, response.shapes):
            count = elements(shape)
            part = buf[offset : offset + count]
            offset += count
            if entry is None or entry.output is None:
                results.append(None)
                continue
            np.copyto(raw(entry.output), raw(part))
            results.append(entry.output)
        self._mark(response.names, None)
        return results

    def _allreduce_half(self, response: Response, entries: Sequence[Entry | None], pre: float,
                        post: float, total: int) -> list[Any]:
        """float16/bfloat16: 2-byte values on the wire, float32 arithmetic, one rounding."""
        names, dtype = response.names, response.dtype
        combine = half_combiner(dtype, response.reduce_op, pre, post)
        single = entries[0] if len(entries) == 1 else None
        if single is not None:
            assert single.input is not None and single.output is not None
            out = raw(single.output)
            if single.output is not single.input:
                np.copyto(out, raw(single.input))
            self._mark(names, "MPI_ALLREDUCE")
            self.backend.allreduce_pieces_(out, combine, response.process_set_id)
            self._mark(names, None)
            return [single.output]
        self._stats["fused_responses"] += 1
        buf = self._fusion_view(total * 2, np.dtype(np.uint16))  # zero bits are +0.0 in both formats
        self._fusion_in(buf, entries, response, lambda source, part: np.copyto(part, raw(source)))
        self._mark(names, "MPI_ALLREDUCE")
        self.backend.allreduce_pieces_(buf, combine, response.process_set_id)
        self._mark(names, None)
        return self._fusion_out(buf, entries, response)

    def _adasum(self, response: Response, entries: Sequence[Entry | None], pre: float,
                 post: float) -> list[Any]:
        """Adasum of each tensor (`unison.engine.adasum`), in float64 for float64 and float32 otherwise."""
        names, dtype = response.names, response.dtype
        lengths = [elements(shape) for shape in response.shapes]
        work = np.zeros(sum(lengths), np.float64 if dtype is DType.FLOAT64 else np.float32)
        self._mark(names, "MEMCPY_IN_FUSION_BUFFER")
        offset = 0
        for entry, count in zip(entries, lengths):
            if entry is not None:  # a joined rank contributes zeros, which leave the others unchanged
                assert entry.input is not None
                source = entry.input.reshape(-1)
                work[offset : offset + count] = widen(source, dtype) if dtype.is_half else source
            offset += count
        if pre != 1.0:
            work *= work.dtype.type(pre)
        self._mark(names, "ADASUM_ALLREDUCE")
        me, set_size = self._set_rank(response)
        adasum_(work, lengths, self.backend, me, set_size, response.process_set_id)
        if post != 1.0:
            work *= work.dtype.type(post)
        self._mark(names, "MEMCPY_OUT_FUSION_BUFFER")
        results: list[Any] = []
        offset = 0
        for entry, count in zip(entries, lengths):
            part = work[offset : offset + count]
            offset += count
            if entry is None or entry.output is None:
                results.append(None)
                continue
            if dtype.is_half:
                np.copyto(raw(entry.output), narrow(np.ascontiguousarray(part), dtype))
            else:
                np.copyto(entry.output.reshape(-1), part)
            results.append(entry.output)
        self._mark(names, None)
        return results

    def _allgather(self, response: Response, entry: Entry) -> np.ndarray:
        assert entry.input is not None
        dim0s = response.sizes[0]
        rest = entry.input.shape[1:]
        row = elements(rest)
        out = np.empty((sum(dim0s), *rest), dtype=entry.input.dtype)
        self._stats["bytes"] += out.nbytes
        self._mark(response.names, "MPI_ALLGATHER")
        self.backend.allgatherv(raw(np.ascontiguousarray(entry.input)), raw(out),
                                [d * row for d in dim0s], response.process_set_id)
        self._mark(response.names, None)
        return out

    def _broadcast(self, response: Response, entry: Entry) -> np.ndarray:
        assert entry.input is not None and entry.output is not None
        members = self.process_sets[response.process_set_id]
        root = members.index(response.root_rank)
        out = entry.output
        if out is not entry.input and self.rank == response.root_rank:
            np.copyto(out, entry.input)
        self._stats["bytes"] += out.nbytes
        self._mark(response.names, "MPI_BCAST")
        self.backend.broadcast_(raw(out), root, response.process_set_id)
        self._mark(response.names, None)
        return out

    def _alltoall(self, response: Response, entry: Entry) -> tuple[np.ndarray, np.ndarray]:
        assert entry.input is not None
        me, set_size = self._set_rank(response)
        matrix = response.sizes[0]
        rest = entry.input.shape[1:]
        row = elements(rest)
        received = [matrix[sender][me] for sender in range(set_size)]
        out = np.empty((sum(received), *rest), dtype=entry.input.dtype)
        self._stats["bytes"] += entry.input.nbytes
        self._mark(response.names, "MPI_ALLTOALL")
        self.backend.alltoallv(raw(np.ascontiguousarray(entry.input)),
                               [c * row for c in matrix[me]], raw(out),
                               [c * row for c in received], response.process_set_id)
        self._mark(response.names, None)
        return out, np.array(received, dtype=np.int32)

    def _reducescatter(self, response: Response, entry: Entry) -> np.ndarray:
        assert entry.input is not None
        dtype = response.dtype
        me, set_size = self._set_rank(response)
        shape = entry.input.shape
        rows = reducescatter_rows(shape[0], set_size)
        row = elements(shape[1:])
        counts = [r * row for r in rows]
        pre, post = response.prescale, response.post_factor(set_size)
        self._stats["bytes"] += entry.input.nbytes
        out = np.empty((rows[me], *shape[1:]), dtype=dtype.storage)
        self._mark(response.names, "MPI_REDUCESCATTER")
        if dtype.is_half:
            # as for allreduce: 2-byte values on the wire (an alltoall of the pieces), float32 sums
            pieces = np.empty((set_size, counts[me]), dtype=np.uint16)
            self.backend.alltoallv(raw(np.ascontiguousarray(entry.input)), counts, pieces.reshape(-1),
                                   [counts[me]] * set_size, response.process_set_id)
            combine = half_combiner(dtype, response.reduce_op, pre, post)
            raw(out)[...] = combine(pieces)
        else:
            if pre != 1.0:
                send = np.empty(entry.input.size, dtype=dtype.storage)
                copy_scaled_(send, entry.input, pre, dtype)
            else:
                send = np.ascontiguousarray(entry.input).reshape(-1)
            recv = out.reshape(-1)
            self.backend.reducescatter(send, recv, counts, self._mpi_op(response.reduce_op),
                                       response.process_set_id)
            scale_(recv, post, dtype)
        self._mark(response.names, None)
        return out
