"""Tool calling through both APIs in-process, over the real router and admission with a
scripted backend that streams tool-call pieces: the HTTP API's whole
``message.tool_calls`` and streamed ``delta.tool_calls`` in OpenAI's shapes, its
refusals naming the parameter, and gRPC Chat's GenerateResponse.tool_calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
import pytest

from daemon.config import Limits
from daemon.grpcapi.inference import InferenceServicer
from daemon.models.router import InferenceRouter
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import inference_pb2_grpc
from supervisor import Tool, ToolCallDelta, ToolUse, Turn
from tests.support.backend import FakeBackend, FakeRole
from tests.support.httpapi import Harness, client, events, serving
from tests.support.inprocess import serving as grpc_serving

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALLS = [(ToolCallDelta(0, "call_a", "get_weather", '{"ci'),),
         (ToolCallDelta(0, arguments='ty": "Paris"}'),
          ToolCallDelta(1, "call_b", "get_weather", '{"city": "Rome"}'))]


def script(h: Harness) -> None:
    """The generation backend answers with two tool calls and no text."""
    h.gen.pieces = ["", ""]
    h.gen.tool_calls = CALLS
    h.gen.finish = "tool_calls"


async def post(h: Harness, **body: Any) -> Any:
    async with client() as http:
        return await http.post(h.url + "/v1/chat/completions", json={
            "model": "gen", "messages": [{"role": "user", "content": "Weather in Paris?"}],
            **body})


async def test_a_whole_answer_carries_the_joined_tool_calls() -> None:
    """message.tool_calls joins each call's pieces in index order, content is null, the
    finish reason is tool_calls; the backend got the tools and the named choice."""
    async with serving() as h:
        script(h)
        resp = await post(h, tools=[WEATHER], parallel_tool_calls=True, tool_choice={
            "type": "function", "function": {"name": "get_weather"}})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]
    (use,) = h.gen.tool_uses
    assert use == ToolUse((Tool("get_weather", "Weather of a city", orjson.dumps(
        WEATHER["function"]["parameters"]).decode()),),  # type: ignore[index]
        "function", "get_weather", True)


async def test_a_stream_carries_tool_call_pieces_as_openai_does() -> None:
    """The first chunk has the role and null content; each piece is a delta.tool_calls
    entry (the first of a call with id, type and name); the last has the finish reason."""
    async with serving() as h:
        script(h)
        resp = await post(h, tools=[WEATHER], stream=True)
    chunks: list[Any] = events(resp.content)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"ci'}}]}
    assert deltas[1] == {"tool_calls": [
        {"index": 0, "function": {"arguments": 'ty": "Paris"}'}},
        {"index": 1, "id": "call_b", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert h.gen.tool_uses[0] is not None and h.gen.tool_uses[0].choice == "auto"


async def test_a_follow_up_with_the_calls_and_their_results_is_passed_on() -> None:
    """An assistant message with tool_calls (arguments as text or as an object) and tool
    messages reach the backend as Turns; a plain text answer follows."""
    async with serving() as h:
        resp = await post(h, tools=[WEATHER], messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "18 C"}])
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "Hello, world"
    assert "tool_calls" not in resp.json()["choices"][0]["message"]
    history = h.gen.chats[0]
    assert isinstance(history[1], Turn) and history[1].tool_calls[0].arguments == \
        '{"city":"Paris"}'
    assert history[2] == Turn("tool", "18 C", tool_call_id="call_a")


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                          "function": {"name": "get_time"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [WEATHER["function"]]}, "functions"),
    ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{x"}}]},
        {"role": "user", "content": "y"}]},
     "messages[1].tool_calls[0].function.arguments"),
])
async def test_bad_tool_parameters_are_400_naming_them(body: dict[str, Any],
                                                       param: str) -> None:
    """Each malformed tool parameter is a 400 naming it; nothing reaches the backend."""
    async with serving() as h:
        resp = await post(h, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()
    assert h.gen.chats == []


async def test_tools_on_a_model_that_cannot_take_them_are_400_naming_it() -> None:
    """The backend's refusal (a template without tools) is a 400 on param tools that
    names the model; the same request without tools is served."""
    async with serving() as h:
        h.gen.tools_refusal = "its chat template does not render tools"
        refused = await post(h, tools=[WEATHER])
        plain = await post(h)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "tools" and "gen.gguf" in error["message"]
    assert "does not render tools" in error["message"]
    assert plain.status_code == 200


# --- gRPC -------------------------------------------------------------------------------

@pytest.fixture
async def stub() -> AsyncIterator[tuple[inference_pb2_grpc.InferenceServiceStub,
                                        FakeBackend]]:
    backend = FakeBackend(pieces=["", ""], tool_calls=CALLS, finish="tool_calls")
    router = InferenceRouter({"generation": FakeRole(backend)})
    servicer = InferenceServicer(router, Limits())
    async with grpc_serving(lambda s: inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            servicer, s)) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel), backend


async def test_grpc_chat_streams_tool_call_deltas(
        stub: tuple[inference_pb2_grpc.InferenceServiceStub, FakeBackend]) -> None:
    """Chat with tools relays each piece as GenerateResponse.tool_calls and ends with
    FINISH_REASON_TOOL_CALLS; the backend got the tools."""
    inference, backend = stub
    request = ipb.ChatRequest(
        messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content="Weather in Paris?")],
        tools=[ipb.Tool(name="get_weather", parameters='{"type": "object"}')],
        tool_choice=ipb.ToolChoice(mode=ipb.TOOL_CHOICE_MODE_REQUIRED))
    replies = [m async for m in inference.Chat(request)]
    pieces = [(d.index, d.id, d.name, d.arguments) for m in replies for d in m.tool_calls]
    assert pieces == [(0, "call_a", "get_weather", '{"ci'), (0, "", "", 'ty": "Paris"}'),
                      (1, "call_b", "get_weather", '{"city": "Rome"}')]
    assert replies[-1].finish_reason == ipb.FINISH_REASON_TOOL_CALLS
    assert backend.tool_uses[0] is not None and backend.tool_uses[0].choice == "required"


async def test_grpc_chat_refuses_an_unknown_named_tool(
        stub: tuple[inference_pb2_grpc.InferenceServiceStub, FakeBackend]) -> None:
    """tool_choice naming a function not among the tools is INVALID_ARGUMENT."""
    inference, backend = stub
    request = ipb.ChatRequest(
        messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content="hi")],
        tools=[ipb.Tool(name="get_weather")], tool_choice=ipb.ToolChoice(function="nope"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        _ = [m async for m in inference.Chat(request)]
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "tool_choice" in (info.value.details() or "")
    assert backend.chats == []
