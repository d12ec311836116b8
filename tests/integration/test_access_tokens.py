"""Access, end to end, by bearer token: what each role may call (one daemon runs the small
generation model to show a read token really generates), plain gRPC health and reflection
without a token, the token file reread on reload and refused when others may read it, and
the CLI against a daemon with TLS and a token file. Real daemons on port 0, real clients, real
certificates and token files.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from clients import AsyncClient, errors
from daemon import Daemon
from tests.conftest import ROOT
from tests.support.access import (
    ADMIN_TOKEN,
    READ_TOKEN,
    port_of,
    private,
    start,
    tls_env,
    token_files,
)
from tests.support.daemon import config_env
from tests.support.pki import Pki

pytestmark = pytest.mark.integration


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
