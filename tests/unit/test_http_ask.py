"""POST /v1/llamad/ask: Ask's grounded answer over HTTP, answered by the Ask service gRPC
adapts too (a real retriever over a small index, a scripted generation backend); and
random bodies on every POST route."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from daemon.config import Limits
from daemon.models.router import InferenceRouter
from daemon.services.ask import AnswerSettings, AskService, ResponseCache
from daemon.telemetry.audit import AuditLog
from retrieval import Retriever
from tests.support.embedder import HashEmbedder, filled
from tests.support.httpapi import client, events, serving

Make = Callable[[InferenceRouter], AskService]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    retriever: Retriever = await filled(tmp_path / "index", HashEmbedder("hash"))

    def build(router: InferenceRouter) -> AskService:
        return AskService(
            router, retriever, Limits(), settings=AnswerSettings(),
            cache=ResponseCache(ttl=60, max_entries=8),
            audit=AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1))

    try:
        yield build
    finally:
        await retriever.close()


async def test_ask_streams_the_answer_then_citations_then_done(make: Make) -> None:
    """Streamed: text events, then the sources (S1 the runbook), then done, then [DONE];
    whole: the same in one object."""
    pieces = ["Rotate", " the logs", " [S1]."]
    async with serving(answer=make, pieces=pieces) as h, client() as http:
        streamed = await http.post(h.url + "/v1/llamad/ask", json={
            "question": "web01 disk full: what do I do?", "stream": True, "no_cache": True})
        whole = await http.post(h.url + "/v1/llamad/ask", json={
            "question": "web01 disk full: what do I do?", "top_k": 3})
    assert streamed.headers["content-type"] == "text/event-stream"
    got: list[Any] = events(streamed.content)
    assert "".join(e.get("text", "") for e in got) == "Rotate the logs [S1]."
    assert list(got[-2]) == ["sources"] and list(got[-1]) == ["done"]
    citation = got[-2]["sources"]["citations"][0]
    assert (citation["label"], citation["document_id"]) == ("S1", "docs/disk")
    assert got[-1]["done"]["finish_reason"] == "FINISH_REASON_LENGTH"  # as scripted
    body = whole.json()
    assert body["text"] == "Rotate the logs [S1]."
    assert body["sources"]["citations"][0]["label"] == "S1"
    assert body["done"]["usage"]["completion_tokens"] == 3


async def test_ask_refusals_are_openai_error_objects(make: Make) -> None:
    """An empty question is 400; an unknown field 400 naming it; no Ask servicer 404."""
    async with serving(answer=make) as h, client() as http:
        empty = await http.post(h.url + "/v1/llamad/ask", json={"question": " "})
        unknown = await http.post(h.url + "/v1/llamad/ask", json={"question": "x", "k": 3})
    async with serving() as h, client() as http:
        absent = await http.post(h.url + "/v1/llamad/ask", json={"question": "x"})
    assert empty.status_code == 400 and "question is empty" in empty.json()["error"]["message"]
    assert unknown.status_code == 400 and '"k"' in unknown.json()["error"]["message"]
    assert absent.status_code == 404


async def test_random_bodies_never_cause_a_5xx() -> None:
    """Bodies with every parameter of every route set to values of random types and
    shapes are answered 2xx or 4xx, each refusal in OpenAI's error object."""
    rng = random.Random(15)
    values: list[Any] = [None, True, -1, 0, 3, 2**70, 1e308, float("-inf"), "", "x" * 300,
                         "\x00", [], [1, "a"], [[1, 2]], {}, {"type": "json_schema"},
                         {"a": {"b": [None]}}, [{"role": "user", "content": "hi"}],
                         [{"role": "tool", "content": 1}], "gen", "emb.gguf"]
    keys = ["model", "messages", "prompt", "input", "max_tokens", "temperature", "top_p",
            "stop", "logit_bias", "logprobs", "top_logprobs", "response_format", "grammar",
            "stream", "stream_options", "n", "seed", "encoding_format", "dimensions", "tools",
            "question", "top_k", "sampling", "min_p", "dry_base"]
    routes = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/llamad/ask"]
    async with serving() as h, client() as http:
        for _ in range(150):
            body = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 8))}
            data = json.dumps(body, allow_nan=True).encode()
            resp = await http.post(h.url + rng.choice(routes), content=data)
            assert resp.status_code < 500, (body, resp.text)
            if resp.status_code >= 400:
                assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


async def test_a_parameter_of_the_wrong_type_is_named_with_its_json_kind(make: Make) -> None:
    """A string where true/false or a string is expected is refused naming the parameter
    and the kind of value given (not the value converted to the expected type)."""
    async with serving(answer=make) as h, client() as http:
        stream = await http.post(h.url + "/v1/llamad/ask", json={"question": "x",
                                                                 "stream": "yes"})
        model = await http.post(h.url + "/v1/chat/completions", json={
            "model": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert stream.status_code == 400 and stream.json()["error"]["param"] == "stream"
    assert stream.json()["error"]["message"] == "stream must be true or false, not a string"
    assert model.status_code == 400 and model.json()["error"]["param"] == "model"
    assert model.json()["error"]["message"] == "model must be a string, not a number"
