"""The GPU data plane: responses on CUDA buffers run over NCCL (through CuPy), packed and scaled on the device.

Nothing here imports CUDA, CuPy or NCCL until a CUDA buffer arrives, so CPU machines never load them.
The executor hands a response whose ``device`` is not ``"cpu"`` to `plane.GpuPlane`, made on first use
by the factory the job gives it; the plane runs what it stages through the executor's `run_on_host`.

- `device`: the `Device` protocol and the arithmetic shared by the CuPy device and the fake one;
- `ordering`: the stream rules (wait on the producer's event, publish an event the consumer waits on);
- `plane`: running responses, over NCCL or staged through host memory;
- `nccl`: the communicator protocol and its bounded set-up;
- `communicators`, `placement`: one communicator per set and device; the rank -> GPU check;
- `handoff`: one GPU per process, zero-copy wrapping; `lazy_cupy`: CuPy on demand, the missing-CuPy
  error; `build`: what is installed;
- `cupy_device`: CUDA through CuPy; `fake`: a logging device and NCCL for tests without a GPU.
"""
