"""The OpenAI-compatible HTTP API in-process on port 0, over the real router and admission
with a scripted backend: OpenAI's shapes, raw SSE framing, errors in OpenAI's
object, auth, 429 with Retry-After, and hostile requests answered with a clear 4xx."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from daemon.checks import validation
from daemon.config import ConfigError, HttpSettings, Limits
from daemon.config.access import load_tokens
from llamad_protocol.v1 import inference_pb2 as ipb
from supervisor import ChildNotReadyError
from tests.support import config_load
from tests.support.httpapi import client, events, serving
from tests.support.load import patience


async def test_models_list_names_each_role_and_whether_it_is_loaded() -> None:
    """GET /v1/models lists the generation and embedding models with role and loaded."""
    async with serving() as h, client() as http:
        page = (await http.get(h.url + "/v1/models")).json()
        one = (await http.get(h.url + "/v1/models/gen.gguf")).json()
    rows = {m["id"]: m for m in page["data"]}
    assert page["object"] == "list"
    assert set(rows) == {"gen.gguf", "emb.gguf"}
    assert rows["gen.gguf"]["role"] == "generation"
    assert rows["emb.gguf"]["loaded"] is True
    assert one == rows["gen.gguf"]


async def test_chat_whole_and_streamed() -> None:
    """A chat answers whole with usage, and streamed with the role first and the finish
    reason last; include_usage adds a usage chunk without choices."""
    chat = {"model": "gen.gguf", "messages": [{"role": "user", "content": "hi"}]}
    async with serving() as h, client() as http:
        whole = (await http.post(h.url + "/v1/chat/completions", json=chat)).json()
        streamed = await http.post(h.url + "/v1/chat/completions", json={
            **chat, "model": "generation", "stream": True,
            "stream_options": {"include_usage": True}})
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world",
                                              "refusal": None}
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    chunks: list[Any] = events(streamed.content)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hello"}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == \
        "Hello, world"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == \
        [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])
    assert h.gen.chats[0] == [("user", "hi")]
    # Unset controls take gRPC Chat's defaults (limits.chat_*), completions Generate's.
    chat_default = validation.sampling(ipb.SamplingParams(), Limits(),
                                       defaults=validation.chat_defaults(Limits()))
    assert h.gen.samplings[0] == chat_default


async def test_sse_framing_byte_for_byte() -> None:
    """Each event is 'data: {json}' and a blank line; the stream ends with [DONE]."""
    async with serving() as h, client() as http:
        resp = await http.post(h.url + "/v1/completions", json={
            "model": "gen", "prompt": "x", "stream": True}, headers={"x-request-id": "r-1"})
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["x-request-id"] == "r-1"
    raw = resp.content.split(b"\n\n")
    assert all(e.startswith(b"data: {") for e in raw[:-2])
    bodies: list[Any] = events(resp.content)
    assert [b["choices"][0]["text"] for b in bodies] == ["Hello", ",", " world", ""]
    assert bodies[-1]["choices"][0]["finish_reason"] == "length"
    assert {b["object"] for b in bodies} == {"text_completion"}
    assert h.gen.samplings[0].temperature == 0.0  # Generate's default: greedy


async def test_embeddings_float_and_base64_are_the_same_unit_vectors() -> None:
    """float and base64 carry the same L2-normalised float32 values; token arrays pass
    through when declared the model's own (llamad_token_ids); dimensions other than the
    model's is refused naming it."""
    url = "/v1/embeddings"
    async with serving() as h, client() as http:
        floats = (await http.post(h.url + url, json={
            "model": "emb.gguf", "input": ["ab", "abcd"], "encoding_format": "float"})).json()
        raw = (await http.post(h.url + url, json={
            "model": "emb.gguf", "input": "ab", "encoding_format": "base64"})).json()
        tokens = (await http.post(h.url + url, json={
            "model": "emb.gguf", "input": [[5, 6, 7]], "llamad_token_ids": "model"})).json()
        refused = await http.post(h.url + url, json={
            "model": "emb.gguf", "input": "a", "dimensions": 2})
    first = np.array(floats["data"][0]["embedding"], dtype=np.float32)
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(first, decoded)
    assert float(np.linalg.norm(first)) == pytest.approx(1.0, abs=1e-6)
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert h.emb.embedded[2] == [(5, 6, 7)]
    assert len(tokens["data"][0]["embedding"]) == 4
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "dimensions"


async def test_unknown_model_is_404_in_openais_error_object() -> None:
    """An unknown model is a 404 model_not_found naming the param; so is a missing one."""
    async with serving() as h, client() as http:
        resp = await http.post(h.url + "/v1/chat/completions", json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        missing = await http.post(h.url + "/v1/embeddings", json={"input": "x"})
        rerank = await http.post(h.url + "/v1/rerank", json={"model": "x"})
        wrong_role = await http.post(h.url + "/v1/embeddings", json={
            "model": "gen.gguf", "input": "x"})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    assert resp.json()["error"]["param"] == "model"
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert missing.status_code == 404
    assert rerank.status_code == 404 and "rerank" in rerank.json()["error"]["message"]
    assert wrong_role.status_code == 400 and "embedding" in wrong_role.json()["error"][
        "message"]


async def test_invalid_parameters_are_400_naming_them() -> None:
    """Wrong types, out-of-range values and unsupported parameters name the parameter."""
    cases = {"temperature": "hot", "max_tokens": -1, "top_p": 3.0, "n": 2,
             "tools": "get_weather", "tool_choice": 3, "stop": 5, "top_logprobs": 3}
    async with serving() as h, client() as http:
        for name, value in cases.items():
            resp = await http.post(h.url + "/v1/chat/completions", json={
                "model": "gen", "messages": [{"role": "user", "content": "hi"}], name: value})
            assert resp.status_code == 400, name
            assert resp.json()["error"]["param"] == name, resp.json()
            assert "sampling." not in resp.json()["error"]["message"]
        empty = await http.post(h.url + "/v1/chat/completions", json={
            "model": "gen", "messages": [{"role": "user", "content": ""}]})
    assert empty.json()["error"]["param"] == "messages[0].content"
    assert h.gen.chats == []


async def test_tokens_and_roles_as_for_grpc(tmp_path: Path) -> None:
    """Without a token: 401 with WWW-Authenticate; a wrong one 401; a read token passes."""
    path = tmp_path / "tokens"
    path.write_text("read rrrrrrrrrrrrrrrrrrrr\nadmin aaaaaaaaaaaaaaaaaaaa\n")
    path.chmod(0o600)
    async with serving(tokens=load_tokens(path)) as h, client() as http:
        none = await http.get(h.url + "/v1/models")
        wrong = await http.get(h.url + "/v1/models",
                               headers={"Authorization": "Bearer wrongwrongwrongwrong"})
        read = await http.get(h.url + "/v1/models",
                              headers={"Authorization": "Bearer rrrrrrrrrrrrrrrrrrrr"})
    assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in none.json()["error"]["message"]
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert read.status_code == 200 and len(read.json()["data"]) == 2


async def test_a_full_queue_is_429_with_retry_after() -> None:
    """With the slot busy and no queue, the next call is 429 with Retry-After."""
    async with serving(queue=0) as h:
        h.gen.gate = asyncio.Event()
        busy = asyncio.Event()
        h.gen_admission.set_hooks(lambda a: busy.set() if a.in_flight else None, None)
        async with client() as http:
            body = {"model": "gen", "prompt": "x"}
            first = asyncio.create_task(http.post(h.url + "/v1/completions", json=body))
            await busy.wait()
            second = await http.post(h.url + "/v1/completions", json=body)
            h.gen.gate.set()
            assert (await first).status_code == 200
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) >= 1
    assert second.json()["error"]["type"] == "rate_limit_error"


async def test_draining_is_503_with_retry_after() -> None:
    """While the daemon drains, calls are 503 with Retry-After."""
    async with serving() as h, client() as http:
        h.router.draining = True
        resp = await http.post(h.url + "/v1/completions", json={"model": "gen", "prompt": "x"})
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"


async def test_a_starting_model_is_503_with_its_retry_hint_and_listed_unloaded() -> None:
    """While the model starts, calls are 503 with the supervisor's retry hint (rounded up
    to whole seconds) and /v1/models says it is not loaded."""
    async with serving() as h, client() as http:
        h.gen_role.unready = ChildNotReadyError("generation", "starting", 2.5)
        resp = await http.post(h.url + "/v1/chat/completions", json={
            "model": "gen.gguf", "messages": [{"role": "user", "content": "hi"}]})
        models = (await http.get(h.url + "/v1/models")).json()["data"]
    assert resp.status_code == 503 and resp.headers["retry-after"] == "3"
    assert resp.json()["error"]["type"] == "server_error"
    assert {m["id"]: m["loaded"] for m in models} == {"gen.gguf": False, "emb.gguf": True}


async def test_a_request_past_its_timeout_is_504_and_frees_its_slot() -> None:
    """x-request-timeout is the call's deadline: a call still waiting for its first token
    when it passes is 504, and its slot is freed; a malformed value is 400."""
    async with serving() as h, client() as http:
        h.gen.gate = asyncio.Event()  # never set: the child never answers
        late = await http.post(h.url + "/v1/completions", json={"model": "gen", "prompt": "x"},
                               headers={"x-request-timeout": "0.3"})
        bad = await http.post(h.url + "/v1/completions", json={"model": "gen", "prompt": "x"},
                              headers={"x-request-timeout": "soon"})
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    assert h.gen_admission.in_flight == 0
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-request-timeout"


async def test_requests_are_counted_with_the_http_protocol_label() -> None:
    """A chat is counted in llamad_requests_total as Chat, protocol http."""
    async with serving() as h, client() as http:
        await http.post(h.url + "/v1/chat/completions", json={
            "model": "gen", "messages": [{"role": "user", "content": "hi"}]})
        await asyncio.sleep(0.05)
    text = h.metrics.render().decode()
    assert 'llamad_requests_total{code="OK",method="Chat",protocol="http"} 1.0' in text


# -- hostile requests ------------------------------------------------------------------


async def _raw(url: str, data: bytes, *, pause: float = 0.0, tail: bytes = b"") -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)
            writer.write(tail)
        return await asyncio.wait_for(reader.read(65536), patience(5))
    finally:
        writer.close()


@pytest.mark.parametrize(("body", "expected"), [
    (b"{not json", b"not valid JSON"),
    (b'{"model": "gen", "prompt": "\xff\xfe"}', b"not valid JSON"),
    (b"[1, 2]", b"must be a JSON object"),
    (b"", b"empty"),
])
async def test_malformed_bodies_are_clear_400s(body: bytes, expected: bytes) -> None:
    """Malformed JSON, invalid UTF-8, a non-object and an empty body are 400 in JSON."""
    async with serving() as h, client() as http:
        resp = await http.post(h.url + "/v1/completions", content=body,
                               headers={"content-type": "application/json"})
        assert resp.status_code == 400
        assert expected in resp.content
        assert (await http.get(h.url + "/v1/models")).status_code == 200


async def test_a_huge_body_is_413_and_a_slow_body_408() -> None:
    """A body past http.max_body_bytes is 413; one that stalls past http.body_timeout
    is 408; the server still serves."""
    settings = HttpSettings(max_body_bytes=2048, body_timeout=0.5, idle_timeout=5.0)
    async with serving(settings=settings) as h, client() as http:
        big = await http.post(h.url + "/v1/completions", content=b"x" * 10_000)
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 100\r\n\r\n{\"model\"")
        slow = await _raw(h.url, head, pause=1.0, tail=b": 1}")
        assert slow.startswith(b"HTTP/1.1 408")
        assert (await http.get(h.url + "/v1/models")).status_code == 200


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    """A client that sends 'Expect: 100-continue' (curl, for bodies over 1 KiB) gets
    '100 Continue' before it sends the body, then the answer."""
    async with serving() as h:
        host, port = h.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = orjson.dumps({"model": "gen", "prompt": "x" * 2000})
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), patience(5))
        writer.write(body)
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), patience(5))
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.1 200")


async def test_header_flood_and_unparseable_requests_get_json_errors() -> None:
    """Too many headers, a huge header and garbage are answered 4xx in OpenAI's error
    object (never aiohttp's text or HTML page)."""
    async with serving() as h:
        flood = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n"
        long = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 20000 + b"\r\n\r\n"
        garbage = b"\x16\x03\x01\x00\xa5 not http\r\n\r\n"
        for data in (flood, long, garbage):
            answer = await _raw(h.url, data)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1].startswith(b"4"), head
            assert b"application/json" in head
            assert orjson.loads(body)["error"]["message"].startswith("malformed HTTP request")
        async with client() as http:
            assert (await http.get(h.url + "/v1/models")).status_code == 200


async def test_unknown_route_and_wrong_method_are_json() -> None:
    """An unknown route is 404 and a wrong method 405, both in OpenAI's error object."""
    async with serving() as h, client() as http:
        missing = await http.get(h.url + "/v2/nothing")
        wrong = await http.get(h.url + "/v1/chat/completions")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405


def test_settings_are_named_options() -> None:
    """The HTTP limits are options of [http] with sane defaults."""
    names = {f.name for f in dataclasses.fields(HttpSettings)}
    assert {"max_body_bytes", "max_header_bytes", "max_headers", "idle_timeout",
            "body_timeout"} <= names


@pytest.mark.parametrize(("listen", "match"), [
    ("0.0.0.0:8080", r"^http_listen: .*requires TLS"),
    ("unix:/run/llamad/http.sock", r"^http_listen: must be a host:port"),
    ("nonsense", r"^http_listen: "),
])
def test_http_listen_follows_the_grpc_listen_rule(listen: str, match: str) -> None:
    """http_listen is loopback-only unless TLS and client authentication are configured,
    as listen is; off by default."""
    assert config_load.load().settings.http_listen == ""
    assert config_load.load("--http-listen", "127.0.0.1:8080").settings.http_listen == \
        "127.0.0.1:8080"
    with pytest.raises(ConfigError, match=match):
        config_load.load("--http-listen", listen)
