"""The batched copy kernel's plan: records as the kernel reads them, and its block mapping run on host memory."""

from __future__ import annotations

import numpy as np
import pytest

from unison.gpu import batched_copy
from unison.gpu.batched_copy import BATCH_DTYPE, MAX_PARTS, emulate, plan_batches


def test_the_record_matches_the_kernels_struct_and_fits_a_kernel_parameter() -> None:
    offsets = {name: BATCH_DTYPE.fields[name][1] for name in BATCH_DTYPE.names}
    assert offsets == {"dst": 0, "src": 8 * MAX_PARTS, "nbytes": 16 * MAX_PARTS, "first": 24 * MAX_PARTS,
                       "n": 24 * MAX_PARTS + 4 * (MAX_PARTS + 1)}
    assert BATCH_DTYPE.itemsize <= 4096  # CUDA's kernel parameter limit before 12.1
    assert f"#define UNISON_MAX_PARTS {MAX_PARTS}" in batched_copy.SOURCE
    assert f"#define UNISON_CHUNK {batched_copy.CHUNK_BYTES}ULL" in batched_copy.SOURCE


def test_blocks_cover_each_copy_in_chunks_and_empty_copies_are_left_out() -> None:
    ((record, blocks),) = plan_batches([100, 300, 500], [200, 400, 600], [10, 0, 33], chunk_bytes=16)
    assert blocks == 1 + 3
    assert int(record["n"][0]) == 2
    assert record["first"][0, :3].tolist() == [0, 1, 4]
    assert record["dst"][0, :2].tolist() == [100, 500] and record["nbytes"][0, :2].tolist() == [10, 33]
    assert plan_batches([1], [2], [0]) == []


@pytest.mark.parametrize("seed", range(4))
def test_every_byte_lands_where_it_should(seed: int) -> None:
    """Many copies (over two records' worth), odd sizes and addresses, several blocks each, some empty."""
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.choice([0, 1, 3, 15, 16, 17, 64, 100, 257], size=300)]
    source = 7 + np.cumsum([0] + [s + int(rng.integers(0, 5)) for s in sizes[:-1]])
    target_base = int(source[-1]) + sizes[-1] + 11
    targets = target_base + np.cumsum([0] + sizes[:-1])
    memory = np.zeros(int(targets[-1]) + sizes[-1] + 32, dtype=np.uint8)
    memory[:target_base] = rng.integers(0, 256, size=target_base)
    batches = plan_batches(targets, source, sizes, chunk_bytes=16)
    assert len(batches) == -(-sum(1 for s in sizes if s) // MAX_PARTS)
    emulate(memory, batches, chunk_bytes=16)
    for t, s, n in zip(targets, source, sizes):
        np.testing.assert_array_equal(memory[t : t + n], memory[s : s + n])
    assert not memory[int(targets[-1]) + sizes[-1] :].any()  # nothing written past the last copy
