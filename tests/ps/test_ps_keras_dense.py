"""Keras dense variables on the parameter servers (ServerOptimizer), with real server and trainer processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.ps._cluster import ROOT, free_port, run_job, start_server, start_trainer, stop, wait_all

pytestmark = pytest.mark.long_jobs


@pytest.mark.timeout(150)
def test_sync_fit_on_two_trainers_equals_one_process_on_the_global_batch(tmp_path) -> None:
    pytest.importorskip("keras")
    outs = run_job(tmp_path, "keras_dense_sync", "sync", trainers=2, servers=2, timeout=130)
    got = [np.load(o) for o in outs]
    for t in range(2):
        for i in range(4):
            np.testing.assert_allclose(got[t][f"w{i}"], got[0][f"ref{i}"], rtol=1e-5, atol=1e-6, err_msg=f"w{i}")
            np.testing.assert_array_equal(got[t][f"w{i}"], got[1][f"w{i}"])  # the same pulled values
        assert int(got[t]["steps"]) == 6 and int(got[t]["version"]) == 6  # one push per step
    assert not np.array_equal(got[0]["start0"], got[1]["start0"])  # trainer 1 started elsewhere: 0's values won
    assert not np.allclose(got[0]["w0"], got[0]["start0"], atol=1e-3)  # and the weights did train


@pytest.mark.timeout(150)
@pytest.mark.parametrize("eager", ["0", "1"], ids=["graph", "eager"])
def test_fit_mixing_a_distributed_embedding_and_dense_layers(tmp_path, eager: str) -> None:
    pytest.importorskip("keras")
    outs = run_job(tmp_path, "keras_dense_sync", "sync", trainers=2, servers=1, timeout=130,
                    KERAS_EMBEDDING="1", KERAS_EAGER=eager)
    got = [np.load(o) for o in outs]
    for t in range(2):
        np.testing.assert_allclose(got[t]["rows"], got[0]["ref0"], rtol=1e-5, atol=1e-6)  # the table (SGD)
        for i in range(1, 5):  # the dense layers (momentum on the servers)
            np.testing.assert_allclose(got[t][f"w{i}"], got[0][f"ref{i}"], rtol=1e-5, atol=1e-6, err_msg=f"w{i}")
        assert float(got[t]["w0"]) == 0.0  # the layer's anchor is not declared and stays zero
        # one push per step carries both the rows and the dense gradients: 6 steps, version 6 at the end
        assert int(got[t]["steps"]) == 6 and int(got[t]["layer_pushes"]) == 6
    assert [int(g["version"]) for g in got] == [6, 6]


@pytest.mark.timeout(150)
def test_async_fit_trains_and_the_servers_report_staleness(tmp_path) -> None:
    pytest.importorskip("keras")
    outs = run_job(tmp_path, "keras_dense_async", "async", trainers=2, servers=2, timeout=130, suffix="json")
    for out in outs:
        result = json.loads(out.read_text())
        before, after = result["loss"]  # mean squared error on the whole data set, before and after fit
        assert after < 0.2 * before, result["loss"]
        assert result["optimizer"]["steps"] == 400 and result["optimizer"]["variables"] == 4
        staleness_max = 0
        for stats in result["servers"]:
            assert stats["pushes"] == 800  # both trainers' 400 steps, read once both finished
            assert sum(stats["staleness_histogram"].values()) == stats["pushes"]
            staleness_max = max(staleness_max, stats["staleness_max"])
        assert staleness_max >= 1  # the trainers overlapped: some gradients came from values already replaced


@pytest.mark.timeout(120)
def test_misuse_is_refused_with_the_rule_and_the_fix(tmp_path) -> None:
    pytest.importorskip("keras")
    (out,) = run_job(tmp_path, "keras_dense_errors", "sync", trainers=1, servers=1, timeout=100, suffix="json")
    caught = json.loads(out.read_text())
    expected = {
        "keras_optimizer": r"optimizer must be a unison.ps optimizer \(ps.SGD, ps.Momentum, ps.Adagrad or ps.Adam\)"
                           r", which the servers apply. Got Adam: .*compile with it directly",
        "created_after": r"variable 'grown/extra/kernel' \(shape \(1, 1\)\) was created after ServerOptimizer "
                         r"'grown_opt' declared the model's 4 dense variables on the parameter servers at its first "
                         r"step.*Create every layer before the first step",
        "shape_changed": r"variable 'resized/hidden/kernel' had shape \(5, 4\) when ServerOptimizer 'resized_opt' "
                         r"declared it on the parameter servers; now it has shape \(5, 6\)",
        "eager_unbuilt": r"ServerOptimizer 'eager_opt' must be built before the first step when the step runs "
                         r"eagerly \(run_eagerly=True or a custom loop\).*Call optimizer.build\(model.trainable_variables\) "
                         r"after compile, before fit.",
        "xla": r"ServerOptimizer 'xla_opt' calls the parameter servers from Python \(tf.py_function\), which XLA "
               r"cannot compile. Compile the model with jit_compile=False.",
    }
    assert sorted(caught) == sorted(expected)
    for case, pattern in expected.items():
        kind, message = caught[case]
        assert kind == "InvalidArgumentError", (case, kind, message)
        assert re.search(pattern, message), (case, message)


@pytest.mark.timeout(130)
def test_a_backend_other_than_tensorflow_is_named() -> None:
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    code = ("import json, unison.ps as ps, unison.ps.keras as psk\n"
            "caught = []\n"
            "for make in (lambda: psk.ServerOptimizer(ps.SGD(0.1)), lambda: psk.DistributedEmbedding('e', 8, 2)):\n"
            "    try:\n"
            "        make()\n"
            "    except Exception as exc:\n"
            "        caught.append([type(exc).__name__, str(exc)])\n"
            "print(json.dumps(caught))\n")
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=True, cwd=ROOT)
    caught = json.loads(done.stdout.strip().splitlines()[-1])
    assert [kind for kind, _ in caught] == ["ConfigError", "ConfigError"]
    for (_, message), what in zip(caught, ("ServerOptimizer", "DistributedEmbedding")):
        assert re.fullmatch(rf"unison.ps.keras.{what} needs Keras's TensorFlow backend; this process runs Keras on "
                            r"'torch'. Set KERAS_BACKEND=tensorflow before keras is first imported \(or \"backend\": "
                            r"\"tensorflow\" in ~/.keras/keras.json\).", message), message


@pytest.mark.timeout(120)
def test_a_lost_trainer_ends_the_sync_fit_of_the_others_with_an_error_naming_it(tmp_path) -> None:
    pytest.importorskip("keras")
    endpoints = [f"127.0.0.1:{free_port()}"]
    # A trainer that has not connected this long after the first is lost too: Keras trainers import
    # TensorFlow first, seconds apart on a loaded machine, so the bound leaves room for that.
    server = start_server(0, endpoints, 2, "sync", UNISON_PS_TRAINER_TIMEOUT_SECONDS="5")
    outs = [tmp_path / "t0.json", tmp_path / "t1.json"]
    trainers = [start_trainer(t, endpoints, 2, "sync", "keras_dense_lost", outs[t]) for t in range(2)]
    try:
        assert wait_all(trainers, 100) == [3, 0]
    finally:
        stop(*trainers, server)
    kind, message = json.loads(outs[0].read_text())
    # raised inside a tf.py_function: TensorFlow reports it as its own error, with the TrainerLostError's text
    assert kind == "UnknownError", (kind, message)
    assert re.search(r"TrainerLostError: trainer 0: step 2 did not complete on parameter server 0: trainer 1 "
                     r"\(\S+, pid \d+\) pushed steps up to 1 and sent nothing for \d+\.\d s; it died or is stopped",
                     message), message
