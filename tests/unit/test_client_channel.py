"""Channel settings: the retry service config is well-formed and covers every RPC; the
address, TLS and token options are validated and really reach the server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from clients import Client, errors
from clients._channel import (
    DEFAULT_ADDRESS,
    MAX_ATTEMPTS,
    SERVICE_CONFIG_JSON,
    resolve_address,
    settings,
)
from clients.testing import FakeLlamad
from llamad_protocol.v1 import answer_pb2, control_pb2, inference_pb2, retrieval_pb2
from llamad_protocol.v1.wire import HEALTH_SERVICE

SERVICES = [
    inference_pb2.DESCRIPTOR.services_by_name["InferenceService"],
    control_pb2.DESCRIPTOR.services_by_name["ControlService"],
    retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"],
    answer_pb2.DESCRIPTOR.services_by_name["AnswerService"],
]


def names(config: dict[str, object], index: int) -> set[tuple[str, str]]:
    method_config = config["methodConfig"]
    assert isinstance(method_config, list)
    return {(n["service"], n["method"]) for n in method_config[index]["name"]}


def test_service_config_covers_every_rpc_once() -> None:
    """Unary RPCs (and Health/Check) in one retry policy, streams in the other; no RPC
    missing, none twice, no name that is not a real method."""
    config = json.loads(SERVICE_CONFIG_JSON)
    unary, streaming = names(config, 0), names(config, 1)
    expected_unary = {(s.full_name, m.name) for s in SERVICES for m in s.methods
                      if not m.server_streaming} | {(HEALTH_SERVICE, "Check")}
    expected_streaming = {(s.full_name, m.name) for s in SERVICES for m in s.methods
                          if m.server_streaming}
    assert unary == expected_unary
    assert streaming == expected_streaming
    assert ("llamad.v1.ControlService", "Status") in unary
    assert ("llamad.v1.RetrievalService", "Status") in unary
    assert ("llamad.v1.InferenceService", "Generate") in streaming
    assert not unary & streaming


def test_retry_policy_is_well_formed() -> None:
    """What gRPC's service-config parser requires: attempts 2-5, durations as "<n>s",
    multiplier > 0, codes by name; retries only on UNAVAILABLE; throttling set."""
    config = json.loads(SERVICE_CONFIG_JSON)
    for method_config in config["methodConfig"]:
        policy = method_config["retryPolicy"]
        assert 3 <= policy["maxAttempts"] <= 5
        assert policy["maxAttempts"] == MAX_ATTEMPTS
        for key in ("initialBackoff", "maxBackoff"):
            assert re.fullmatch(r"\d+(\.\d+)?s", policy[key])
        assert policy["backoffMultiplier"] > 0
        assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert config["retryThrottling"]["maxTokens"] > 0
    assert 0 < config["retryThrottling"]["tokenRatio"] <= 1


def test_channel_options_enable_retries_with_the_config() -> None:
    """The channel gets grpc.enable_retries=1 and the service config JSON."""
    opts = dict(settings("127.0.0.1:1").options)
    assert opts["grpc.enable_retries"] == 1
    assert opts["grpc.service_config"] == SERVICE_CONFIG_JSON


def test_address_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """Explicit address, then $LLAMAD_ADDRESS, then the default; a bare path is a socket."""
    monkeypatch.delenv("LLAMAD_ADDRESS", raising=False)
    assert resolve_address(None) == DEFAULT_ADDRESS == "127.0.0.1:50051"
    monkeypatch.setenv("LLAMAD_ADDRESS", "unix:/run/llamad/llamad.sock")
    assert resolve_address(None) == "unix:/run/llamad/llamad.sock"
    assert resolve_address("localhost:6000") == "localhost:6000"
    assert resolve_address("/tmp/l.sock") == "unix:/tmp/l.sock"
    with pytest.raises(ValueError, match="empty"):
        resolve_address(" ")


def test_token_options_are_validated(tmp_path: Path) -> None:
    """token and token_file exclude each other; files are read and stripped (comment lines
    skipped); empty, unreadable, world-readable or multi-token ones are refused before any
    call; a token is never sent in the clear beyond loopback."""
    token_file = tmp_path / "token"
    token_file.write_text("# for the NOC dashboard\ns3cret\n")
    token_file.chmod(0o600)
    local = "127.0.0.1:1"
    assert settings(local, token_file=token_file).metadata == (
        ("authorization", "Bearer s3cret"),)
    assert settings(local, token="abc").metadata == (("authorization", "Bearer abc"),)
    assert settings("unix:/run/l.sock", token="abc").metadata
    assert settings("localhost:1", token="abc").metadata
    assert settings("[::1]:1", token="abc").metadata
    assert settings("x:1").metadata == ()
    with pytest.raises(ValueError, match="not both"):
        settings(local, token="a", token_file=token_file)
    (tmp_path / "empty").write_text("\n# nothing\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(ValueError, match="is empty"):
        settings(local, token_file=tmp_path / "empty")
    with pytest.raises(ValueError, match="cannot read the token file"):
        settings(local, token_file=tmp_path / "missing")
    token_file.chmod(0o644)
    with pytest.raises(ValueError, match=r"readable by everyone \(mode 0644\)"):
        settings(local, token_file=token_file)
    daemon_file = tmp_path / "tokens"
    daemon_file.write_text("read 0123456789abcdef0123\n")
    daemon_file.chmod(0o600)
    with pytest.raises(ValueError, match="just one token") as info:
        settings(local, token_file=daemon_file)
    assert "0123456789abcdef" not in str(info.value)
    for remote in ("x:1", "10.0.0.5:50051", "dns:///example.com:443"):
        with pytest.raises(ValueError, match="in the clear"):
            settings(remote, token="abc")
    assert settings("x:1", token="abc", tls=True).secure


def test_tls_options_are_validated(tmp_path: Path) -> None:
    """A certificate needs its key; a missing CA file is refused; any file implies TLS."""
    with pytest.raises(ValueError, match="both cert_file and key_file"):
        settings("x:1", cert_file=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="cannot read the CA file"):
        settings("x:1", ca_file=tmp_path / "missing.pem")
    assert settings("x:1", tls=True).secure
    assert not settings("x:1").secure


def test_token_reaches_the_server_on_a_plaintext_channel() -> None:
    """On loopback without TLS the bearer token is sent as call metadata."""
    with FakeLlamad() as fake, Client(fake.address, token="tok-1") as client:
        client.status()
        list(client.generate("hi", max_tokens=1))
        assert fake.metadata["ControlService/Status"]["authorization"] == "Bearer tok-1"
        assert fake.metadata["InferenceService/Generate"]["authorization"] == "Bearer tok-1"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for localhost and a client certificate (openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=30)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=test ca")
    for name in ("server", "client"):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
            f"/CN={'localhost' if name == 'server' else 'client'}")
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
            f"{name}.ext")
    return d


@pytest.mark.process
def test_tls_with_token_uses_call_credentials(pki: Path) -> None:
    """Over TLS the token travels as access-token call credentials; the CA verifies the
    server."""
    creds = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())])
    with FakeLlamad("localhost:0", credentials=creds) as fake:
        with Client(fake.address, ca_file=pki / "ca.pem", token="tls-tok") as client:
            assert client.status().version == "0.0.0-fake"
        assert fake.metadata["ControlService/Status"]["authorization"] == "Bearer tls-tok"
        with Client(fake.address, timeout=5) as plaintext, pytest.raises(errors.Unavailable):
            plaintext.status()


@pytest.mark.process
def test_mutual_tls(pki: Path) -> None:
    """With require_client_auth the client's certificate and key are presented."""
    creds = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(), require_client_auth=True)
    with FakeLlamad("localhost:0", credentials=creds) as fake:
        with Client(fake.address, ca_file=pki / "ca.pem", cert_file=pki / "client.pem",
                    key_file=pki / "client.key") as client:
            assert client.health() == "serving"
        with Client(fake.address, ca_file=pki / "ca.pem", timeout=5) as anonymous, \
                pytest.raises(errors.Unavailable):
            anonymous.status()
