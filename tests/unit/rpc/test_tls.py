"""TLS on unison's gRPC channels: a service behind the job's certificate, clients that check it, and the
clear errors of a wrong or half setting.

The certificate in tests/data/tls is self-signed for 127.0.0.1 and localhost (valid until 2126);
``other-cert.pem`` is another self-signed certificate, whose key was thrown away.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from unison.errors import ConfigError
from unison.rpc.endpoints import open_channel, serve
from unison.rpc.gate import Gate
from unison.rpc.handlers import handlers
from unison.rpc.methods import Method, Service
from unison.rpc.security import token_metadata
from unison.rpc.stub import Stub
from unison.service import coordinator_pb2 as pb

DATA = Path(__file__).parents[2] / "data" / "tls"
SECRET = "s" * 64
ECHO = Service("unison.test.v1.Tls", (Method("Echo", pb.AbortRequest, pb.AbortRequest),), hint="run the same version.",
               refusals=())


@pytest.fixture
def key(tmp_path: Path) -> str:
    """The test key, private (git keeps it readable by all)."""
    path = tmp_path / "key.pem"
    shutil.copy(DATA / "key.pem", path)
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def tls_env(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    for name in ("UNISON_TLS_CA_FILE", "UNISON_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("UNISON_TLS_CERT_FILE", str(DATA / "cert.pem"))
    monkeypatch.setenv("UNISON_TLS_KEY_FILE", key)


def _serve() -> tuple[grpc.Server, str]:
    gate = Gate(SECRET, 2, service="the test service", why="a test")
    handler = handlers(ECHO, {"Echo": lambda request, context: pb.AbortRequest(rank=request.rank + 1)})
    server, port = serve(gate, handler, "127.0.0.1:0", who="the test service", thread_name_prefix="tls")
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def tls_server(tls_env: None) -> Iterator[str]:
    server, address = _serve()
    yield address
    server.stop(0)


def _echo(address: str, timeout: float = 5.0) -> int:
    with open_channel(address) as channel:
        return Stub(channel, ECHO, token_metadata(SECRET)).call("Echo", pb.AbortRequest(rank=1), timeout=timeout).rank


def test_a_service_and_its_clients_talk_over_tls(tls_server: str) -> None:
    assert _echo(tls_server) == 2


def test_a_plain_text_client_cannot_talk_to_a_tls_service(tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service speaks TLS only: a client without the settings is refused at the connection."""
    for name in ("UNISON_TLS_CERT_FILE", "UNISON_TLS_KEY_FILE"):
        monkeypatch.delenv(name)
    with pytest.raises(grpc.RpcError) as raised:
        _echo(tls_server, timeout=3)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value


def test_a_client_refuses_a_service_whose_certificate_it_does_not_trust(
        tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNISON_TLS_CA_FILE", str(DATA / "other-cert.pem"))
    with pytest.raises(grpc.RpcError) as raised:
        _echo(tls_server, timeout=3)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value
    assert "CERTIFICATE_VERIFY_FAILED" in raised.value.details(), raised.value.details()


def test_a_client_needs_only_the_authority(tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UNISON_TLS_CERT_FILE", "UNISON_TLS_KEY_FILE"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("UNISON_TLS_CA_FILE", str(DATA / "cert.pem"))
    assert _echo(tls_server) == 2


def test_the_server_name_override_is_checked_against_the_certificate(
        tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNISON_TLS_SERVER_NAME", "localhost")  # in the certificate
    assert _echo(tls_server) == 2
    monkeypatch.setenv("UNISON_TLS_SERVER_NAME", "elsewhere.example")  # not in it
    with pytest.raises(grpc.RpcError) as raised:
        _echo(tls_server, timeout=3)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, raised.value


def test_half_settings_and_open_keys_are_refused_with_the_variable_named(
        tls_env: None, monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    Path(key).chmod(0o644)
    with pytest.raises(ConfigError, match=r"UNISON_TLS_KEY_FILE=.* is accessible to group or others .*chmod 600"):
        _serve()
    Path(key).chmod(0o600)
    monkeypatch.delenv("UNISON_TLS_KEY_FILE")
    with pytest.raises(ConfigError, match="the test service serves over TLS .* but UNISON_TLS_KEY_FILE is not set"):
        _serve()
    monkeypatch.setenv("UNISON_TLS_KEY_FILE", key)
    monkeypatch.delenv("UNISON_TLS_CERT_FILE")
    with pytest.raises(ConfigError, match="UNISON_TLS_KEY_FILE is set without UNISON_TLS_CERT_FILE or "):
        _serve()
    monkeypatch.delenv("UNISON_TLS_KEY_FILE")
    monkeypatch.setenv("UNISON_TLS_SERVER_NAME", "localhost")  # alone: TLS asked for, no certificate to use
    with pytest.raises(ConfigError, match="UNISON_TLS_SERVER_NAME is set without .* would otherwise stay plain text"):
        open_channel("127.0.0.1:1")
    monkeypatch.delenv("UNISON_TLS_SERVER_NAME")
    monkeypatch.setenv("UNISON_TLS_CERT_FILE", "/nonexistent/cert.pem")
    with pytest.raises(ConfigError, match=r"UNISON_TLS_CERT_FILE='/nonexistent/cert.pem' cannot be read"):
        open_channel("127.0.0.1:1")


def test_files_without_pem_are_refused_naming_the_variable(
        tls_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    garbage.chmod(0o600)
    monkeypatch.setenv("UNISON_TLS_KEY_FILE", str(garbage))
    with pytest.raises(ConfigError, match="UNISON_TLS_KEY_FILE=.* holds no PEM block .* private key file"):
        _serve()
    monkeypatch.setenv("UNISON_TLS_CA_FILE", str(garbage))
    with pytest.raises(ConfigError, match="UNISON_TLS_CA_FILE=.* holds no PEM block .* certificate file"):
        open_channel("127.0.0.1:1")


def test_a_client_reads_no_key(tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a service reads the key: a client host whose key file is missing still connects."""
    monkeypatch.setenv("UNISON_TLS_KEY_FILE", "/nonexistent/key.pem")
    assert _echo(tls_server) == 2


def test_without_tls_settings_channels_stay_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UNISON_TLS_CERT_FILE", "UNISON_TLS_KEY_FILE", "UNISON_TLS_CA_FILE", "UNISON_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    server, address = _serve()
    try:
        assert _echo(address) == 2
    finally:
        server.stop(0)
