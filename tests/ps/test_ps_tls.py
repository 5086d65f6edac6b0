"""Parameter servers and trainers over TLS (UNISON_TLS_*): training runs encrypted, and a trainer without
the settings is refused at the handshake, its error naming the server."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ps._cluster import HERE, ROOT, environment, free_port, start_server, start_trainer, stop, wait_all

DATA = ROOT / "tests" / "data" / "tls"


@pytest.fixture
def tls(tmp_path: Path) -> dict[str, str]:
    key = tmp_path / "key.pem"
    shutil.copy(DATA / "key.pem", key)
    key.chmod(0o600)  # git keeps it readable by all; unison refuses a key that is
    return {"UNISON_TLS_CERT_FILE": str(DATA / "cert.pem"), "UNISON_TLS_KEY_FILE": str(key)}


@pytest.mark.timeout(120)
def test_synchronous_training_over_tls(tmp_path: Path, tls: dict[str, str]) -> None:
    endpoints = [f"127.0.0.1:{free_port()}"]
    server = start_server(0, endpoints, 1, "sync", **tls)
    out = tmp_path / "t0.json"
    trainer = start_trainer(0, endpoints, 1, "sync", "sync_pauses", out, STEPS="3", PAUSES="99", **tls)
    try:
        assert wait_all([trainer], 90) == [0]
        assert wait_all([server], 20) == [0]
    finally:
        stop(trainer, server)
    assert json.loads(out.read_text()) == {"w": pytest.approx([-0.3] * 4)}


@pytest.mark.timeout(120)
def test_a_trainer_without_tls_is_refused_by_a_server_with_it(tmp_path: Path, tls: dict[str, str]) -> None:
    port = free_port()
    endpoints = [f"127.0.0.1:{port}"]
    server = start_server(0, endpoints, 1, "sync", **tls)
    deadline = time.monotonic() + 60
    while True:  # the server listens before the trainer tries: what refuses it is TLS, not a closed port
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline and server.poll() is None, "the server never listened"
        time.sleep(0.05)
    env = environment(endpoints, 1, "sync", UNISON_PS_ROLE="trainer", UNISON_PS_TRAINER_ID="0", STEPS="1",
                      PAUSES="99", UNISON_PS_RECONNECT_SECONDS="3")
    try:
        trainer = subprocess.run([sys.executable, str(HERE / "_trainer.py"), "sync_pauses", str(tmp_path / "t0.json")],
                                 env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    finally:
        stop(server)
    assert trainer.returncode != 0
    assert "ServerUnavailableError: parameter server 0 (127.0.0.1:" in trainer.stderr, trainer.stderr[-2000:]
    assert "UNISON_TLS_* must be set alike on servers and trainers" in trainer.stderr, trainer.stderr[-2000:]
    assert "Connection refused" not in trainer.stderr, trainer.stderr[-2000:]
