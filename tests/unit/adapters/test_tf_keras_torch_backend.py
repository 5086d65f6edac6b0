"""unison.keras.DistributedOptimizer with KERAS_BACKEND=torch: 2 real ranks match one process (run in subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("keras")

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["KERAS_BACKEND"] = "torch"
    import numpy as np, keras, torch
    torch.set_num_threads(1)
    import unison, unison.keras as hvd
    hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    # Keras's own fit may load tf.data later when TensorFlow is installed; unison itself must not.
    assert "tensorflow" not in sys.modules, "unison.keras imported tensorflow on the torch backend"
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.RandomState(0)
    x = rng.randn(32, 4).astype("float32"); y = (x @ rng.randn(4, 1)).astype("float32")

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])

    reference = model(); reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    per = 8 // size
    mine = x.reshape(4, 8, 4)[:, rank * per:(rank + 1) * per].reshape(-1, 4)
    mine_y = y.reshape(4, 8, 1)[:, rank * per:(rank + 1) * per].reshape(-1, 1)
    dist = model()
    dist.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    dist.fit(mine, mine_y, batch_size=per, epochs=2, shuffle=False, verbose=0,
             callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
    for a, b in zip(reference.get_weights(), dist.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert dist.optimizer.statistics()["reductions"] == 8, dist.optimizer.statistics()
    # The self-reducing schemes on this backend: replicas stay identical, only the factors travel.
    for compression in (hvd.Compression.powersgd(1), hvd.Compression.topk(0.25)):
        squeezed = model()
        squeezed.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression),
                         loss="mse")
        squeezed.fit(mine, mine_y, batch_size=per, epochs=2, shuffle=False, verbose=0)
        flat = np.concatenate([w.reshape(-1) for w in squeezed.get_weights()])
        everyone = unison.allgather_object(flat.tolist())
        assert everyone[0] == everyone[1], f"{compression!r}: replicas differ"
        stats = compression.statistics()
        assert 0 < stats["payload_bytes"] < stats["dense_bytes"], (compression, stats)
    print(f"rank {rank}: OK", flush=True)
    hvd.shutdown()
""")


def test_keras_torch_backend_two_ranks_match_one_process(tmp_path: Path) -> None:
    script = tmp_path / "keras_torch.py"
    script.write_text(SCRIPT)
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec not installed beside the interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPI", "HYDRA"))}
    done = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rank 0: OK" in done.stdout and "rank 1: OK" in done.stdout
