"""Where a call comes from and where the main thread is: the user's frames, not unison's or a framework's."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import pytest

from unison.engine import where
from unison.engine.handles import Handle


def _submit_like(kind: str = "allreduce") -> str:
    return where.call_site(kind)  # a frame of this file: the user's, for these tests


def test_a_call_site_is_the_users_frame_and_its_callers() -> None:
    def step() -> str:
        return _submit_like()

    site = step()
    assert site.startswith("test_where.py:") and " in _submit_like <- test_where.py:" in site and site.endswith(" in step")


def test_unison_s_and_the_frameworks_files_are_not_the_users() -> None:
    assert where.internal(where.__file__)
    assert where.internal("/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py")
    assert where.internal("/tmp/__autograph_generated_filexyz.py")
    assert not where.internal("/home/me/train.py")
    assert not where.internal("/opt/venv/lib/python3.11/site-packages/mylib/torch_utils.py")
    assert where.internal(threading.__file__)  # a thread's own start


def _installed_function(package_file: str, source: str) -> Any:
    namespace: dict[str, Any] = {"where": where}
    exec(compile(source, f"/opt/venv/lib/python3.11/site-packages/{package_file}", "exec"), namespace)
    return next(value for name, value in namespace.items() if callable(value) and name != "where")


def test_a_caller_in_an_installed_package_is_left_out_of_the_place() -> None:
    # pytest calls a test function from its own files: the place is the test's line, then the user's
    # next frame outward (here this test), never pytest's `pytest_pyfunc_call`.
    runner = _installed_function("_pytest/python.py", "def pytest_pyfunc_call(test):\n    return test()\n")
    site = runner(_submit_like)
    assert site.startswith("test_where.py:") and " in _submit_like <- test_where.py:" in site, site
    assert site.endswith(" in test_a_caller_in_an_installed_package_is_left_out_of_the_place"), site
    assert "python.py" not in site


def test_the_innermost_place_may_be_an_installed_package_s_when_it_made_the_call() -> None:
    # a trainer's loop (Lightning's, say) that calls the collective itself is the best place there is
    step = _installed_function("trainer/loop.py", "def backward_step():\n    return where.call_site()\n")
    site = step()
    assert site.startswith("loop.py:2 in backward_step <- test_where.py:"), site


def test_an_origin_names_what_made_the_call_and_a_failing_one_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(where, "_origins", [])
    seen: list[tuple[int, str]] = []

    def broken(frames: Sequence[FrameType], kind: str) -> str:
        raise RuntimeError("an origin that fails")

    def ddp(frames: Sequence[FrameType], kind: str) -> str:
        seen.append((len(frames), kind))
        return "DDP bucket 2"

    where.add_origin(broken)
    where.add_origin(ddp)
    where.add_origin(ddp)  # once
    assert _submit_like("allgather").endswith(" (DDP bucket 2)")
    assert seen == [(0, "allgather")]  # no frame between the user's and call_site's caller


def test_a_thread_without_a_user_frame_gets_the_main_thread_s() -> None:
    found: list[str] = []
    waiting = threading.Event()
    namespace: dict[str, Any] = {"where": where, "found": found, "waiting": waiting}
    # a framework's thread: its function lives in torch's files
    exec(compile("def framework_thread():\n    found.append(where.call_site())\n    waiting.set()\n",
                 "/opt/venv/lib/python3.11/site-packages/torch/_fake_thread.py", "exec"), namespace)
    thread = threading.Thread(target=namespace["framework_thread"])
    thread.start()
    waiting.wait(5)
    thread.join(5)
    assert found and "test_where.py:" in found[0] and "test_a_thread_without_a_user_frame" in found[0], found


def test_the_main_thread_s_place_wait_and_stack_are_read_from_another_thread() -> None:
    handle = Handle("allreduce.grad.3")
    out: list[tuple[str, str, object, list[str]]] = []

    def look() -> None:
        while not handle._lock.locked() or not any(  # the main thread is inside Handle.wait
                f.f_code is Handle.wait.__code__ for f in _main_frames()):
            pass
        out.append(where.main_thread())
        handle.complete(None)

    thread = threading.Thread(target=look)
    thread.start()
    handle.wait(10)
    thread.join(5)
    place, waits, request, stack = out[0]
    assert place.startswith("test_where.py:") and "in test_the_main_thread_s_place" in place
    assert waits == "allreduce.grad.3" and request is None
    assert stack[0] == place.split(" <- ")[0]  # unison's frames inside the wait are left out
    assert len(stack) <= where.STACK_FRAMES


def _main_frames() -> list[FrameType]:
    import sys

    frame = sys._current_frames().get(threading.main_thread().ident)  # type: ignore[arg-type]
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames
