"""The public surface: sorted __all__, lazy imports, errors before init."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import unison
import unison as hvd
from unison import errors
from unison.errors import InvalidArgumentError


def test_all_is_sorted_and_complete() -> None:
    assert unison.__all__ == sorted(unison.__all__)
    for name in unison.__all__:
        assert hasattr(unison, name), name
    assert errors.__all__ == sorted(errors.__all__)


def test_import_initializes_nothing() -> None:
    code = ("import sys, unison; "
            "bad = [m for m in ('mpi4py.MPI', 'torch', 'tensorflow') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert out.stderr == ""


def test_calls_before_init_raise_clearly() -> None:
    with pytest.raises(errors.NotInitializedError, match=r"unison has not been initialized; use hvd.init\(\)"):
        unison.rank()
    with pytest.raises(ValueError):
        unison.size()
    with pytest.raises(errors.NotInitializedError):
        unison.allreduce([1.0])


def test_exception_tree() -> None:
    assert issubclass(errors.MismatchError, errors.HorovodInternalError)
    assert issubclass(errors.HorovodInternalError, RuntimeError)
    assert issubclass(errors.StallError, errors.ShutdownError)
    assert issubclass(errors.MissingDependencyError, ImportError)
    for name in errors.__all__:
        error = getattr(errors, name)
        if error is errors.JobInterrupt:  # a KeyboardInterrupt: `except Exception:` must not swallow the stop
            assert issubclass(error, KeyboardInterrupt) and not issubclass(error, Exception)
            continue
        assert issubclass(error, errors.UnisonError)


@pytest.mark.parametrize(("hide_mpi4py", "built"), [(False, "True"), (True, "False")])
def test_build_probes_work_before_init(hide_mpi4py: bool, built: str) -> None:
    # mpi_built() says whether mpi4py can be imported, without importing it (which starts MPI).
    code = (("import sys; sys.modules['mpi4py'] = None\n" if hide_mpi4py else "")
            + "import sys, unison; print(unison.mpi_built(), 'mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [built, "False"]
    if importlib.util.find_spec("cupy") is None:  # with CuPy installed it is NCCL's version
        assert unison.nccl_built() == 0
    assert unison.gloo_built() is (importlib.util.find_spec("torch") is not None)  # the torchrun transport
    assert unison.gloo_enabled() is False and unison.ccl_built() is False


def test_log_lines_carry_the_rank_and_obey_hide_time(tmp_path) -> None:
    code = (
        "import logging, unison\n"
        "unison.init()\n"
        "logging.getLogger('unison.test').warning('hello')\n"
        "unison.shutdown()\n"
    )
    env = {**__import__("os").environ, "UNISON_LOG_HIDE_TIME": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stderr.startswith("[unison rank 0/1 ") and out.stderr.rstrip().endswith("] WARNING hello")
    env.pop("UNISON_LOG_HIDE_TIME")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stderr[:4].isdigit() and "[unison rank 0/1 " in out.stderr  # a timestamp first
    configured = "import logging; logging.basicConfig(format='APP %(message)s')\n" + code
    out = subprocess.run([sys.executable, "-c", configured], capture_output=True, text=True, env=env, check=True)
    assert out.stderr.strip() == "APP hello"  # the application's own configuration wins


def test_init_refuses_bad_process_sets_before_starting() -> None:
    with pytest.raises(InvalidArgumentError, match=r"A process set needs ranks in range\(size=1\)\. Got \[5\]\."):
        hvd.init(process_sets=[hvd.ProcessSet([5])])
    assert not hvd.is_initialized()
    with pytest.raises(InvalidArgumentError, match="process_sets must contain ProcessSet objects. Got str at index 0"):
        hvd.init(process_sets=["not a set"])  # type: ignore[list-item]
    assert not hvd.is_initialized()
