"""Tool calling end to end: a real daemon, a real llama-server child on the real
SmolLM2-135M file given llamad's chatml-tools template, llama.cpp's own tool-call parser,
relayed by llamad to the official ``openai`` SDK (and to gRPC Chat).

SmolLM2-135M never calls a tool by itself; at temperature 0 with a logit bias on the
tokens of ``<tool_call>`` ("<", "tool", "_", "call", ">" in its vocabulary) it calls
get_weather with {"city": "Paris"} every time, which is all these tests need: a real call
written by the model and parsed by llama.cpp. The repetition penalties of llamad's chat
defaults are turned off (the city is a word of the prompt). A model whose template
renders no tools (gemma-3-270m with llamad's gemma template) is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import openai
import pytest
import pytest_asyncio

from daemon import Daemon
from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc
from tests.conftest import DEFAULT_MODEL
from tests.support.daemon import serving
from tests.support.tools_daemon import GEMMA, OPEN_A_CALL, SMOL, tools_env

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: Any = {"temperature": 0, "max_tokens": 60, "frequency_penalty": 0,
               "extra_body": {"repeat_penalty": 1.0, "dry_multiplier": 0}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Daemon]:
    """A daemon whose generation model, smol (SmolLM2), runs with the chatml-tools
    template its [models.smol] table names; gemma (gemma-3-270m) loads on demand with its
    usual template."""
    env = tools_env(tmp_path_factory.mktemp("tools"))
    async with serving(env, "generation") as (daemon, _):
        yield daemon


def _sdk(daemon: Daemon) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{daemon.http_port}/v1",
                              api_key="unused", max_retries=0, timeout=120,
                              http_client=openai.DefaultAsyncHttpxClient(trust_env=False))


async def test_a_whole_answer_carries_the_models_tool_call(running: Daemon) -> None:
    """message.tool_calls holds the call llama.cpp parsed: get_weather, an id, and
    arguments that are the JSON {"city": "Paris"}."""
    async with _sdk(running) as sdk:
        answer = await sdk.chat.completions.create(
            model=SMOL, messages=QUESTION, tools=[WEATHER], tool_choice="required",
            logit_bias=OPEN_A_CALL, **GREEDY)
    choice = answer.choices[0]
    calls = choice.message.tool_calls
    assert calls, choice
    first = calls[0]
    assert first.type == "function" and first.id
    assert first.function.name == "get_weather"
    assert json.loads(first.function.arguments) == {"city": "Paris"}
    assert choice.finish_reason in ("tool_calls", "length")


async def test_a_streamed_answer_carries_the_call_in_pieces(running: Daemon) -> None:
    """delta.tool_calls pieces, joined by index, give the same call; the first piece of
    a call has its id and name; the last chunk has the finish reason."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async with _sdk(running) as sdk:
        stream = await sdk.chat.completions.create(
            model=SMOL, messages=QUESTION, tools=[WEATHER], tool_choice="required",
            logit_bias=OPEN_A_CALL, stream=True, **GREEDY)
        async for chunk in stream:
            choice = chunk.choices[0]
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = call["id"] or piece.id or ""
                if piece.function is not None:
                    call["name"] = call["name"] or piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
    assert calls[0]["id"] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert finish in ("tool_calls", "length")


async def test_a_follow_up_with_the_call_and_its_result_is_answered(running: Daemon) -> None:
    """The assistant's tool call and the tool's result go back to the model (rendered by
    the template), and it answers; the tools themselves are rendered too (the same
    history without them is a shorter prompt)."""
    history: Any = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    async with _sdk(running) as sdk:
        answer = await sdk.chat.completions.create(
            model=SMOL, tools=[WEATHER], temperature=0, max_tokens=24, messages=history)
        bare = await sdk.chat.completions.create(
            model=SMOL, temperature=0, max_tokens=1, messages=history)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    assert answer.usage is not None and bare.usage is not None
    # The tool listing (name, description, JSON Schema, instructions) is tens of tokens.
    assert answer.usage.prompt_tokens > bare.usage.prompt_tokens + 40


async def test_grpc_chat_relays_the_call(running: Daemon) -> None:
    """gRPC Chat with the same request streams ToolCallDelta pieces that join into the
    same call."""
    request = inference_pb2.ChatRequest(
        model=SMOL,
        messages=[inference_pb2.ChatMessage(role=inference_pb2.CHAT_ROLE_USER,
                                            content=QUESTION[0]["content"])],
        tools=[inference_pb2.Tool(name="get_weather",
                                  parameters=json.dumps(WEATHER["function"]["parameters"]))],
        tool_choice=inference_pb2.ToolChoice(mode=inference_pb2.TOOL_CHOICE_MODE_REQUIRED),
        sampling=inference_pb2.SamplingParams(
            temperature=0, max_tokens=60, repeat_penalty=1.0, dry_multiplier=0,
            frequency_penalty=0,
            logit_bias=[inference_pb2.LogitBias(token=int(t), bias=b)
                        for t, b in OPEN_A_CALL.items()]))
    async with grpc.aio.insecure_channel(running.address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        replies = [m async for m in stub.Chat(request)]
    first = [d for m in replies for d in m.tool_calls if d.index == 0]
    assert first[0].id and first[0].name == "get_weather"
    assert json.loads("".join(d.arguments for d in first)) == {"city": "Paris"}
    assert replies[-1].finish_reason in (inference_pb2.FINISH_REASON_TOOL_CALLS,
                                         inference_pb2.FINISH_REASON_LENGTH)


async def test_tools_on_a_model_without_a_tool_template_are_a_400_naming_it(
        running: Daemon) -> None:
    """gemma-3-270m's template (llamad's gemma) renders no tools: the call is refused
    with 400 on tools, naming the model and why, and nothing is generated."""
    async with _sdk(running) as sdk:
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.chat.completions.create(model=GEMMA, messages=QUESTION,
                                              tools=[WEATHER], max_tokens=8)
        plain = await sdk.chat.completions.create(model=GEMMA, messages=QUESTION,
                                                  max_tokens=4)
    error: Any = info.value.body
    assert info.value.status_code == 400
    assert error["param"] == "tools"
    assert DEFAULT_MODEL in error["message"] and "supports_tool_calls" in error["message"]
    assert plain.choices[0].message.content is not None
