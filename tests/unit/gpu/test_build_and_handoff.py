"""GPU detection with fake modules, the one-GPU-per-process binding, the missing-CuPy error, NCCL init rules."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
import time
import types
from typing import Any

import pytest

from unison.errors import InvalidArgumentError, MissingDependencyError
from unison.gpu import build, handoff
from unison.gpu.fake import FakeDevice
from unison.gpu.nccl import InitState, connect_bounded, init_failure, nccl_dtype, nccl_op
from unison.ops import ReduceOp


def fake_cupy(version_code: int = 22005, available: bool = True, devices: int = 1,
              driver: int = 12080) -> dict[str, Any]:
    nccl = types.SimpleNamespace(available=available, get_version=lambda: version_code)
    runtime = types.SimpleNamespace(runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: driver,
                                    getDeviceCount=lambda: devices,
                                    getDeviceProperties=lambda i: {"name": b"NVIDIA H100 80GB HBM3"})
    cuda = types.SimpleNamespace(runtime=runtime, Device=lambda i: types.SimpleNamespace(pci_bus_id="0000:17:00.0"))
    cupy = types.SimpleNamespace(__version__="13.3.0", cuda=cuda)
    return {"cupy": cupy, "cupy.cuda.nccl": nccl}


def lookup(modules: dict[str, Any]) -> dict[str, Any]:
    def import_module(name: str) -> Any:
        if name not in modules:
            raise ImportError(f"No module named {name!r}")
        return modules[name]

    return {"find_spec": lambda name: object() if name in modules else None, "import_module": import_module}


def report(modules: dict[str, Any], mpi: bool | None | str = "no MPI (mpi4py not installed)") -> list[tuple[str, str]]:
    return build.gpu_report(**lookup(modules), ask_mpi=lambda: mpi)


def test_nccl_and_cuda_built_read_cupy() -> None:
    assert build.nccl_built(**lookup(fake_cupy())) == 22005
    assert build.cuda_built(**lookup(fake_cupy())) is True
    assert build.nccl_built(**lookup(fake_cupy(available=False))) == 0
    assert build.nccl_built(**lookup({})) == 0 and build.cuda_built(**lookup({})) is False
    broken = lookup(fake_cupy())
    broken["import_module"] = lambda name: (_ for _ in ()).throw(OSError("libcudart.so.12: cannot open"))
    assert build.nccl_built(**broken) == 0 and build.cuda_built(**broken) is False


def test_the_check_build_rows() -> None:
    assert report(fake_cupy()) == [
        ("CuPy", "13.3.0"), ("CUDA runtime", "12.4"), ("CUDA driver", "12.8"), ("NCCL", "2.20.5"),
        ("CUDA-aware MPI", "no MPI (mpi4py not installed)"), ("GPUs", "cuda:0 NVIDIA H100 80GB HBM3 (0000:17:00.0)")]
    assert ("CUDA-aware MPI", "yes (UNISON_GPU_OPERATIONS=MPI hands it device buffers)") in report(fake_cupy(), mpi=True)
    assert ("CUDA-aware MPI", "no (UNISON_GPU_OPERATIONS=MPI stages)") in report(fake_cupy(), mpi=False)
    assert report(fake_cupy(devices=0))[-1] == ("GPUs", "none visible")
    assert report(fake_cupy(driver=0))[2] == ("CUDA driver", "none (no NVIDIA driver found)")
    assert report({}) == [
        ("CuPy", "not installed (pip install cupy-cuda12x or cupy-cuda13x: the gpu-cuda12 / gpu-cuda13 extras)")]


def test_cuda_aware_mpi_is_asked_never_assumed() -> None:
    assert build.cuda_aware_mpi(types.SimpleNamespace()) is None
    assert build.cuda_aware_mpi(types.SimpleNamespace(Query_cuda_support=lambda: 1)) is True
    assert build.cuda_aware_mpi(types.SimpleNamespace(Query_cuda_support=lambda: 0)) is False
    # mpi4py without the query: the library's MPIX_Query_cuda_support, found through the extension
    libraries = {"/x/MPI.so": types.SimpleNamespace(MPIX_Query_cuda_support=lambda: 1), "/y/MPI.so": object()}
    assert build.cuda_aware_mpi(types.SimpleNamespace(__file__="/x/MPI.so"), libraries.__getitem__) is True
    assert build.cuda_aware_mpi(types.SimpleNamespace(__file__="/y/MPI.so"), libraries.__getitem__) is None
    assert build.cuda_aware_mpi(types.SimpleNamespace(__file__="/z/MPI.so"), libraries.__getitem__) is None


def test_the_report_asks_mpi_in_a_child_and_never_starts_it_here() -> None:
    pytest.importorskip("mpi4py")
    code = ("import sys; from unison.gpu import build; print(build.ask_mpi_in_a_child(), "
            "'mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"]  # the wheel's MPICH says no; this process has no MPI


def test_the_real_mpi_library_is_asked() -> None:
    mpi = pytest.importorskip("mpi4py.MPI")
    import ctypes

    library = ctypes.CDLL(mpi.__file__)
    if not hasattr(library, "MPIX_Query_cuda_support"):
        assert build.cuda_aware_mpi(mpi) is None
        return
    query = library.MPIX_Query_cuda_support
    query.restype = ctypes.c_int
    assert build.cuda_aware_mpi(mpi) is bool(query())  # the wheel's MPICH answers no


def test_a_cuda_buffer_without_cupy_names_the_extra() -> None:
    pytest.importorskip("torch")
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    import torch

    from unison.adapters.torch.buffers import cuda_buffer

    with pytest.raises(MissingDependencyError, match=r"CUDA tensors need CuPy \(with NCCL\), which is not installed; "
                       r"install the build for your CUDA version: pip install cupy-cuda12x \(CUDA 12; the gpu-cuda12 "
                       r"extra.*or cupy-cuda13x \(CUDA 13; the gpu-cuda13 extra\)"):
        cuda_buffer(torch.ones(2))
    with pytest.raises(ImportError):  # MissingDependencyError is an ImportError
        handoff.as_cupy(object())


def test_a_process_uses_one_gpu() -> None:
    handoff.reset()
    try:
        assert handoff.bound_ordinal() is None
        device = handoff.device_for(1, make=FakeDevice)
        assert handoff.device_for(1, make=FakeDevice) is device and handoff.bound_ordinal() == 1
        with pytest.raises(InvalidArgumentError, match=r"this one uses cuda:1 since its first GPU collective, and got "
                           r"a tensor on cuda:0\. Move the tensor to cuda:1"):
            handoff.device_for(0, make=FakeDevice)
    finally:
        handoff.reset()


def test_nccl_codes() -> None:
    from unison.dtypes import DType

    assert [nccl_dtype(d) for d in (DType.INT8, DType.UINT8, DType.INT32, DType.INT64, DType.FLOAT16,
                                    DType.FLOAT32, DType.FLOAT64, DType.BFLOAT16)] == [0, 1, 2, 4, 6, 7, 8, 9]
    assert nccl_dtype(DType.UINT16) is None and nccl_dtype(DType.BOOL) is None
    assert [nccl_op(o) for o in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN)] == [
        0, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="NCCL has no reduction for ADASUM"):
        nccl_op(ReduceOp.ADASUM)


def test_connect_bounded_tells_how_far_the_setup_got() -> None:
    closed: list[str] = []

    def slow_connect() -> Any:
        time.sleep(0.5)
        return types.SimpleNamespace(close=lambda: closed.append("late"))

    state, comm, error = connect_bounded(slow_connect, 0.1, prepare=lambda: time.sleep(0.3))
    assert (state, comm, error) == (InitState.NOT_STARTED, None, "")
    state, comm, _ = connect_bounded(slow_connect, 0.1)
    assert (state, comm) == (InitState.WAITING, None)
    deadline = time.monotonic() + 10  # a hang guard: both helper threads still run their slow connect
    while len(closed) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == ["late", "late"]  # a communicator that arrives after the verdict is closed
    state, comm, error = connect_bounded(lambda: 1 / 0, 5.0)
    assert state is InitState.FAILED and error == "ZeroDivisionError: division by zero"


def test_init_failure_names_the_ranks_that_never_arrived() -> None:
    s = InitState
    assert init_failure([s.DONE, s.DONE], [0, 1], 0, 5) == ""
    text = init_failure([s.WAITING, s.NOT_STARTED, s.WAITING, s.NOT_STARTED], [0, 2, 4, 6], 3, 30)
    assert text.startswith("NCCL did not set up the GPU communicator of process set 3 (ranks [0, 2, 4, 6]) within "
                           "30 s: ranks [2, 6] never reached ncclCommInitRank (stuck selecting or starting their GPU), "
                           "ranks [0, 4] waited there for them.")
    assert "every rank waited" in init_failure([s.WAITING, s.WAITING], [0, 1], 0, 30)
    assert "ranks [1] failed in ncclCommInitRank" in init_failure([s.WAITING, s.FAILED], [0, 1], 0, 30)


@pytest.mark.parametrize("module", ["placement", "communicators", "nccl", "plane", "build", "lazy_cupy", "ordering"])
def test_examples_in_docstrings(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"unison.gpu.{module}"))
    assert result.failed == 0 and result.attempted > 0


def test_gpu_arrays_of_the_numpy_api_are_wrapped_with_events_and_results_waited_for() -> None:
    import numpy as np

    handoff.reset()
    try:
        made: list[FakeDevice] = []

        def make(ordinal: int) -> FakeDevice:
            made.append(FakeDevice(ordinal))
            return made[-1]

        x = np.arange(6, dtype=np.float32)
        strided = np.arange(12, dtype=np.float64)[::2]
        buffers, dtypes, outputs = handoff.prepare_arrays(
            [x, strided], in_place=False, with_outputs=True, make=make, convert=lambda a: a, xp=np)
        assert [d.value for d in dtypes] == ["float32", "float64"]
        assert buffers[0].array is x  # no copy
        assert buffers[1].array.flags.c_contiguous and np.array_equal(buffers[1].array, strided)
        assert all(b.ready is not None for b in buffers)  # rule 1: an event on the current stream
        assert outputs is not None and [o.shape for o in outputs] == [(6,), (6,)]
        device = made[0]
        before = len(device.log)
        assert handoff.device_results(buffers, make) == [x, buffers[1].array]
        assert [entry[0] for entry in device.log[before:]] == ["wait", "wait"]  # rule 4
        with pytest.raises(InvalidArgumentError, match="Tensor is required to be contiguous"):
            handoff.prepare_arrays([strided], in_place=True, with_outputs=False, make=make,
                                   convert=lambda a: a, xp=np)
    finally:
        handoff.reset()
