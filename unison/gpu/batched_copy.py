"""Many device-to-device copies in one kernel launch: the plan (pure) and the CUDA source.

Fusion packs and unpacks a response's tensors one copy each; ResNet-50 has 161 gradients, and 322
``cudaMemcpyAsync`` calls cost far more in launch gaps and per-copy overhead than the bytes they move.
`plan_batches` turns a list of (dst, src, bytes) into kernel launches of at most `MAX_PARTS` copies
each, passed by value as one `BATCH_DTYPE` record (3,592 bytes, within CUDA's 4 KiB parameter limit,
so no pointer table is uploaded and nothing waits on the host). Every block copies one `CHUNK_BYTES`
slice of one copy, found by a binary search over the copies' first blocks, so large and small copies
share the GPU evenly; each slice moves in the widest word (16, 8, 4, 2 or 1 bytes) that both addresses
allow.

`emulate` runs a plan on host memory with the kernel's own block-to-slice mapping, so the mapping is
tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["BATCH_DTYPE", "CHUNK_BYTES", "KERNEL_NAME", "MAX_PARTS", "SOURCE", "THREADS", "emulate",
           "plan_batches"]

MAX_PARTS = 128
CHUNK_BYTES = 1 << 16
THREADS = 256
KERNEL_NAME = "unison_batched_copy"

# The record as the kernel reads it (field order and offsets match `struct UnisonBatch`).
BATCH_DTYPE = np.dtype([("dst", np.uint64, (MAX_PARTS,)), ("src", np.uint64, (MAX_PARTS,)),
                        ("nbytes", np.uint64, (MAX_PARTS,)), ("first", np.uint32, (MAX_PARTS + 1,)),
                        ("n", np.int32)], align=True)

SOURCE = r"""
#define UNISON_MAX_PARTS @PARTS@
#define UNISON_CHUNK @CHUNK@ULL

struct UnisonBatch {
    unsigned long long dst[UNISON_MAX_PARTS];
    unsigned long long src[UNISON_MAX_PARTS];
    unsigned long long nbytes[UNISON_MAX_PARTS];
    unsigned int first[UNISON_MAX_PARTS + 1];  // each copy's first block; first[n] = all blocks
    int n;
};

template <typename Word>
__device__ __forceinline__ unsigned long long copy_words(char* __restrict__ dst, const char* __restrict__ src,
                                                         unsigned long long begin, unsigned long long end) {
    const unsigned long long size = sizeof(Word);
    const unsigned long long stride = size * blockDim.x;
    const unsigned long long body = begin + ((end - begin) / size) * size;
    unsigned long long k = begin + size * threadIdx.x;
    for (; k + 3 * stride < body; k += 4 * stride) {  // four loads in flight before the first store
        const Word a = *reinterpret_cast<const Word*>(src + k);
        const Word b = *reinterpret_cast<const Word*>(src + k + stride);
        const Word c = *reinterpret_cast<const Word*>(src + k + 2 * stride);
        const Word d = *reinterpret_cast<const Word*>(src + k + 3 * stride);
        *reinterpret_cast<Word*>(dst + k) = a;
        *reinterpret_cast<Word*>(dst + k + stride) = b;
        *reinterpret_cast<Word*>(dst + k + 2 * stride) = c;
        *reinterpret_cast<Word*>(dst + k + 3 * stride) = d;
    }
    for (; k < body; k += stride) *reinterpret_cast<Word*>(dst + k) = *reinterpret_cast<const Word*>(src + k);
    return body;
}

extern "C" __global__ void unison_batched_copy(const UnisonBatch batch) {
    const unsigned int block = blockIdx.x;
    int lo = 0, hi = batch.n - 1;
    while (lo < hi) {  // the last copy whose first block is at or before this one
        const int mid = (lo + hi + 1) >> 1;
        if (batch.first[mid] <= block) lo = mid; else hi = mid - 1;
    }
    const unsigned long long begin = (unsigned long long)(block - batch.first[lo]) * UNISON_CHUNK;
    const unsigned long long size = batch.nbytes[lo];
    const unsigned long long end = begin + UNISON_CHUNK < size ? begin + UNISON_CHUNK : size;
    char* dst = reinterpret_cast<char*>(batch.dst[lo]);
    const char* src = reinterpret_cast<const char*>(batch.src[lo]);
    const unsigned long long both = batch.dst[lo] | batch.src[lo];
    unsigned long long done;
    if ((both & 15ULL) == 0) done = copy_words<uint4>(dst, src, begin, end);
    else if ((both & 7ULL) == 0) done = copy_words<unsigned long long>(dst, src, begin, end);
    else if ((both & 3ULL) == 0) done = copy_words<unsigned int>(dst, src, begin, end);
    else if ((both & 1ULL) == 0) done = copy_words<unsigned short>(dst, src, begin, end);
    else done = begin;
    for (unsigned long long k = done + threadIdx.x; k < end; k += blockDim.x) dst[k] = src[k];
}
""".replace("@PARTS@", str(MAX_PARTS)).replace("@CHUNK@", str(CHUNK_BYTES))


def plan_batches(dst: ArrayLike, src: ArrayLike, nbytes: ArrayLike, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[np.ndarray, int]]:
    """Kernel launches for the copies ``dst[i] <- src[i]`` of ``nbytes[i]`` bytes, each (a one-record
    `BATCH_DTYPE` array, its number of blocks); empty copies are left out.

    Vectorized: ResNet-50's 161 copies are planned in tens of microseconds, which matters because the
    GPU waits for the plan whenever the host is not ahead of it.

    Args:
        dst, src, nbytes: addresses and sizes (sequences or uint64 arrays of one length).
        chunk_bytes: the slice one block copies (the kernel's is `CHUNK_BYTES`).

    Example:
        >>> [(int(b["n"][0]), blocks) for b, blocks in plan_batches([0, 9, 1], [4096, 99, 2], [70000, 0, 3])]
        [(2, 3)]
    """
    dst, src, nbytes = (np.asarray(a, dtype=np.uint64) for a in (dst, src, nbytes))
    live = nbytes > 0
    if not live.all():
        dst, src, nbytes = dst[live], src[live], nbytes[live]
    blocks = (nbytes + np.uint64(chunk_bytes - 1)) // np.uint64(chunk_bytes)
    batches = []
    for start in range(0, len(nbytes), MAX_PARTS):
        stop = min(start + MAX_PARTS, len(nbytes))
        count = stop - start
        # the record as 64-bit words (faster than filling its fields): dst, src, nbytes, then first and n
        words = np.zeros(BATCH_DTYPE.itemsize // 8, dtype=np.uint64)
        words[:count] = dst[start:stop]
        words[MAX_PARTS : MAX_PARTS + count] = src[start:stop]
        words[2 * MAX_PARTS : 2 * MAX_PARTS + count] = nbytes[start:stop]
        tail = words[3 * MAX_PARTS :].view(np.uint32)
        ends = np.cumsum(blocks[start:stop])
        tail[1 : count + 1] = ends
        tail[MAX_PARTS + 1] = count
        batches.append((words.view(BATCH_DTYPE), int(ends[-1])))
    return batches


def emulate(memory: np.ndarray, batches: Sequence[tuple[np.ndarray, int]], chunk_bytes: int = CHUNK_BYTES) -> None:
    """Run `batches` on `memory` (a flat uint8 array whose offsets are the addresses), block by block as
    the kernel maps them."""
    for record, blocks in batches:
        n = int(record["n"][0])
        first = record["first"][0]
        for block in range(blocks):
            lo, hi = 0, n - 1
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if first[mid] <= block:
                    lo = mid
                else:
                    hi = mid - 1
            begin = (block - int(first[lo])) * chunk_bytes
            end = min(begin + chunk_bytes, int(record["nbytes"][0, lo]))
            dst, src = int(record["dst"][0, lo]), int(record["src"][0, lo])
            memory[dst + begin : dst + end] = memory[src + begin : src + end]
