"""The OpenAI-compatible HTTP API of a real daemon (real llama-server children on real GGUF
models), called by clients nobody here wrote: the official ``openai`` package and curl.

One daemon serves the module, with bearer tokens, one generation slot and no wait queue
(so a second call while one streams is refused at once with 429).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import jsonschema
import numpy as np
import openai
import pytest
import pytest_asyncio

from daemon import Daemon
from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc
from tests.conftest import EMBED_MODEL, SMALL_MODEL, model_path
from tests.support.child_http import generation_idle
from tests.support.endless import never_end_openai
from tests.support.http_daemon import READ, auth, http_daemon

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

LONG = "Count from 1 to 1000: 1, 2, 3, 4, 5,"  # greedy: never ends early


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Daemon]:
    """One daemon with the HTTP API on a free loopback port, tokens required, one slot and
    no queue (a second call is refused at once), the children serving /slots."""
    async with http_daemon(tmp_path_factory.mktemp("state"), LLAMAD_GENERATION_PARALLEL="1",
                           LLAMAD_LIMITS_QUEUE_SIZE="0", LLAMAD_CHILD_SLOTS="true") as daemon:
        yield daemon


def _sdk(daemon: Daemon, key: str = READ) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{daemon.http_port}/v1", api_key=key,
                              max_retries=0,
                              http_client=openai.DefaultAsyncHttpxClient(trust_env=False))


async def test_models_chat_and_completions_through_the_openai_sdk(running: Daemon) -> None:
    """models.list, chat and completions, whole and streamed, as the official SDK reads
    them: the role in the first delta, the finish reason in the last, usage on request."""
    async with _sdk(running) as client:
        models = {m.id: m.model_dump() for m in (await client.models.list()).data}
        # Listed by their catalog names (the file's stem), as ListModels names them.
        assert models[SMALL_MODEL.removesuffix(".gguf")]["role"] == "generation"
        assert models[EMBED_MODEL.removesuffix(".gguf")]["loaded"] is True
        whole = await client.chat.completions.create(
            model=SMALL_MODEL, messages=[{"role": "user", "content": "Name a color."}],
            max_tokens=8)
        assert whole.choices[0].message.content
        assert whole.usage is not None and 1 <= whole.usage.completion_tokens <= 8
        stream = await client.chat.completions.create(
            model=SMALL_MODEL, messages=[{"role": "user", "content": "Name a color."}],
            max_tokens=8, stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] in ("stop", "length") and set(finishes[:-1]) == {None}
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
        text = await client.completions.create(model="generation",
                                               prompt="The sky is", max_tokens=4)
        assert text.choices[0].text and text.choices[0].finish_reason in ("stop", "length")
        pieces = [c.choices[0].text async for c in await client.completions.create(
            model=SMALL_MODEL, prompt="The sky is", max_tokens=4, stream=True)]
        assert "".join(pieces)


async def test_embeddings_equal_grpc_embeds_vectors(running: Daemon) -> None:
    """float and base64 embeddings are exactly the vectors gRPC Embed returns."""
    texts = ["restart nginx with systemctl", "the disk is full"]
    async with _sdk(running) as client:
        floats = await client.embeddings.create(model=EMBED_MODEL, input=texts,
                                                encoding_format="float")
        async with httpx.AsyncClient(trust_env=False) as http:
            raw = (await http.post(
                f"http://127.0.0.1:{running.http_port}/v1/embeddings", headers=auth(),
                json={"model": EMBED_MODEL, "input": texts, "encoding_format": "base64"}
            )).json()
    async with grpc.aio.insecure_channel(running.address) as channel:
        reply = await inference_pb2_grpc.InferenceServiceStub(channel).Embed(
            inference_pb2.EmbedRequest(texts=texts),
            metadata=(("authorization", f"Bearer {READ}"),))
    for i, embedding in enumerate(reply.embeddings):
        expected = np.array(embedding.values, dtype=np.float32)
        assert np.array_equal(np.array(floats.data[i].embedding, dtype=np.float32), expected)
        decoded = np.frombuffer(base64.b64decode(raw["data"][i]["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, expected)


async def test_json_schema_output_validates(running: Daemon) -> None:
    """response_format json_schema: the answer parses and validates against the schema."""
    schema = {"type": "object", "properties": {"color": {"type": "string"},
                                               "hex": {"type": "string"}},
              "required": ["color", "hex"], "additionalProperties": False}
    async with _sdk(running) as client:
        reply = await client.chat.completions.create(
            model=SMALL_MODEL, max_tokens=60,
            messages=[{"role": "user", "content": "Give a color and its hex code."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "color", "schema": schema}})
    content = reply.choices[0].message.content or ""
    jsonschema.validate(json.loads(content), schema)


async def test_unknown_model_and_tokens(running: Daemon) -> None:
    """An unknown model is NotFoundError (404); no token or a wrong one is 401."""
    async with _sdk(running) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found"
    async with _sdk(running, "not-a-valid-token-at-all") as wrong:
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
    async with httpx.AsyncClient(trust_env=False) as http:
        none = await http.get(f"http://127.0.0.1:{running.http_port}/v1/models")
    assert none.status_code == 401


async def test_busy_slot_is_429_and_a_disconnect_stops_the_child(running: Daemon) -> None:
    """While one stream holds the only slot (no queue), another call is 429 with
    Retry-After; the streaming client then disconnects and the child stops generating."""
    url = f"http://127.0.0.1:{running.http_port}/v1/completions"
    body = {"model": SMALL_MODEL, "prompt": LONG, "max_tokens": 3000, "stream": True,
            "logit_bias": never_end_openai(model_path(SMALL_MODEL))}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        async with http.stream("POST", url, json=body, headers=auth()) as stream:
            lines = stream.aiter_lines()
            got = 0
            async for line in lines:
                got += line.startswith("data: ")
                if got == 5:
                    break
            refused = await http.post(url, json={**body, "stream": False}, headers=auth())
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
    sup = running.children["generation"].supervisor
    assert await generation_idle(sup.socket, sup.pid, timeout=10), "the child kept generating"


async def test_curl_reads_the_raw_sse_stream(running: Daemon, tmp_path: Path) -> None:
    """curl -N sees 'data: {json}' events separated by blank lines, ending [DONE]."""
    out = tmp_path / "sse"
    proc = await asyncio.create_subprocess_exec(
        "curl", "-N", "-s", "-o", str(out), "-H", f"Authorization: Bearer {READ}",
        "-H", "Content-Type: application/json", "--data",
        json.dumps({"model": SMALL_MODEL, "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4, "stream": True}),
        f"http://127.0.0.1:{running.http_port}/v1/chat/completions")
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    raw = out.read_bytes()
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    bodies = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") and b"\n" not in e for e in events[:-2])
    assert bodies[0]["choices"][0]["delta"]["role"] == "assistant"
    assert bodies[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert {b["object"] for b in bodies} == {"chat.completion.chunk"}


async def test_a_child_killed_mid_stream_ends_the_stream_with_an_error(running: Daemon
                                                                      ) -> None:
    """kill -9 of the child while an HTTP stream runs: the stream ends at once with an
    UNAVAILABLE-class error event (no [DONE], no hang), the next call is 503 with
    Retry-After, and the restarted child serves again."""
    url = f"http://127.0.0.1:{running.http_port}"
    body = {"model": SMALL_MODEL, "prompt": LONG, "max_tokens": 3000, "stream": True,
            "logit_bias": never_end_openai(model_path(SMALL_MODEL))}
    pid = running.children["generation"].supervisor.pid
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        async with http.stream("POST", url + "/v1/completions", json=body,
                               headers=auth()) as stream:
            lines: list[str] = []
            async for line in stream.aiter_lines():
                lines.append(line)
                if len(lines) == 10:
                    os.kill(pid, signal.SIGKILL)
        events = [line for line in lines if line.startswith("data: ")]
        assert events[-1] != "data: [DONE]"
        error = json.loads(events[-1].removeprefix("data: "))["error"]
        assert error["code"] == "unavailable", error
        after = await http.post(url + "/v1/completions", headers=auth(),
                                json={"model": SMALL_MODEL, "prompt": "Hi", "max_tokens": 2})
        assert after.status_code == 503, after.text
        assert int(after.headers["Retry-After"]) >= 1
        deadline = time.monotonic() + 60
        while (await http.post(url + "/v1/completions", headers=auth(), json={
                "model": SMALL_MODEL, "prompt": "Hi", "max_tokens": 2})).status_code != 200:
            assert time.monotonic() < deadline, "the child never served again"
            await asyncio.sleep(0.2)
