"""The batched copy kernel on a real GPU: fusion packing and unpacking equal NumPy's, at every alignment."""

from __future__ import annotations

import numpy as np
import pytest

from unison.dtypes import DType
from unison.gpu import batched_copy


def device_with(batched: bool) -> object:
    from unison.gpu.cupy_device import CupyDevice

    device = CupyDevice(0)
    device.batched_copies = batched
    return device


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_pack_and_unpack_move_every_byte(dtype: type) -> None:
    import cupy

    rng = np.random.default_rng(3)
    # 300 parts (three launches), odd counts (so fused offsets of every alignment), one over a chunk,
    # empty parts and a joined rank's zeros
    counts = [int(c) for c in rng.choice([0, 1, 3, 7, 64, 1001], size=299)]
    counts.append(3 * batched_copy.CHUNK_BYTES // np.dtype(dtype).itemsize + 5)
    hosts = [rng.integers(1, 100, size=c).astype(dtype) for c in counts]
    device = device_with(True)
    assert device._batched_kernel() is not None, "the kernel did not build on this GPU"
    stream = device.stream()
    with stream:
        parts = [cupy.asarray(h) for h in hosts]
        parts[5] = None  # a joined rank: zeros
        buf = cupy.full(sum(counts), 255, dtype=dtype)
        outs = [cupy.zeros_like(cupy.asarray(h)) for h in hosts]
    device.pack(buf, parts, counts, 1.0, DType(np.dtype(dtype).name), stream)
    device.unpack(buf, outs, counts, stream)
    stream.synchronize()
    expected = np.concatenate([np.zeros(counts[5], dtype) if i == 5 else h for i, h in enumerate(hosts)])
    np.testing.assert_array_equal(cupy.asnumpy(buf), expected)
    for i, (host, out) in enumerate(zip(hosts, outs)):
        np.testing.assert_array_equal(cupy.asnumpy(out), np.zeros_like(host) if i == 5 else host)


def test_the_kernel_and_the_per_copy_path_agree_on_misaligned_views() -> None:
    import cupy

    rng = np.random.default_rng(5)
    base = cupy.asarray(rng.integers(0, 256, size=1 << 20).astype(np.uint8))
    starts = [int(s) for s in rng.integers(0, (1 << 20) - 70000, size=40)]
    sizes = [int(s) for s in rng.integers(0, 70000, size=40)]
    results = []
    for batched in (True, False):
        device = device_with(batched)
        stream = device.stream()
        with stream:
            outs = [cupy.zeros(n, dtype=cupy.uint8) for n in sizes]
            buf = cupy.zeros(sum(sizes) + 1, dtype=cupy.uint8)[1:]  # a fusion buffer at an odd address
        parts = [base[s : s + n] for s, n in zip(starts, sizes)]
        device.pack(buf, parts, sizes, 1.0, DType.UINT8, stream)
        device.unpack(buf, outs, sizes, stream)
        stream.synchronize()
        results.append([cupy.asnumpy(o) for o in outs])
    host = cupy.asnumpy(base)
    for s, n, kernel_out, memcpy_out in zip(starts, sizes, *results):
        np.testing.assert_array_equal(kernel_out, host[s : s + n])
        np.testing.assert_array_equal(memcpy_out, host[s : s + n])
