"""The stream interval (``[child] stream_interval``, issue 27) on real processes: the
fake child supervised for real, streamed through the lean transport, alone and through
the OpenAI-compatible HTTP API in this process. Once the first chunk is relayed the
child's socket is read once per interval: what came meanwhile is one chunk (one SSE
event). Nothing is lost: every token, the usage, the metrics, the promised fields only;
a cancel during a pause reaches the child at once; a child that dies mid-stream ends the
stream with the API's error event after the tokens it sent."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from daemon.models.backend import ChildBackend
from supervisor import Sampling
from supervisor.testing.fake_child import generate_tokens
from supervisor.testing.fake_runtime import FakeRuntime
from tests.support.httpapi import Harness as Api
from tests.support.httpapi import events, serving
from tests.support.supervised import Harness, fake_model, supervise

TOKENS = 60
DELAY = 0.005  # s a token: the child sends its tokens one event at a time
PROMPT = "user: tell\nassistant:"
CHUNK_KEYS = {"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
CHOICE_KEYS = {"index", "delta", "logprobs", "finish_reason"}


@pytest.fixture
async def supervised(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start a supervisor of the fake child with ``runtime`` and ``interval`` (s)."""
    made: list[Harness] = []

    async def start(runtime: FakeRuntime, interval: float) -> Harness:
        h = supervise(fake_model(tmp_path), runtime, stream_interval=interval)
        made.append(h)
        h.sup.start()
        await h.until("starting,running")
        return h

    yield start
    for h in made:
        await h.sup.stop()


async def cancelled(h: Harness, timeout: float) -> None:
    """Wait until the child says it stopped a generation (its client went away)."""
    deadline = time.monotonic() + timeout
    while not any("cancel task" in line.text for line in h.ring.tail()):
        assert time.monotonic() < deadline, "the child never stopped the generation"
        await asyncio.sleep(0.05)


async def test_a_paced_stream_relays_every_token_in_fewer_chunks(
        supervised: Callable[..., Any]) -> None:
    """Every token in order, counted, the child's usage last, in fewer chunks than tokens;
    the first chunk is the first token alone (never held)."""
    h = await supervised(FakeRuntime(token_delay=DELAY), 0.2)
    chunks = [c async for c in h.sup.client.stream_chat([("user", "tell")],
                                                         Sampling(max_tokens=TOKENS))]
    body, last = chunks[:-1], chunks[-1]
    words = generate_tokens(PROMPT, TOKENS)
    assert (body[0].text, body[0].tokens) == (words[0], 1)
    assert "".join(c.text for c in body) == "".join(words)
    assert sum(c.tokens for c in body) == TOKENS == last.completion_tokens
    assert len(body) < TOKENS / 3
    assert last.finish_reason == "length"


@pytest.fixture
async def api(supervised: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """The HTTP API in this process over a supervised fake child (``runtime``,
    ``interval``); yields the API's harness and the supervisor's."""
    async def start(runtime: FakeRuntime, interval: float) -> tuple[Api, Harness]:
        h = await supervised(runtime, interval)
        harness = await stack.enter_async_context(
            serving(generation=ChildBackend(h.sup.client, None)))
        return harness, h

    async with contextlib.AsyncExitStack() as stack:
        yield start


def chat(max_tokens: int = TOKENS) -> dict[str, Any]:
    """A streamed chat with the usage chunk (the model: the fake child's file)."""
    return {"model": "fake.gguf", "messages": [{"role": "user", "content": "tell"}],
            "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}


async def test_an_http_stream_carries_every_token_usage_and_only_promised_fields(
        api: Callable[..., Any]) -> None:
    """Over HTTP the joined events carry every token once, the usage chunk the child's
    counts, llamad's own id and model name (not the child's), only the fields of
    OpenAI's chunk; the metrics count every token."""
    harness, h = await api(FakeRuntime(token_delay=DELAY), 0.2)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        answer = await http.post(f"{harness.url}/v1/chat/completions", json=chat())
    assert answer.status_code == 200
    got: list[Any] = events(answer.content)
    texts = [c["choices"][0]["delta"].get("content") for c in got if c["choices"]]
    assert "".join(t or "" for t in texts) == "".join(generate_tokens(PROMPT, TOKENS))
    assert 1 < len([t for t in texts if t]) < TOKENS / 3  # joined: fewer events than tokens
    assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] == TOKENS
    assert len({c["id"] for c in got}) == 1
    alias = h.sup.client.model_id
    assert alias.encode() not in answer.content  # the child's own name never leaks
    for c in got:
        assert set(c) <= CHUNK_KEYS
        for choice in c["choices"]:
            assert set(choice) == CHOICE_KEYS
            assert set(choice["delta"]) <= {"role", "content"}
    rendered = harness.metrics.render().decode()
    counted = [float(line.rsplit(" ", 1)[1]) for line in rendered.splitlines()
               if line.startswith("llamad_tokens_generated_total{")
               and 'role="generation"' in line]
    assert counted == [TOKENS]


async def test_a_client_gone_during_a_pause_stops_the_child_at_once(
        api: Callable[..., Any]) -> None:
    """A client that leaves while the relay holds the child's socket unread (an interval
    far longer than the test) closes the child's connection at once: the child stops."""
    harness, h = await api(FakeRuntime(token_delay=0.01), 60.0)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http, http.stream(
            "POST", f"{harness.url}/v1/chat/completions", json=chat(max_tokens=2000)
    ) as answer:
        async for line in answer.aiter_lines():
            if line.startswith("data: ") and '"content":"' in line:
                break  # the first token: the relay now pauses for 60 s
    await cancelled(h, 10)


async def test_a_child_that_dies_mid_stream_ends_it_with_the_error_event(
        api: Callable[..., Any]) -> None:
    """A child that dies while the relay is pacing: the tokens it sent come first, then
    the API's error event, and no [DONE]."""
    harness, _ = await api(FakeRuntime(token_delay=DELAY, faults_per_launch=(
        "crash-mid-stream",), fault_after=12), 0.2)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        answer = await http.post(f"{harness.url}/v1/chat/completions", json=chat())
    assert answer.status_code == 200
    parts = answer.content.split(b"\n\n")
    assert parts[-1] == b"" and b"[DONE]" not in answer.content
    got = [orjson.loads(p.removeprefix(b"data: ")) for p in parts[:-1]]
    texts = "".join(c["choices"][0]["delta"].get("content") or "" for c in got[:-1])
    assert texts == "".join(generate_tokens(PROMPT, TOKENS)[:12])
    error = got[-1]["error"]
    assert error["message"] and error["type"]
