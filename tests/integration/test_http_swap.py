"""The HTTP API across a model's lifecycle, as the official openai client sees it (real
llama-server children): 503 with Retry-After while the model starts, and no call failing
across a swap (the same promises as for gRPC callers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import openai
import pytest

from daemon import Daemon
from llamad_protocol.v1 import common_pb2, control_pb2
from tests.conftest import DEFAULT_MODEL, SMALL_MODEL, model_path
from tests.support.daemon import Clients, config_env, make_daemon, serving

pytestmark = pytest.mark.integration


@pytest.fixture
async def running(llama_server: str) -> AsyncIterator[tuple[Daemon, Clients]]:
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_HTTP_LISTEN="127.0.0.1:0")
    async with serving(env) as pair:
        yield pair


async def test_a_starting_model_is_503_with_retry_after(llama_server: str) -> None:
    """Right after the daemon starts, before its child is ready, a chat is a 503 with a
    Retry-After hint; once the model is loaded, the same call succeeds."""
    daemon = make_daemon(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                                    LLAMAD_HTTP_LISTEN="127.0.0.1:0"))
    await daemon.start()
    try:
        async with openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{daemon.http_port}/v1", api_key="unused",
                max_retries=0,
                http_client=openai.DefaultAsyncHttpxClient(trust_env=False)) as sdk:
            chat = {"model": SMALL_MODEL, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "Hi"}]}
            with pytest.raises(openai.APIStatusError) as starting:
                await sdk.chat.completions.create(**chat)  # type: ignore[call-overload]
            assert starting.value.status_code == 503
            assert int(starting.value.response.headers["Retry-After"]) >= 1
            # Every model of the catalog is listed (models_dir's other GGUFs too), none
            # loaded yet; the generation default first.
            models = (await sdk.models.list()).data
            assert models[0].id == SMALL_MODEL.removesuffix(".gguf")
            assert not any(m.model_dump()["loaded"] for m in models)
            for _ in range(600):
                if (await sdk.models.list()).data[0].model_dump()["loaded"]:
                    break
                await asyncio.sleep(0.2)
            reply = await sdk.chat.completions.create(**chat)  # type: ignore[call-overload]
            assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        await daemon.shutdown()


async def test_no_http_call_fails_across_a_swap(running: tuple[Daemon, Clients]) -> None:
    """Two clients stream completions back to back while the generation model is swapped:
    every call completes (on the old model or the new one), none fails."""
    daemon, c = running
    swapped = asyncio.Event()
    models: list[str] = []
    finishes: list[str | None] = []

    async def client() -> None:
        async with openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{daemon.http_port}/v1", api_key="unused",
                max_retries=0,
                http_client=openai.DefaultAsyncHttpxClient(trust_env=False)) as sdk:
            last = False
            while not last:  # until a call that starts after the swap finished
                last = swapped.is_set()
                stream = await sdk.completions.create(
                    model="generation", prompt="List some fruits:", max_tokens=16,
                    stream=True)
                chunks = [chunk async for chunk in stream]
                models.append(chunks[-1].model)
                finishes.append(chunks[-1].choices[0].finish_reason)

    workers = [asyncio.create_task(client()) for _ in range(2)]
    await asyncio.sleep(0.5)  # calls under way on the old model
    request = control_pb2.SwapRequest(role=common_pb2.CHILD_ROLE_GENERATION,
                                      model_path=str(model_path(DEFAULT_MODEL)))
    stages = [p.stage async for p in c.control.Swap(request)]
    swapped.set()
    await asyncio.gather(*workers)  # raises if any call failed
    assert stages[-1] == control_pb2.SWAP_STAGE_DONE
    assert None not in finishes
    # The ids /v1/models lists (the file names without .gguf).
    assert models[0] == SMALL_MODEL.removesuffix(".gguf")
    assert models[-1] == DEFAULT_MODEL.removesuffix(".gguf")
