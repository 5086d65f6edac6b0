"""The one-line failure summary: the message and the user's frames, not unison's or a framework's."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence

import pytest

import unison
from unison._job.failure import describe

UNISON_DIR = os.path.dirname(os.path.abspath(unison.__file__))
SITE = os.path.join(os.sep, "opt", "venv", "lib", "python3.11", "site-packages")
THIS = os.path.basename(__file__)


def raised_through(files: Sequence[tuple[str, str]], exc: BaseException) -> BaseException:
    """Raise `exc` from a chain of calls whose code claims to live in `files` (outermost first, as
    (path, function name)); the last one raises. Returns the caught exception."""
    *outer, (last_file, last_name) = files
    namespace: dict[str, object] = {}
    exec(compile(f"def {last_name}(exc):\n    raise exc\n", last_file, "exec"), namespace)
    call: Callable[[], object] = functools.partial(namespace[last_name], exc)  # type: ignore[arg-type]
    for file, name in reversed(outer):
        namespace = {}
        exec(compile(f"def {name}(inner):\n    return inner()\n", file, "exec"), namespace)
        call = functools.partial(namespace[name], call)  # type: ignore[arg-type]
    try:
        call()
    except BaseException as caught:  # noqa: BLE001 - the test inspects whatever was raised
        return caught
    raise AssertionError("nothing was raised")


def test_a_plain_error_shows_message_and_innermost_frames_first() -> None:
    exc = raised_through([("/home/me/train.py", "step"), ("/home/me/model.py", "forward")],
                         ValueError("loss became NaN\nsecond line"))
    text = describe(exc, 1, "gpu07", 42)
    assert text.startswith("rank 1 (gpu07, pid 42) failed: ValueError: loss became NaN at model.py:2 in forward "
                           f"<- train.py:2 in step <- {THIS}:"), text
    assert text.endswith(" in raised_through"), text
    assert "second line" not in text


def test_unison_frames_are_skipped_so_the_user_call_site_shows() -> None:
    # A torch collective: the user calls allreduce, unison's adapter and torch's autograd run, and
    # unison's synchronize raises. The summary must point at the user's call, not at synchronize.
    exc = raised_through([
        ("/home/me/train.py", "train_step"),
        (os.path.join(UNISON_DIR, "adapters", "torch", "autograd.py"), "allreduce"),
        (os.path.join(SITE, "torch", "autograd", "function.py"), "apply"),
        (os.path.join(UNISON_DIR, "adapters", "torch", "autograd.py"), "forward"),
        (os.path.join(UNISON_DIR, "_job", "collectives.py"), "synchronize"),
    ], RuntimeError("Mismatched ALLREDUCE tensor shapes"))
    text = describe(exc, 0, "h", 1)
    assert text.startswith("rank 0 (h, pid 1) failed: RuntimeError: Mismatched ALLREDUCE tensor shapes "
                           "at train.py:2 in train_step <- test_failure_summary.py:")
    assert "collectives.py" not in text and "autograd.py" not in text and "function.py" not in text


@pytest.mark.parametrize("framework", ["tensorflow", "keras", "tf_keras", "torch"])
def test_framework_internals_are_skipped(framework: str) -> None:
    exc = raised_through([("/home/me/fit.py", "fit"), (os.path.join(SITE, framework, "engine.py"), "run"),
                          (os.path.join(SITE, framework, "ops.py"), "call")], KeyError("w"))
    text = describe(exc, 2, "h", 1)
    assert " at fit.py:2 in fit <- " in text and "engine.py" not in text and "ops.py" not in text


def test_a_user_directory_named_like_a_framework_is_still_the_users() -> None:
    exc = raised_through([("/home/me/torch/train.py", "main")], ValueError("x"))
    assert "at train.py:2 in main" in describe(exc, 0, "h", 1)


def test_autograph_generated_files_are_skipped() -> None:
    exc = raised_through([("/home/me/train.py", "run"), ("/tmp/__autograph_generated_filewyg2sppf.py", "tf__step"),
                          ("/tmp/__autograph_generated_filewyg2sppf.py", "if_body")], ValueError("x"))
    text = describe(exc, 0, "h", 1)
    assert "autograph" not in text and " at train.py:2 in run <- " in text


def test_tensorflows_in_user_code_message_gives_the_message_and_the_users_line() -> None:
    message = ('in user code:\n\n    File "/home/me/train.py", line 12, in train_step  *\n'
               '        loss = compute(x)\n    File "/home/me/losses.py", line 6, in compute  *\n'
               '        raise ValueError("loss became NaN")\n\n    ValueError: loss became NaN\n')
    exc = raised_through([("/home/me/train.py", "main"), (os.path.join(SITE, "tensorflow", "util.py"), "handler"),
                          ("/tmp/__autograph_generated_fileab12.py", "if_body")], ValueError(message))
    text = describe(exc, 1, "h", 7)
    assert text.startswith("rank 1 (h, pid 7) failed: ValueError: loss became NaN at losses.py:6 in compute <- "
                           "train.py:12 in train_step <- train.py:2 in main"), text


def test_when_every_frame_is_internal_the_innermost_one_shows() -> None:
    exc = raised_through([(os.path.join(SITE, "torch", "a.py"), "outer"),
                          (os.path.join(UNISON_DIR, "_job", "collectives.py"), "synchronize")], OSError("gone"))
    # The test's own frame is the user's; without it only internal frames are left.
    exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
    assert describe(exc, 0, "h", 1) == "rank 0 (h, pid 1) failed: OSError: gone at collectives.py:2 in synchronize"


def test_an_error_without_message_or_traceback() -> None:
    assert describe(KeyboardInterrupt(), 3, "h", 9) == "rank 3 (h, pid 9) failed: KeyboardInterrupt"


def test_a_real_tf_function_error_shows_the_users_line() -> None:
    tf = pytest.importorskip("tensorflow")

    @tf.function
    def step(x: object) -> object:
        if x > 0:  # type: ignore[operator]
            raise ValueError("loss became NaN")
        return x

    with pytest.raises(ValueError) as info:
        step(tf.constant(1.0))
    text = describe(info.value, 1, "h", 2)
    line = step.python_function.__code__.co_firstlineno + 3
    assert text.startswith(f"rank 1 (h, pid 2) failed: ValueError: loss became NaN at {THIS}:{line} in step <- "
                           f"{THIS}:"), text
    assert "autograph" not in text and "traceback_utils" not in text


def test_a_real_torch_autograd_error_shows_the_users_line() -> None:
    torch = pytest.importorskip("torch")

    class Fail(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: object) -> object:
            raise RuntimeError("collective failed")

    def user_step() -> None:
        Fail.apply(torch.ones(1))

    with pytest.raises(RuntimeError) as info:
        user_step()
    text = describe(info.value, 0, "h", 2)
    assert text.startswith("rank 0 (h, pid 2) failed: RuntimeError: collective failed at "
                           f"{THIS}:"), text
    assert "in forward <- " in text and "in user_step <- " in text and "function.py" not in text
