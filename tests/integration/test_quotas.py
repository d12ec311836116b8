"""Per-token quotas with a real daemon (issue 28): a real embedding child, the gRPC and HTTP
listeners on port 0, real clients. A token with rpm=2 gets its third call refused on
both APIs with a retry hint, another token is unaffected, and once the window has moved
(``auth.quota_window`` = 10 s here; the injected-clock tests are in tests/unit) the token
is served again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from clients import AsyncClient, errors
from daemon import Daemon
from tests.support.access import private, start
from tests.support.daemon import config_env

pytestmark = pytest.mark.integration

LIMITED = "limited-token-0123456789abcdef"
FREE = "free-token-0123456789abcdef"
WINDOW = 10.0


async def test_rpm_refuses_the_third_call_on_both_apis_and_recovers(
        started: list[Daemon], tmp_path: Path, llama_server: str) -> None:
    """rpm=2 within a 10 s window: Embed, Embed, then RESOURCE_EXHAUSTED with a retry
    hint over gRPC and 429 with Retry-After over HTTP; the free token embeds meanwhile;
    after the hint the limited token embeds again; the refusals are counted by class."""
    tokens = private(tmp_path / "tokens", f"read {LIMITED} class=etl rpm=2\n"
                                          f"read {FREE} class=people\n")
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_AUTH_TOKEN_FILE=str(tokens), LLAMAD_HTTP_LISTEN="127.0.0.1:0",
                     LLAMAD_AUTH_QUOTA_WINDOW=str(WINDOW))
    daemon = await start(started, env)
    async with AsyncClient(daemon.address, token=LIMITED, timeout=120) as limited, \
            AsyncClient(daemon.address, token=FREE, timeout=120) as free, \
            httpx.AsyncClient(trust_env=False, timeout=60) as http:
        await free.wait_serving("embedding", timeout=120)
        await free.embed("warm up")  # the free token's calls are never limited
        began = time.monotonic()
        await limited.embed("disk full on web01")
        await limited.embed("disk full on web02")
        with pytest.raises(errors.ResourceExhausted, match="quota exceeded") as info:
            await limited.embed("disk full on web03")
        assert time.monotonic() - began < WINDOW  # else the window moved: no refusal due
        hint = info.value.retry_after
        assert hint is not None and 0 < hint <= WINDOW
        url = f"http://127.0.0.1:{daemon.http_port}/v1/embeddings"
        body = {"input": "disk full", "model": "all-MiniLM-L6-v2-f16"}
        refused = await http.post(url, json=body,
                                  headers={"Authorization": f"Bearer {LIMITED}"})
        assert refused.status_code == 429, refused.text
        retry_after = int(refused.headers["Retry-After"])
        assert 1 <= retry_after <= WINDOW
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        served = await http.post(url, json=body, headers={"Authorization": f"Bearer {FREE}"})
        assert served.status_code == 200, served.text
        assert len((await free.embed(["a", "b"])).vectors) == 2
        await asyncio.sleep(retry_after)  # the hint: the first call has left the window
        assert len((await limited.embed("disk full again")).vectors) == 1
        metrics = daemon.metrics.render().decode()
        assert ('llamad_quota_exceeded_total{class="etl",limit="requests",mode="enforce"} '
                '2.0') in metrics
        assert LIMITED not in metrics and FREE not in metrics
