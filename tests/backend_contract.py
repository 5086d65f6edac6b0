"""The contract every Backend keeps, as checks that every rank of a job runs together on one backend.

Run against each transport: the loopback backend (1 rank) and threads as ranks in
tests/unit/backends/test_contract.py, MPI and gRPC under mpiexec in tests/multirank/test_backend_contract.py.
Each check is collective: every rank calls it with its own backend, and each asserts on what it got.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from unison.backends.base import Backend
from unison.ops import ReduceOp
from unison.protocol.partition import split_counts


def _values(rank: int, count: int, dtype: type = np.float64) -> np.ndarray:
    return (np.arange(count) + 100 * rank).astype(dtype)


def check_control_plane(backend: Backend) -> None:
    rank, size = backend.rank, backend.size
    row = np.array([rank, 7, rank * 3], dtype=np.uint64)
    matrix = backend.allgather_status(row)
    assert matrix.shape == (size, 3)
    assert [list(map(int, r)) for r in matrix] == [[r, 7, r * 3] for r in range(size)]
    # the summary: a bitwise AND over every rank's words, high bits included (uint64, not int64)
    high = (1 << 63) | (1 << 40)
    vector = np.array([~(1 << rank) & ((1 << 64) - 1), high | (1 << (rank % 2)), 5], dtype=np.uint64)
    expected = [~sum(1 << r for r in range(size)) & ((1 << 64) - 1),
                (high | 1) if size == 1 else high, 5]
    assert list(map(int, backend.reduce_status(vector))) == expected
    assert vector.dtype == np.uint64 and int(vector[2]) == 5  # the input is left as it was
    gathered = backend.gather_status(np.array([rank, 1 << 63], dtype=np.uint64))
    if rank == 0:
        assert gathered is not None and [list(map(int, r)) for r in gathered] == [[r, 1 << 63] for r in range(size)]
    elif gathered is not None:  # a transport that gathers everywhere gives every rank the same rows
        assert [list(map(int, r)) for r in gathered] == [[r, 1 << 63] for r in range(size)]
    payload = f"rank {rank} says hello".encode() * (rank + 1)
    lengths = [len(f"rank {r} says hello".encode() * (r + 1)) for r in range(size)]
    gathered = backend.gather_bytes(payload, lengths)
    if rank == 0:
        assert gathered == [f"rank {r} says hello".encode() * (r + 1) for r in range(size)]
    else:
        assert gathered is None
    answer = backend.broadcast_bytes(b"from rank 0" if rank == 0 else None)
    assert answer == b"from rank 0"
    # A cycle whose gather carries nothing, then an empty broadcast (each broadcast follows its
    # cycle's gather: the gRPC control plane answers the gather with rank 0's broadcast).
    assert backend.gather_bytes(b"", [0] * size) == ([b""] * size if rank == 0 else None)
    assert backend.broadcast_bytes(b"" if rank == 0 else None) == b""


def check_allreduce(backend: Backend) -> None:
    rank, size = backend.rank, backend.size
    for op, combine in ((ReduceOp.SUM, np.sum), (ReduceOp.MIN, np.min), (ReduceOp.MAX, np.max),
                        (ReduceOp.PRODUCT, np.prod)):
        for dtype in (np.float64, np.int32):
            buf = _values(rank, 5, dtype) % 7 + 1
            expected = combine(np.stack([_values(r, 5, dtype) % 7 + 1 for r in range(size)]), axis=0)
            backend.allreduce_(buf, op, 0)
            np.testing.assert_array_equal(buf, expected.astype(dtype))
    # after_chunk sees every reduced element exactly once
    seen: list[int] = []
    buf = _values(rank, 11)
    backend.allreduce_(buf, ReduceOp.SUM, 0, after_chunk=lambda chunk: seen.append(chunk.size))
    assert sum(seen) == 11
    np.testing.assert_array_equal(buf, sum(_values(r, 11) for r in range(size)))


def check_chunk_size_changes_no_result(backend: Backend) -> None:
    rank, size = backend.rank, backend.size
    expected = sum(_values(r, 1000) for r in range(size))
    for chunk_bytes in (64, 0, 4 * 1024 * 1024):  # tiny chunks, whole buffers, the default
        backend.set_chunk_bytes(chunk_bytes)
        seen: list[int] = []
        buf = _values(rank, 1000)
        backend.allreduce_(buf, ReduceOp.SUM, 0, after_chunk=lambda chunk, seen=seen: seen.append(chunk.size))
        np.testing.assert_array_equal(buf, expected)
        assert sum(seen) == 1000
    # many chunks (a transport may have several in flight): each seen once, reduced, in order; a type
    # reduced in a wider copy (16-bit integers on gloo) too
    backend.set_chunk_bytes(64)
    for dtype in (np.float64, np.int16):
        buf = (_values(rank, 1000) % 100).astype(dtype)
        whole = sum((_values(r, 1000) % 100).astype(dtype) for r in range(size))
        pieces: list[tuple[int, int]] = []  # (start, size) of each chunk, as after_chunk saw them

        def reduced_in_order(chunk: np.ndarray, buf: np.ndarray = buf, whole: np.ndarray = whole,
                             pieces: list[tuple[int, int]] = pieces) -> None:
            start = (chunk.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // buf.itemsize
            np.testing.assert_array_equal(chunk, whole[start:start + chunk.size])
            pieces.append((start, chunk.size))

        backend.allreduce_(buf, ReduceOp.SUM, 0, after_chunk=reduced_in_order)
        assert [start for start, _ in pieces] == list(np.cumsum([0] + [n for _, n in pieces])[:-1])
        assert sum(n for _, n in pieces) == 1000
    backend.set_chunk_bytes(4 * 1024 * 1024)


def check_allreduce_pieces(backend: Backend) -> None:
    rank, size = backend.rank, backend.size
    buf = _values(rank, 7).astype(np.float32)
    calls: list[tuple[int, ...]] = []

    def combine(matrix: np.ndarray) -> np.ndarray:
        calls.append(matrix.shape)
        total: np.ndarray = matrix.sum(axis=0)
        return total

    backend.allreduce_pieces_(buf, combine, 0)
    np.testing.assert_array_equal(buf, sum(_values(r, 7).astype(np.float32) for r in range(size)))
    assert all(shape[0] == size for shape in calls)


def check_allgatherv_broadcast_alltoallv_reducescatter(backend: Backend) -> None:
    rank, size = backend.rank, backend.size
    counts = [r + 1 for r in range(size)]
    recv = np.empty(sum(counts))
    backend.allgatherv(_values(rank, rank + 1), recv, counts, 0)
    np.testing.assert_array_equal(recv, np.concatenate([_values(r, r + 1) for r in range(size)]))

    buf = _values(rank, 6)
    root = size - 1
    backend.broadcast_(buf, root, 0)
    np.testing.assert_array_equal(buf, _values(root, 6))

    # alltoallv: rank r sends (d + 1) elements to rank d, each worth 1000 * r + d
    send_counts = [d + 1 for d in range(size)]
    send = np.concatenate([np.full(d + 1, 1000.0 * rank + d) for d in range(size)])
    recv_counts = [rank + 1] * size
    recv = np.empty(sum(recv_counts))
    backend.alltoallv(send, send_counts, recv, recv_counts, 0)
    np.testing.assert_array_equal(recv, np.concatenate([np.full(rank + 1, 1000.0 * s + rank) for s in range(size)]))

    rows = split_counts(2 * size + 1, size)
    full = _values(rank, 2 * size + 1)
    out = np.empty(rows[rank])
    backend.reducescatter(full, out, rows, ReduceOp.SUM, 0)
    total = sum(_values(r, 2 * size + 1) for r in range(size))
    start = sum(rows[:rank])
    np.testing.assert_array_equal(out, total[start : start + rows[rank]])


_INTEGERS = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)


def check_every_dtype(backend: Backend) -> None:
    """Every integer type reduced exactly (the extremes of its range for MIN and MAX), every type moved
    bit for bit, and 2-byte pieces (the half-precision wire) through `allreduce_pieces_`."""
    rank, size = backend.rank, backend.size
    for dtype in _INTEGERS:
        info = np.iinfo(dtype)
        low = np.array([info.min + rank, info.max - 3 * rank, rank], dtype=dtype)
        everyone = np.stack([np.array([info.min + r, info.max - 3 * r, r], dtype=dtype) for r in range(size)])
        for op, combine in ((ReduceOp.MIN, np.min), (ReduceOp.MAX, np.max)):
            buf = low.copy()
            backend.allreduce_(buf, op, 0)
            np.testing.assert_array_equal(buf, combine(everyone, axis=0), err_msg=f"{op} of {np.dtype(dtype)}")
        small = np.arange(1, 4, dtype=dtype) + rank
        backend.allreduce_(small, ReduceOp.SUM, 0)
        np.testing.assert_array_equal(small, sum(np.arange(1, 4) + r for r in range(size)).astype(dtype),
                                      err_msg=f"SUM of {np.dtype(dtype)}")
    moved = [*_INTEGERS, np.float16, np.float32, np.float64, np.bool_]
    for dtype in moved:
        mine = (np.arange(4) + 5 * rank).astype(dtype)
        if np.dtype(dtype) == np.float16:
            mine.view(np.uint16)[0] = 0x7E01 + rank  # a NaN with a payload: its bits must survive
        recv = np.empty(4 * size, dtype=dtype)
        backend.allgatherv(mine, recv, [4] * size, 0)
        expected = np.concatenate([_bits_of(dtype, r) for r in range(size)])
        assert recv.tobytes() == expected.tobytes(), f"allgatherv of {np.dtype(dtype)}"
        buf = _bits_of(dtype, rank)
        backend.broadcast_(buf, 0, 0)
        assert buf.tobytes() == _bits_of(dtype, 0).tobytes(), f"broadcast of {np.dtype(dtype)}"
        recv = np.empty(4 * size, dtype=dtype)
        backend.alltoallv(np.concatenate([_bits_of(dtype, rank)] * size), [4] * size, recv, [4] * size, 0)
        assert recv.tobytes() == expected.tobytes(), f"alltoallv of {np.dtype(dtype)}"
    bits = np.arange(6, dtype=np.uint16) + 10 * rank
    backend.allreduce_pieces_(bits, lambda matrix: matrix.max(axis=0), 0)
    np.testing.assert_array_equal(bits, np.arange(6, dtype=np.uint16) + 10 * (size - 1))


def _bits_of(dtype: type, rank: int) -> np.ndarray:
    values = (np.arange(4) + 5 * rank).astype(dtype)
    if np.dtype(dtype) == np.float16:
        values.view(np.uint16)[0] = 0x7E01 + rank
    return values


def check_process_sets(backend: Backend) -> None:
    rank, size = backend.rank, backend.size
    members = list(range(0, size, 2))  # every other rank: 0, 2, ...
    backend.add_process_set(5, members)
    if rank in members:
        buf = np.full(3, float(rank))
        backend.allreduce_(buf, ReduceOp.SUM, 5)
        np.testing.assert_array_equal(buf, np.full(3, float(sum(members))))
        backend.remove_process_set(5)
    # the global set still works afterwards, on every rank
    buf = np.ones(2)
    backend.allreduce_(buf, ReduceOp.SUM, 0)
    np.testing.assert_array_equal(buf, np.full(2, float(size)))


def check_statistics(backend: Backend) -> None:
    stats = backend.statistics()
    assert isinstance(stats, dict) and all(isinstance(v, (int, float)) for v in stats.values())
    assert backend.name and isinstance(backend.name, str)


CHECKS: list[Callable[[Backend], None]] = [
    check_control_plane,
    check_allreduce,
    check_chunk_size_changes_no_result,
    check_allreduce_pieces,
    check_allgatherv_broadcast_alltoallv_reducescatter,
    check_every_dtype,
    check_process_sets,
    check_statistics,
]


def check_all(backend: Backend) -> None:
    """Every check, in order (collective: every rank of the backend's job calls this)."""
    for check in CHECKS:
        check(backend)
