"""A daemon with the HTTP API on a free loopback port, bearer tokens required (:data:`READ`
and :data:`ADMIN`), handed over once both roles' models are loaded: for the integration
modules of the OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from daemon import Daemon
from tests.conftest import EMBED_MODEL, SMALL_MODEL
from tests.support.daemon import config_env, make_daemon

READ = "read-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
GEN_ID = SMALL_MODEL.removesuffix(".gguf")
EMB_ID = EMBED_MODEL.removesuffix(".gguf")


def auth(token: str = READ) -> dict[str, str]:
    """The headers of a call with ``token``."""
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def http_daemon(state: Path, **env: str) -> AsyncIterator[Daemon]:
    """The daemon (state under ``state``, ``env`` added to its configuration), started,
    serving once /v1/models says both roles' models are loaded; shut down at the end."""
    tokens = state / "tokens"
    tokens.write_text(f"read {READ}\nadmin {ADMIN}\n")
    tokens.chmod(0o600)
    daemon = make_daemon(config_env(
        "llama-server", LLAMAD_STATE_DIR=str(state), LLAMAD_HTTP_LISTEN="127.0.0.1:0",
        LLAMAD_AUTH_TOKEN_FILE=str(tokens), **env))
    await daemon.start()
    try:
        url = f"http://127.0.0.1:{daemon.http_port}/v1/models"
        async with httpx.AsyncClient(trust_env=False) as http:
            deadline = time.monotonic() + 120
            while True:  # both roles' models loaded (models_dir's others are listed too)
                page = (await http.get(url, headers=auth())).json()
                if all(m["loaded"] for m in page["data"] if m["id"] in (GEN_ID, EMB_ID)):
                    break
                assert time.monotonic() < deadline, page
                await asyncio.sleep(0.2)
        yield daemon
    finally:
        await daemon.shutdown()
