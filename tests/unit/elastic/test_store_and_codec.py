"""The shared-memory commit store (atomic, newest wins) and the state encoding (tensors out of band)."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

from unison.elastic import _codec
from unison.elastic.store import CommitId, StateStore
from unison.errors import ConfigError

torch = pytest.importorskip("torch")


def test_codec_round_trip_is_exact() -> None:
    value = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "half": torch.tensor([1.5, -2.25]).bfloat16(),
             "np": np.arange(5, dtype=np.int64), "step": 7, "nested": [torch.zeros(0), {"s": {1, 2}}],
             "scalar": torch.tensor(3.0)}
    parts = _codec.encode(value)
    back = _codec.decode(bytearray(b"".join(parts)))
    assert torch.equal(back["w"], value["w"]) and back["w"].dtype == torch.float32
    assert back["half"].dtype == torch.bfloat16 and torch.equal(back["half"], value["half"])
    assert np.array_equal(back["np"], value["np"]) and back["step"] == 7 and back["nested"][1] == {"s": {1, 2}}
    assert back["scalar"].shape == () and back["scalar"].item() == 3.0
    # The tensor bytes are referenced, not copied, by the encoding.
    assert any(part.nbytes == 48 and part.obj is not None for part in parts)
    assert _codec.total_bytes(parts) > 48 + 16 + 40


def test_store_keeps_the_newest_complete_commit(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "host/1")
    assert store.newest() is None and store.read() is None
    store.write(CommitId(epoch=0, commit=1), [b"first", memoryview(b"-one")])
    store.write(CommitId(epoch=0, commit=2), [b"second"])
    assert store.newest() == CommitId(epoch=0, commit=2)
    assert store.read() == (CommitId(epoch=0, commit=2), bytearray(b"second"))
    store.write(CommitId(epoch=1, commit=3), [b"3"])  # shorter than the slot it reuses
    assert store.read() == (CommitId(epoch=1, commit=3), bytearray(b"3"))
    assert sorted(os.listdir(store.path)) == ["current", "slot-0", "slot-1"]
    assert store.statistics() == {"writes": 3, "bytes_written": 16}
    assert StateStore(tmp_path, "host/1").newest() == CommitId(epoch=1, commit=3)  # another process's view


def test_a_torn_write_leaves_the_previous_commit(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "h")
    store.write(CommitId(epoch=2, commit=5), [b"good"])
    with pytest.raises(TypeError):  # a part that is not a buffer: nothing is published
        store.write(CommitId(epoch=2, commit=6), [b"partial", 42])  # type: ignore[list-item]
    # A writer killed halfway through the next commit has scribbled over the other slot only.
    torn = StateStore(tmp_path, "h")
    torn._map(1, 9)[:7] = b"partial"
    torn.close()
    assert StateStore(tmp_path, "h").read() == (CommitId(epoch=2, commit=5), bytearray(b"good"))


def test_slots_stay_mapped_across_commits_of_changing_sizes(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "h")
    reader = StateStore(tmp_path, "h")
    rng = np.random.default_rng(0)
    for commit, size in enumerate([4096, 4096, 4096, 10, 1 << 20, 0, 3, 3], start=1):
        data = rng.integers(0, 256, size, dtype=np.uint8)
        store.write(CommitId(epoch=0, commit=commit), [data[: size // 2], memoryview(data[size // 2:])])
        assert reader.read() == (CommitId(epoch=0, commit=commit), bytearray(data.tobytes())), commit
        assert os.path.getsize(store.path / f"slot-{(commit - 1) % 2}") == size
    assert sorted(store._maps) == [0, 1]  # the last two commits (3 bytes each) are still mapped
    store.close()
    assert store._maps == {} and reader.read() is not None


_FULL_TMPFS = """
import sys
from unison.elastic.store import CommitId, StateStore
store = StateStore(sys.argv[1], "h")
try:
    store.write(CommitId(epoch=0, commit=1), [bytes(256 * 1024)])
except OSError as exc:
    print("refused:", exc.strerror)
"""


def test_a_commit_larger_than_the_free_shared_memory_is_an_error_not_a_crash(tmp_path: Path) -> None:
    # A 64 KiB tmpfs of this test's own (a mount namespace): stores into a sparse mapping past the
    # free space would end the writer with SIGBUS, no traceback, and get its host blacklisted.
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs")
    script = (f"mount -t tmpfs -o size=64k,mode=0700 tmpfs {tmp_path} || exit 99; "  # private, as the store must be
              f'exec "{sys.executable}" -c "$0" {tmp_path}')
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script, _FULL_TMPFS], capture_output=True,
                          text=True, timeout=60)
    if done.returncode == 99 or "unshare" in done.stderr and done.returncode == 1:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert (done.returncode, done.stdout) == (0, "refused: No space left on device\n"), done.stderr


def test_a_failed_copy_leaves_no_exported_mapping_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unison.elastic import store as _store

    store = StateStore(tmp_path, "h")
    store.write(CommitId(epoch=0, commit=1), [b"one"])
    copies = []

    def failing_copyto(target: object, source: object) -> None:
        copies.append(1)
        del target, source  # as numpy's C code: no frame of its own keeps the views
        raise MemoryError("copy failed")

    with monkeypatch.context() as patch:
        patch.setattr(_store.np, "copyto", failing_copyto)
        with pytest.raises(MemoryError) as failed:
            store.write(CommitId(epoch=0, commit=2), [b"two", b"parts"])
    assert copies and failed.traceback  # the traceback (and its frames) still alive
    store.write(CommitId(epoch=0, commit=2), [b"longer now"])  # remaps slot 1: closing it must not meet an export
    store.close()
    assert store.read() == (CommitId(epoch=0, commit=2), bytearray(b"longer now"))


def test_commit_order_prefers_the_later_epoch_then_more_commits() -> None:
    # A later epoch went on from the newest commit its hosts had: a host that sat it out may hold more
    # commits of an older epoch, but that line of work was given up when the later epoch began.
    assert max([CommitId(epoch=3, commit=11), CommitId(epoch=4, commit=11), CommitId(epoch=2, commit=12)]) == (
        CommitId(epoch=4, commit=11))
    assert max([CommitId(epoch=1, commit=12), CommitId(epoch=1, commit=11)]) == CommitId(epoch=1, commit=12)
    assert max([CommitId(epoch=0, commit=40), CommitId(epoch=1, commit=3)]) == CommitId(epoch=1, commit=3)


def test_the_store_is_made_private_and_a_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = StateStore(root, "h")
    store.write(CommitId(epoch=0, commit=1), [b"one"])
    assert [stat.S_IMODE(p.stat().st_mode) for p in (root, store.path)] == [0o700, 0o700]
    for opened, mode in ((store.path, 0o770), (root, 0o757)):
        opened.chmod(mode)
        says = (rf"^The elastic store directory {re.escape(str(opened))} is writable by group or others \(owner "
                rf".*uid {os.getuid()}\), mode 0o{mode:o}\)\. Every rank unpickles the commits found there")
        for call in (store.newest, store.read, lambda: store.write(CommitId(epoch=0, commit=2), [b"two"])):
            with pytest.raises(ConfigError, match=says):
                call()
        opened.chmod(0o700)
    assert store.read() == (CommitId(epoch=0, commit=1), bytearray(b"one"))


def test_a_store_directory_of_another_user_or_a_link_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made_first = tmp_path / "made-first"  # as another user of a host joining the job would
    (made_first / "h").mkdir(parents=True, mode=0o700)
    made_first.chmod(0o700)
    (made_first / "h" / "current").write_text(json.dumps({"commit": 9, "epoch": 9, "slot": 0, "bytes": 1}))
    (made_first / "h" / "slot-0").write_bytes(b"x")
    owner = os.getuid()
    from unison.elastic import store as _store

    monkeypatch.setattr(_store.os, "getuid", lambda: owner + 1)
    with pytest.raises(ConfigError, match=rf"^The elastic store directory {re.escape(str(made_first))} belongs to "
                                          rf"another user \(owner .*uid {owner}\), mode 0o700\)\. .* owned by "
                                          rf"(.* \()?uid {owner + 1}\)? that group and others cannot write\. "
                                          r"Remove it, or give the job another UNISON_ELASTIC_STORE\.$"):
        StateStore(made_first, "h").newest()
    monkeypatch.undo()
    link = tmp_path / "link"
    link.symlink_to(made_first)
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        StateStore(link, "h").read()
    with pytest.raises(ConfigError, match=r"is a symbolic link"):
        StateStore(link, "h").write(CommitId(epoch=0, commit=1), [b"mine"])
    assert StateStore(tmp_path / "none", "h").newest() is None and not (tmp_path / "none").exists()


@pytest.mark.parametrize("pointer", [{"commit": 1, "epoch": 0, "slot": 0}, {"commit": 1, "epoch": 0, "slot": 2, "bytes": 3},
                                     {"commit": "1", "epoch": 0, "slot": 0, "bytes": 3},
                                     {"commit": 1, "epoch": 0, "slot": 0, "bytes": -3}])
def test_a_current_that_is_not_a_commit_pointer_is_refused_by_name(tmp_path: Path, pointer: dict) -> None:
    store = StateStore(tmp_path, "h")
    store.write(CommitId(epoch=0, commit=1), [b"one"])
    (store.path / "current").write_text(json.dumps(pointer))
    says = (rf"^{re.escape(str(store.path / 'current'))} is not a commit pointer of unison's elastic store: it must "
            rf"be a JSON object of \['commit', 'epoch', 'slot', 'bytes'\], integers >= 0 and slot 0 or 1\. "
            rf"Got {re.escape(json.dumps(pointer))}\. Remove {re.escape(str(store.path))} to start this host from no commit\.$")
    for call in (store.newest, store.read, lambda: store.write(CommitId(epoch=0, commit=2), [b"two"])):
        with pytest.raises(ConfigError, match=says):
            call()
