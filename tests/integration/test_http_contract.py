"""What every HTTP caller relies on, against a real daemon (real llama-server children):
``model`` in each response is the id ``/v1/models`` lists, token-id input is refused
unless declared the model's own, and ``GET /health`` follows the daemon's serving state
(issue 31)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import openai
import pytest
import pytest_asyncio

from daemon import Daemon
from llamad_protocol.v1 import control_pb2, control_pb2_grpc
from tests.conftest import EMBED_MODEL, SMALL_MODEL
from tests.support.http_daemon import ADMIN, EMB_ID, GEN_ID, READ, auth, http_daemon

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]



@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Daemon]:
    """One daemon with the HTTP API on a free loopback port, tokens required."""
    async with http_daemon(tmp_path_factory.mktemp("state")) as daemon:
        yield daemon


def _url(daemon: Daemon, path: str) -> str:
    return f"http://127.0.0.1:{daemon.http_port}{path}"


def _sdk(daemon: Daemon) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=_url(daemon, "/v1"), api_key=READ, max_retries=0,
                              http_client=openai.DefaultAsyncHttpxClient(trust_env=False))


async def test_model_is_the_listed_id_whatever_name_was_asked(running: Daemon) -> None:
    """Asked by its GGUF file name, each route answers with the id /v1/models lists:
    chat (whole and every streamed chunk), completions, embeddings, responses, messages."""
    async with _sdk(running) as client:
        ids = {m.id for m in (await client.models.list()).data}
        assert {GEN_ID, EMB_ID} <= ids and SMALL_MODEL not in ids
        chat = await client.chat.completions.create(
            model=SMALL_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        stream = await client.chat.completions.create(
            model=SMALL_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
            stream=True, stream_options={"include_usage": True})
        chunks = [c.model async for c in stream]
        completion = await client.completions.create(model=SMALL_MODEL, prompt="One,",
                                                     max_tokens=3)
        embedding = await client.embeddings.create(model=EMBED_MODEL, input="disk full")
        response = await client.responses.create(model=SMALL_MODEL, input="Hi",
                                                 max_output_tokens=16)
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        message = (await http.post(_url(running, "/v1/messages"), headers=auth(), json={
            "model": SMALL_MODEL, "max_tokens": 3,
            "messages": [{"role": "user", "content": "Hi"}]})).json()
    assert chat.model == GEN_ID
    assert len(chunks) > 2 and set(chunks) == {GEN_ID}
    assert completion.model == GEN_ID
    assert embedding.model == EMB_ID
    assert response.model == GEN_ID
    assert message["model"] == GEN_ID


async def test_token_ids_are_refused_unless_declared_the_models_own(running: Daemon) -> None:
    """cl100k ids (what LangChain's OpenAIEmbeddings sends) are not embedded as MiniLM's:
    400 naming input, why, and what to set; "llamad_token_ids": "model" passes them."""
    cl100k = [[13044, 279, 13282, 389, 3566, 1721]]  # some text's ids in OpenAI's tokenizer
    async with _sdk(running) as client:
        with pytest.raises(openai.BadRequestError) as nested:
            await client.embeddings.create(model=EMBED_MODEL, input=cl100k)
        with pytest.raises(openai.BadRequestError) as flat:
            await client.embeddings.create(model=EMBED_MODEL, input=cl100k[0])
        with pytest.raises(openai.BadRequestError) as prompt:
            await client.completions.create(model=SMALL_MODEL, prompt=cl100k[0],
                                            max_tokens=3)
        own = await client.embeddings.create(model=EMBED_MODEL, input=[[2054, 2440]],
                                             extra_body={"llamad_token_ids": "model"})
        with pytest.raises(openai.BadRequestError) as wrong:
            await client.embeddings.create(model=EMBED_MODEL, input=cl100k,
                                           extra_body={"llamad_token_ids": "cl100k"})
    for refused in (nested.value, flat.value):
        error = refused.body
        assert isinstance(error, dict) and error["param"] == "input", error
        assert "another tokenizer" in error["message"]
        assert "check_embedding_ctx_length=False" in error["message"]
        assert '"llamad_token_ids": "model"' in error["message"]
    assert isinstance(prompt.value.body, dict) and prompt.value.body["param"] == "prompt"
    assert "token ids" in prompt.value.body["message"]
    assert len(own.data) == 1 and len(own.data[0].embedding) == 384
    assert isinstance(wrong.value.body, dict)
    assert wrong.value.body["param"] == "llamad_token_ids"


async def test_health_is_200_when_serving_and_503_when_drained(running: Daemon) -> None:
    """GET /health takes no token: 200 while serving; 503 once an admin drains the node
    (ControlService/SetDraining, as `llamad drain`), 200 again after undrain."""
    control = None

    async def drain(draining: bool) -> None:
        assert control is not None
        await control.SetDraining(control_pb2.SetDrainingRequest(draining=draining),
                                  metadata=(("authorization", f"Bearer {ADMIN}"),))

    async with httpx.AsyncClient(trust_env=False) as http, \
            grpc.aio.insecure_channel(running.address) as channel:
        control = control_pb2_grpc.ControlServiceStub(channel)
        up = await http.get(_url(running, "/health"))
        head = await http.head(_url(running, "/health"))
        await drain(True)
        try:
            down = await http.get(_url(running, "/health"))
        finally:
            await drain(False)
        again = await http.get(_url(running, "/health"))
    assert up.status_code == 200 and json.loads(up.content) == {"status": "serving"}
    assert up.headers["Content-Type"].startswith("application/json")
    assert head.status_code == 200
    assert down.status_code == 503 and down.json() == {"status": "not_serving"}
    assert again.status_code == 200


_USER = {"role": "user", "content": "hi"}
_CHAT = "/v1/chat/completions"
# (route, body beside model, param): each refusal names the field its check named,
# spelt as the HTTP body spells it (the gRPC validation says sampling.max_tokens,
# tools[0].name, texts[1]).
_REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    (_CHAT, {"messages": [_USER], "max_tokens": 100_000}, "max_tokens"),
    (_CHAT, {"messages": [_USER], "temperature": 9}, "temperature"),
    (_CHAT, {"messages": [_USER], "top_p": 0}, "top_p"),
    (_CHAT, {"messages": [_USER], "min_p": 2}, "min_p"),
    (_CHAT, {"messages": [_USER], "seed": 2**33}, "seed"),
    (_CHAT, {"messages": [_USER], "stop": [""]}, "stop"),
    (_CHAT, {"messages": [_USER], "logit_bias": {"5": 500}}, "logit_bias"),
    (_CHAT, {"messages": [_USER], "top_logprobs": 3}, "top_logprobs"),
    (_CHAT, {"messages": [_USER], "grammar": "x"}, "grammar"),
    (_CHAT, {"messages": [_USER], "response_format": {"type": "json_schema", "json_schema": {
        "name": "bad name!", "schema": {"type": "object"}}}},
     "response_format.json_schema.name"),
    (_CHAT, {"messages": []}, "messages"),
    (_CHAT, {"messages": [_USER, {"role": "user", "content": ""}]}, "messages[1].content"),
    (_CHAT, {"messages": [_USER, {"role": "assistant", "content": "ok"}]},
     "messages[1].role"),  # "the last message must not be from the assistant"
    (_CHAT, {"messages": [_USER], "tools": [{"type": "function", "function": {
        "name": "a b"}}]}, "tools[0].function.name"),
    (_CHAT, {"messages": [_USER], "tool_choice": "required"}, "tool_choice"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/embeddings", {"input": ["ok", " "]}, "input[1]"),
    ("/v1/responses", {"input": "hi", "temperature": 9}, "temperature"),
    ("/v1/llamad/ask", {"question": ""}, "question"),
    ("/v1/llamad/ask", {"question": "why?", "history": [
        {"role": "CHAT_ROLE_USER", "content": "a"}] * 11}, "history"),  # "11 history turns"
    ("/v1/llamad/ask", {"question": "why?", "task": "TASK_TYPE_DIAGNOSE",
                        "attachment": "a\x00b"}, "attachment"),  # "question or attachment ..."
    ("/v1/llamad/ask", {"question": "why?", "history": [
        {"role": "CHAT_ROLE_SYSTEM", "content": "a"}]}, "history[0].role"),
    ("/v1/llamad/ask", {"question": "why?", "sampling": {"logprobs": True}}, "logprobs"),
]


async def test_each_refusal_names_the_field_its_check_named(running: Daemon) -> None:
    """param is the checked field in the HTTP body's naming, never a word of the message
    (a message beginning "the last message ..." once gave param "the")."""
    got: dict[str, tuple[int, object, str]] = {}
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        for route, body, _ in _REFUSALS:
            model = {"/v1/embeddings": EMB_ID, "/v1/llamad/ask": None}.get(route, GEN_ID)
            sent = {**body, "model": model} if model else body
            resp = await http.post(_url(running, route), headers=auth(), json=sent)
            error = resp.json()["error"]
            got[f"{route} {json.dumps(body)[:60]}"] = (resp.status_code, error["param"],
                                                      error["message"])
    expected = {f"{route} {json.dumps(body)[:60]}": param for route, body, param in _REFUSALS}
    assert {k: v[1] for k, v in got.items()} == expected, got
    assert all(status == 400 for status, _, _ in got.values()), got
    last = got[f"{_CHAT} {json.dumps(_REFUSALS[12][1])[:60]}"]
    assert str(last[2]).startswith("the last message")
    assert not any("sampling." in message for _, _, message in got.values())
