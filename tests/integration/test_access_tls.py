"""Access, end to end, at the transport: TLS and mutual TLS (and what a client without a
certificate, or with one from another CA, gets), certificate reload on SIGHUP (new
handshakes see the new certificate, an open channel keeps working, a bad file keeps the old
one), a bad certificate at start, the listen policy (a remote address needs TLS and
authentication) and the unix socket's mode. Real daemons on port 0 (or a unix socket), real
clients, real certificates made with openssl; both children disabled.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import stat
import time
from pathlib import Path

import pytest

from clients import AsyncClient, errors
from daemon import Daemon, load
from daemon.config import ConfigError
from tests.support.access import port_of, quiet_env, start, tls_env, token_files
from tests.support.daemon import config_env
from tests.support.pki import Pki

pytestmark = pytest.mark.integration


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
