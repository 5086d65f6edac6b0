"""Frames of bounded size, checked decoding, and atomic checkpoint files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from unison.errors import ConfigError, InvalidArgumentError
from unison.ps import _checkpoint
from unison.ps import ps_pb2 as pb
from unison.ps._wire import Part, floats, frames, ids_of, sum_rows


def test_large_tensors_travel_in_chunks_and_reassemble() -> None:
    dense = np.arange(10_000, dtype=np.float32)
    ids = np.arange(300, dtype=np.int64) * 3
    rows = np.ones((300, 16), np.float32)
    out = list(frames(pb.Frame(trainer=1, step=4), [Part("w#0", dense), Part("t", rows, ids)], chunk_bytes=4096))
    assert len(out) > 10
    assert all(sum(len(p.data) + len(p.ids) for p in f.pieces) <= 4096 for f in out)
    assert all(f.trainer == 1 and f.step == 4 for f in out)
    got = np.empty_like(dense)
    got_ids, got_rows = [], []
    for f in out:
        for p in f.pieces:
            if p.key == "w#0":
                data = floats(p.data, "x")
                got[p.offset:p.offset + len(data)] = data
            else:
                got_ids.append(ids_of(p.ids, "x"))
                got_rows.append(floats(p.data, "x"))
    np.testing.assert_array_equal(got, dense)
    np.testing.assert_array_equal(np.concatenate(got_ids), ids)
    assert np.concatenate(got_rows).size == rows.size


def test_a_call_without_parts_is_one_header_frame() -> None:
    assert len(list(frames(pb.Frame(trainer=3), [], 1024))) == 1


def test_bad_lengths_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"x: 5 bytes of float32 data is not a multiple of 4"):
        floats(b"12345", "x")
    with pytest.raises(InvalidArgumentError, match=r"y: 12 bytes of int64 ids is not a multiple of 8"):
        ids_of(b"1" * 12, "y")


def test_sum_rows_adds_repeated_ids() -> None:
    unique, total = sum_rows(np.array([4, 1, 4]), np.array([[1.0], [2.0], [3.0]], np.float32))
    assert unique.tolist() == [1, 4] and total.ravel().tolist() == [2.0, 4.0]


def test_checkpoint_round_trip_and_atomic_replace(tmp_path) -> None:
    path = _checkpoint.checkpoint_path(str(tmp_path), 1, 2)
    assert _checkpoint.load(path) is None
    _checkpoint.save(path, {"version": 3}, {"dense/w#0/values": np.ones((1, 4), np.float32)})
    _checkpoint.save(path, {"version": 4}, {"dense/w#0/values": np.zeros((1, 4), np.float32)})
    header, arrays = _checkpoint.load(path)
    assert header["version"] == 4 and arrays["dense/w#0/values"].sum() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server-1-of-2.npz"]  # no temporary left


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path) -> None:
    path = _checkpoint.checkpoint_path(str(tmp_path), 0, 1)
    path.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"is not a readable unison.ps checkpoint"):
        _checkpoint.load(path)


def _written(path: Path, **arrays: np.ndarray) -> Path:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def _header(value: object) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)


def test_every_malformed_checkpoint_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    good = _checkpoint.checkpoint_path(str(tmp_path), 0, 1)
    _checkpoint.save(good, {"version": 3}, {"dense/w#0/values": np.ones((1, 4096), np.float32)})
    whole = good.read_bytes()
    cases = {
        "truncated.npz": (lambda p: p.write_bytes(whole[: len(whole) // 2]), r"BadZipFile: "),
        "empty.npz": (lambda p: p.write_bytes(b""), r"EOFError: |ValueError: "),
        "one-array.npz": (lambda p: np.save(open(p, "wb"), np.zeros(3)), r"it holds one array of shape \(3,\), not an \.npz archive"),
        "no-header.npz": (lambda p: _written(p, values=np.zeros(3)), r"no __header__ array"),
        "not-json.npz": (lambda p: _written(p, __header__=np.frombuffer(b"{oops", np.uint8)), r"its __header__ is not UTF-8 JSON"),
        "not-utf8.npz": (lambda p: _written(p, __header__=np.frombuffer(b"\xff\xfe", np.uint8)), r"its __header__ is not UTF-8 JSON"),
        "a-list.npz": (lambda p: _written(p, __header__=_header([1, 2])), r"its __header__ is a JSON list, not an object"),
        "a-string.npz": (lambda p: _written(p, __header__=_header("format")), r"its __header__ is a JSON str, not an object"),
    }
    for name, (write, says) in cases.items():
        path = tmp_path / name
        write(path)
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} is not a readable unison.ps checkpoint "
                                              rf"\(({says}).*\); move it away to start from scratch\.$"):
            _checkpoint.load(path)
    assert _checkpoint.load(good) is not None
