"""Access, end to end: a real daemon on port 0 (or a unix socket), real clients, real
certificates (made with openssl) and real token files.

TLS and mutual TLS (and what a client without a certificate, or with one from another CA,
gets), certificate reload on SIGHUP (new handshakes see the new certificate, an open
channel keeps working, a bad file keeps the old one), bearer tokens and roles, the token
file's own checks, listen policy, the unix socket's mode, and where directory sources
may live. Most daemons here run with both children disabled (access does not need
them); one runs the small generation model to show a read token really generates.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from clients import AsyncClient, errors
from daemon import Daemon, load
from daemon.config import ConfigError
from tests.conftest import ROOT
from tests.support.daemon import config_env
from tests.support.pki import Issued, Pki
from tests.support.races import OUTSIDE_DIR_WORD, swap_forever

pytestmark = pytest.mark.integration

READ_TOKEN = "read-0123456789abcdef-read"
ADMIN_TOKEN = "admin-fedcba9876543210-admin"


# --- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def token_files(d: Path) -> tuple[Path, Path, Path]:
    """The daemon's token file, and one client token file per role."""
    tokens = private(d / "tokens", f"# role token\nread {READ_TOKEN}\n\nadmin {ADMIN_TOKEN}\n")
    return (tokens, private(d / "read.token", READ_TOKEN + "\n"),
            private(d / "admin.token", f"# deploy pipeline\n{ADMIN_TOKEN}\n"))


def quiet_env(**overrides: str) -> dict[str, str]:
    """A daemon with both children disabled: fast, and enough for access checks."""
    return config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                      LLAMAD_EMBEDDING_ENABLED="false", **overrides)


def tls_env(cert: Issued, **overrides: str) -> dict[str, str]:
    return quiet_env(**{"LLAMAD_TLS_CERT_FILE": str(cert.cert),
                        "LLAMAD_TLS_KEY_FILE": str(cert.key), **overrides})


@pytest.fixture
async def started() -> AsyncIterator[list[Daemon]]:
    """Daemons a test starts; all shut down at the end."""
    daemons: list[Daemon] = []
    yield daemons
    for d in daemons:
        await d.shutdown()


async def start(started: list[Daemon], env: dict[str, str], *, reload: bool = False) -> Daemon:
    daemon = Daemon(load(None, env=env), reload=(lambda: load(None, env=env)) if reload else None)
    started.append(daemon)
    await daemon.start()
    return daemon


def port_of(daemon: Daemon) -> int:
    return int(daemon.address.rpartition(":")[2])


def peer_certificate(port: int, ca: Path) -> bytes:
    """The certificate a fresh TLS handshake (ALPN h2, as gRPC) is shown, DER-encoded."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.selected_alpn_protocol() == "h2"
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


async def code_of(call: Callable[[], object]) -> str:
    """The status code name a call ends with (awaiting a unary call or draining a stream)."""
    started = call()
    try:
        if hasattr(started, "__aiter__"):
            async for _ in started:
                pass
        else:
            await started  # type: ignore[misc]
    except errors.LlamadError as exc:
        return str(exc.code)
    return "OK"


# --- TLS and mutual TLS ----------------------------------------------------------------


async def test_tls_handshake_and_plaintext_refused(started: list[Daemon], pki: Pki) -> None:
    """A TLS daemon answers a client that trusts its CA, presents its certificate with
    ALPN h2, and a plaintext client gets nowhere."""
    daemon = await start(started, tls_env(pki.server1))
    address = f"localhost:{port_of(daemon)}"
    async with AsyncClient(address, ca_file=pki.ca.cert, timeout=10) as client:
        assert (await client.status()).version
    assert await asyncio.to_thread(peer_certificate, port_of(daemon), pki.ca.cert) \
        == pki.server1.der()
    async with AsyncClient(address, timeout=3) as plaintext:
        with pytest.raises(errors.Unavailable):
            await plaintext.status()
    async with AsyncClient(address, ca_file=pki.other_ca.cert, timeout=3) as wrong_ca:
        with pytest.raises(errors.Unavailable):
            await wrong_ca.status()


async def test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca(
    started: list[Daemon], pki: Pki
) -> None:
    """With tls.client_ca_file, only a client certificate signed by that CA gets in."""
    daemon = await start(started, tls_env(pki.server1,
                                          LLAMAD_TLS_CLIENT_CA_FILE=str(pki.ca.cert)))
    address = f"localhost:{port_of(daemon)}"
    async with AsyncClient(address, ca_file=pki.ca.cert, cert_file=pki.client.cert,
                           key_file=pki.client.key, timeout=10) as client:
        assert (await client.status()).version
    async with AsyncClient(address, ca_file=pki.ca.cert, timeout=3) as anonymous:
        with pytest.raises(errors.Unavailable):
            await anonymous.status()
    async with AsyncClient(address, ca_file=pki.ca.cert, cert_file=pki.stranger.cert,
                           key_file=pki.stranger.key, timeout=3) as stranger:
        with pytest.raises(errors.Unavailable):
            await stranger.status()


async def test_sighup_reloads_the_certificate(
    started: list[Daemon], pki: Pki, tmp_path: Path
) -> None:
    """New certificate files and SIGHUP: new handshakes see the new certificate, an open
    channel keeps working. A bad file at the next reload keeps the certificate in use, and
    the report says why."""
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(pki.server1.cert, cert)
    shutil.copy(pki.server1.key, key)
    daemon = await start(started, quiet_env(LLAMAD_TLS_CERT_FILE=str(cert),
                                            LLAMAD_TLS_KEY_FILE=str(key)), reload=True)
    daemon.install_signal_handlers()
    port = port_of(daemon)
    async with AsyncClient(f"localhost:{port}", ca_file=pki.ca.cert, timeout=10) as old:
        await old.status()
        assert await asyncio.to_thread(peer_certificate, port, pki.ca.cert) == \
            pki.server1.der()
        shutil.copy(pki.server2.cert, cert)
        shutil.copy(pki.server2.key, key)
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 10
        while daemon.config.tls is None or daemon.config.tls.cert_chain != cert.read_bytes():
            assert time.monotonic() < deadline, "SIGHUP did not reload the certificate"
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(peer_certificate, port, pki.ca.cert) == \
            pki.server2.der()
        await old.status()  # the connection made with the old certificate
        async with AsyncClient(f"localhost:{port}", ca_file=pki.ca.cert, timeout=10) as new:
            await new.status()

        cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        report = await daemon.reload()
        assert "tls" in report.error and str(cert) in report.error
        assert await asyncio.to_thread(peer_certificate, port, pki.ca.cert) == \
            pki.server2.der()
        await old.status()


async def test_bad_certificate_at_start_is_a_clear_error(pki: Pki, tmp_path: Path) -> None:
    """Garbage, a key from another certificate, a world-readable key: refused at load,
    naming the file."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello\n")
    with pytest.raises(ConfigError, match=rf"tls: .*{garbage}.*no PEM certificate"):
        load(None, env=quiet_env(LLAMAD_TLS_CERT_FILE=str(garbage),
                                 LLAMAD_TLS_KEY_FILE=str(pki.server1.key)))
    with pytest.raises(ConfigError, match="does not match the certificate"):
        load(None, env=tls_env(pki.server1, LLAMAD_TLS_KEY_FILE=str(pki.server2.key)))
    key = tmp_path / "open.key"
    shutil.copy(pki.server1.key, key)
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=rf"{key} is readable by everyone \(mode 0644\)"):
        load(None, env=tls_env(pki.server1, LLAMAD_TLS_KEY_FILE=str(key)))


# --- listen policy and the unix socket -------------------------------------------------


async def test_remote_listen_needs_tls_and_authentication(
    started: list[Daemon], pki: Pki, tmp_path: Path
) -> None:
    """0.0.0.0 in the clear is refused at load; with TLS but no tokens or client CA too;
    with TLS and tokens the daemon listens on every interface and answers over TLS."""
    tokens, read, _ = token_files(tmp_path)
    with pytest.raises(ConfigError, match=r"not a loopback address.*requires TLS"):
        load(None, env=quiet_env(LLAMAD_LISTEN="0.0.0.0:0"))
    with pytest.raises(ConfigError, match="requires client authentication"):
        load(None, env=tls_env(pki.server1, LLAMAD_LISTEN="0.0.0.0:0"))
    daemon = await start(started, tls_env(pki.server1, LLAMAD_LISTEN="0.0.0.0:0",
                                          LLAMAD_AUTH_TOKEN_FILE=str(tokens)))
    assert daemon.address.startswith("0.0.0.0:")
    async with AsyncClient(f"127.0.0.1:{port_of(daemon)}", ca_file=pki.ca.cert,
                           token_file=read, timeout=10) as client:
        assert (await client.status()).version


async def test_unix_socket_in_the_state_directory_has_mode_0660(
    started: list[Daemon], tmp_path: Path
) -> None:
    """listen = unix:llamad.sock lands in the state directory with mode 0660; clients
    connect; a second daemon on the same socket is refused (not silently taking it over);
    shutdown removes the file, and a stale one left behind is replaced."""
    state = Path(config_env("llama-server")["LLAMAD_STATE_DIR"])
    env = quiet_env(LLAMAD_LISTEN="unix:llamad.sock", LLAMAD_STATE_DIR=str(state))
    daemon = await start(started, env)
    path = state / "llamad.sock"
    assert daemon.address == f"unix:{path}"
    st = path.lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    async with AsyncClient(daemon.address, timeout=10) as client:
        assert (await client.status()).version
    second = Daemon(load(None, env={**env, "LLAMAD_STATE_DIR": str(tmp_path / "other"),
                                     "LLAMAD_LISTEN": daemon.address}))
    with pytest.raises(OSError, match="another process is listening on it"):
        await second.start()
    await second.shutdown()
    async with AsyncClient(daemon.address, timeout=10) as client:
        assert (await client.status()).version
    await daemon.shutdown()
    assert not path.exists()

    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # bound, never listening: what a killed daemon leaves
    again = await start(started, env)
    async with AsyncClient(again.address, timeout=10) as client:
        assert (await client.status()).version


# --- bearer tokens and roles -----------------------------------------------------------


@pytest.fixture
async def token_daemon(started: list[Daemon], tmp_path: Path,
                       llama_server: str) -> tuple[Daemon, Path, Path, Path]:
    """Tokens on, with the small generation model (a read token must really generate)."""
    tokens, read, admin = token_files(tmp_path)
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_AUTH_TOKEN_FILE=str(tokens))
    daemon = await start(started, env, reload=True)
    return daemon, tokens, read, admin


async def test_tokens_and_roles(token_daemon: tuple[Daemon, Path, Path, Path]) -> None:
    """No token or an unknown one: UNAUTHENTICATED. A read token generates and reads status
    but gets PERMISSION_DENIED on Swap, SetMode, Reset and TailLogs; an admin token gets
    through. Health needs no token. Denials are logged without the token."""
    daemon, _, read, admin = token_daemon
    address = daemon.address
    async with AsyncClient(address, timeout=60) as anonymous, \
            AsyncClient(address, token="not-a-configured-token", timeout=10) as unknown, \
            AsyncClient(address, token_file=read, timeout=60) as reader, \
            AsyncClient(address, token_file=admin, timeout=60) as admin_client:
        await anonymous.wait_serving("generation", timeout=120)  # health: no token needed
        assert await anonymous.health() == "serving"
        with capture_logs() as logs:
            with pytest.raises(errors.Unauthenticated, match="requires a bearer token"):
                await anonymous.status()
            with pytest.raises(errors.Unauthenticated, match="not valid"):
                await unknown.status()
            for call in (lambda: reader.swap("generation", rollback=True),
                         lambda: reader.set_mode("generation", "disabled"),
                         lambda: reader.reset("generation"),
                         lambda: reader.tail_logs("generation", lines=1)):
                assert await code_of(call) == "PERMISSION_DENIED"
        denials = [e for e in logs if e["event"] == "access denied"]
        assert [d["method"] for d in denials] == [
            "ControlService/Status", "ControlService/Status", "ControlService/Swap",
            "ControlService/SetMode", "ControlService/Reset", "ControlService/TailLogs"]
        assert denials[0]["reason"] == "no token" and denials[0]["peer"]
        assert denials[2]["reason"] == "needs admin"
        dump = json.dumps(logs, default=str)
        for secret in (READ_TOKEN, ADMIN_TOKEN, "not-a-configured-token"):
            assert secret not in dump
        with pytest.raises(errors.PermissionDenied, match="needs a token with the admin role"):
            await reader.reset("generation")

        assert (await reader.status()).version
        result = await reader.generate("The capital of France is", max_tokens=4).collect()
        assert result.usage is not None and result.usage.completion_tokens >= 1
        assert [line async for line in admin_client.tail_logs("generation", lines=2)]
        # Past the access check: the swap itself refuses (no previous model to go back to).
        assert await code_of(lambda: admin_client.swap("generation", rollback=True)) \
            not in ("OK", "UNAUTHENTICATED", "PERMISSION_DENIED")
        assert (await admin_client.status()).version
        assert [s.id for s in await reader.list_sources()] == []
        with pytest.raises(errors.PermissionDenied):
            await reader.add_source("notes")
        await admin_client.add_source("notes")


async def test_plain_grpc_health_and_reflection(
    token_daemon: tuple[Daemon, Path, Path, Path]
) -> None:
    """With raw stubs: health answers without metadata; anything else needs the token in
    the authorization metadata, ``Bearer <token>``."""
    daemon, *_ = token_daemon
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")

        async def reflect(metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
            try:
                async for _ in stub.ServerReflectionInfo(iter([request]), metadata=metadata,
                                                         timeout=10):
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        assert await reflect(()) is grpc.StatusCode.UNAUTHENTICATED
        assert await reflect((("authorization", f"Basic {READ_TOKEN}"),)) \
            is grpc.StatusCode.UNAUTHENTICATED
        assert await reflect((("authorization", f"Bearer {READ_TOKEN}"),)) \
            is grpc.StatusCode.OK


async def test_token_file_is_reread_on_reload(
    token_daemon: tuple[Daemon, Path, Path, Path], tmp_path: Path
) -> None:
    """A new token file and a reload: the removed token is refused, the new one works; a
    world-readable file at reload is refused and the running tokens stay."""
    daemon, tokens, read, _ = token_daemon
    new_token = "rotated-00112233445566778899"
    private(tokens, f"admin {ADMIN_TOKEN}\nread {new_token}\n")
    report = await daemon.reload()
    assert report.reloaded == ["auth.token_file"] and not report.error
    async with AsyncClient(daemon.address, token_file=read, timeout=10) as old, \
            AsyncClient(daemon.address, token=new_token, timeout=10) as new:
        with pytest.raises(errors.Unauthenticated):
            await old.status()
        assert (await new.status()).version
        tokens.chmod(0o644)
        report = await daemon.reload()
        assert f"{tokens} is readable by everyone (mode 0644)" in report.error
        assert (await new.status()).version


def test_world_readable_token_file_refuses_to_start(tmp_path: Path) -> None:
    """The daemon does not start with a token file others can read: exit status 2, one
    line naming the file and its mode, never the token."""
    tokens, *_ = token_files(tmp_path)
    tokens.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "serve", "--listen", "127.0.0.1:0",
         "--auth-token-file", str(tokens), "--no-generation-enabled",
         "--no-embedding-enabled", "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert f"auth.token_file: token file {tokens} is readable by everyone (mode 0644)" \
        in result.stderr
    assert READ_TOKEN not in result.stderr and "Traceback" not in result.stderr


# --- the CLI against an access-controlled daemon ---------------------------------------


async def test_cli_with_tls_and_token_file(
    started: list[Daemon], pki: Pki, tmp_path: Path
) -> None:
    """`llamad status` over mutual TLS with the token from --token-file or
    $LLAMAD_TOKEN_FILE works; without a token it fails with one line; a read token on
    swap is refused."""
    tokens, read, admin = token_files(tmp_path)
    daemon = await start(started, tls_env(pki.server1, LLAMAD_AUTH_TOKEN_FILE=str(tokens),
                                          LLAMAD_TLS_CLIENT_CA_FILE=str(pki.ca.cert)))
    base = [sys.executable, "-m", "daemon"]
    tls = ["--address", f"localhost:{port_of(daemon)}", "--ca", str(pki.ca.cert),
           "--cert", str(pki.client.cert), "--key", str(pki.client.key), "--timeout", "20"]

    def llamad(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, check=False, env={**os.environ, **env},
                              stdin=subprocess.DEVNULL)

    ok, via_env, none, refused = await asyncio.gather(
        asyncio.to_thread(llamad, "status", "--json", *tls, "--token-file", str(read)),
        asyncio.to_thread(llamad, "status", "--json", *tls, LLAMAD_TOKEN_FILE=str(admin)),
        asyncio.to_thread(llamad, "status", *tls),
        asyncio.to_thread(llamad, "swap", "generation", "--rollback", *tls,
                          "--token-file", str(read)))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["version"]
    assert via_env.returncode == 0, via_env.stderr
    assert none.returncode == 1
    assert none.stderr.startswith("llamad: status: not authenticated: ")
    assert refused.returncode == 1
    assert "permission denied" in refused.stderr and "admin" in refused.stderr


# --- where directory sources may live --------------------------------------------------


async def test_directory_sources_only_under_allowed_roots(
    started: list[Daemon], tmp_path: Path
) -> None:
    """Without allowed roots, directory sources are refused (FAILED_PRECONDITION naming
    the option). With one: outside it, through '..', or through a symlink out of it is
    PERMISSION_DENIED; inside is accepted and indexed; a root swapped for a symlink to
    elsewhere after it was added is refused at the next scan."""
    docs, outside = tmp_path / "docs", tmp_path / "outside"
    (docs / "runbooks").mkdir(parents=True)
    outside.mkdir()
    (docs / "runbooks" / "disk.md").write_text("# Disk full\n\nRotate the nginx logs.\n")
    (outside / "secret.md").write_text("# Secret\n\nnot for the index\n")
    (docs / "escape").symlink_to(outside)

    closed = await start(started, quiet_env())
    async with AsyncClient(closed.address, timeout=10) as client:
        with pytest.raises(errors.FailedPrecondition, match=r"retrieval.allowed_roots"):
            await client.add_source("docs", docs)
    await closed.shutdown()

    daemon = await start(started, quiet_env(LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(docs)))
    async with AsyncClient(daemon.address, timeout=30) as client:
        for path in (outside, docs / ".." / "outside", docs / "escape",
                     docs / "runbooks" / ".." / ".." / "outside"):
            with pytest.raises(errors.PermissionDenied, match=r"outside retrieval.allowed_roots"):
                await client.add_source("bad", path)
        await client.add_source("docs", docs / "runbooks")
        final = [p async for p in client.reindex("docs")][-1]
        assert (final.added, final.seen) == (1, 1)
        assert [s.id for s in await client.list_sources()] == ["docs"]

        moved = tmp_path / "runbooks.real"
        (docs / "runbooks").rename(moved)
        (docs / "runbooks").symlink_to(outside)
        with pytest.raises(errors.PermissionDenied, match=r"outside retrieval.allowed_roots"):
            _ = [p async for p in client.reindex("docs")]
        hits = await client.search("secret")
        assert hits.hits == ()


async def test_allowed_roots_from_the_config_file_apply_on_reload(
    started: list[Daemon], tmp_path: Path
) -> None:
    """The refusal without roots says how to set them; doing what it says for a running
    daemon (allowed_roots in its config file, then a reload) opens directory sources
    under the new root, without a restart."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "disk.md").write_text("# Disk full\n\nRotate the nginx logs.\n")
    file = tmp_path / "llamad.toml"
    file.write_text("drain_grace = 5\n")
    daemon = await start(started, quiet_env(LLAMAD_CONFIG=str(file)), reload=True)
    async with AsyncClient(daemon.address, timeout=10) as client:
        with pytest.raises(errors.FailedPrecondition) as refused:
            await client.add_source("docs", docs)
        for words in ("--retrieval-allowed-roots", "LLAMAD_RETRIEVAL_ALLOWED_ROOTS",
                      "under [retrieval] in its config file", "systemctl reload llamad"):
            assert words in refused.value.details
        file.write_text(f'drain_grace = 5\n[retrieval]\nallowed_roots = ["{docs}"]\n')
        report = await daemon.reload()
        assert report.reloaded == ["retrieval.allowed_roots"] and not report.error
        await client.add_source("docs", docs)
        final = [p async for p in client.reindex("docs")][-1]
        assert (final.added, final.seen) == (1, 1)


async def test_symlink_race_never_hands_a_read_token_outside_files(
    started: list[Daemon], tmp_path: Path
) -> None:
    """An attacker with a read token and write access to one folder under the allowed
    roots swaps a file there between a regular file and a symlink to the daemon's own
    token file (and a directory between a directory and a symlink to an outside one)
    while an admin reindexes, round after round for a bounded time: a Search with the
    read token never returns a byte of the token file or of the outside directory."""
    tokens, read, admin = token_files(tmp_path)
    root, outside = tmp_path / "shared", tmp_path / "outside"
    src = root / "team"
    (src / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "note.md").write_text(f"# Outside\n\n{OUTSIDE_DIR_WORD} outside only\n")
    (src / "sub" / "note.md").write_text("# Inside\n\ninside note\n")
    (src / "stable.md").write_text("# Stable\n\nalways here\n")
    daemon = await start(started, quiet_env(LLAMAD_AUTH_TOKEN_FILE=str(tokens),
                                            LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(root)))
    stop = threading.Event()
    racer = threading.Thread(target=swap_forever, args=(src, tokens, outside, stop),
                             daemon=True)
    async with AsyncClient(daemon.address, token_file=admin, timeout=30) as operator, \
            AsyncClient(daemon.address, token_file=read, timeout=30) as reader:
        await operator.add_source("team", src)
        racer.start()
        rounds = 0
        try:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                _ = [p async for p in operator.reindex("team")]
                rounds += 1
                for query in (ADMIN_TOKEN, "admin", "fedcba9876543210", "read",
                              OUTSIDE_DIR_WORD):
                    hits = (await reader.search(query, top_k=20)).hits
                    leaked = [h.chunk_id for h in hits
                              if ADMIN_TOKEN in h.text or READ_TOKEN in h.text
                              or "role token" in h.text or OUTSIDE_DIR_WORD in h.text]
                    assert leaked == [], f"round {rounds}: {leaked}"
        finally:
            stop.set()
            racer.join(10)
        assert rounds >= 10
        assert [h.document_id for h in (await reader.search("always")).hits] == ["team/stable.md"]
