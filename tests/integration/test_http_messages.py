"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` of a real daemon (real
llama-server children on real GGUF models), called by the official ``anthropic`` SDK
(its ``x-api-key`` header carrying llamad's bearer token): messages.create,
messages.stream, count_tokens, a tool_use round trip on SmolLM2 with llamad's
chatml-tools template (the call forced with a logit bias, as
tests/integration/test_http_tools.py does), and errors in Anthropic's shape.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from daemon import Daemon
from tests.conftest import SMALL_MODEL, models_dir
from tests.support import tools_daemon as td
from tests.support.endless import never_end_openai
from tests.support.tools_daemon import SMOL

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

WEATHER: Any = {"name": "get_weather", "description": "The current weather of a city.",
                "input_schema": {"type": "object",
                                 "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
HELLO: Any = [{"role": "user", "content": "Say hello."}]
# Greedy (this SDK version types no temperature), the call opened by a logit bias.
FORCED: Any = {"temperature": 0, "logit_bias": td.OPEN_A_CALL, **td.NO_REPEAT_GUARD}


def _sdk(daemon: Daemon, key: str = td.READ) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{daemon.http_port}", api_key=key, max_retries=0,
        timeout=120, http_client=anthropic.DefaultAsyncHttpxClient(trust_env=False))


async def test_create_answers_with_text_and_usage(tools_running: Daemon) -> None:
    """A message with a text block, the model as /v1/models lists it, a stop reason and
    real usage; the system prompt is rendered (more input tokens)."""
    async with _sdk(tools_running) as sdk:
        bare = await sdk.messages.create(model=SMOL, max_tokens=8, messages=HELLO)
        told = await sdk.messages.create(
            model=SMOL, max_tokens=8, messages=HELLO,
            system=[{"type": "text", "text": "You are a terse assistant who answers in "
                                             "French."}])
    assert bare.type == "message" and bare.role == "assistant" and bare.model == SMOL
    assert bare.content[0].type == "text" and bare.content[0].text
    assert bare.stop_reason in ("end_turn", "max_tokens")
    assert 0 < bare.usage.output_tokens <= 8 and bare.usage.input_tokens > 5
    assert told.usage.input_tokens > bare.usage.input_tokens + 8


async def test_stop_sequences_end_the_text(tools_running: Daemon) -> None:
    """stop_sequences reach the child: whatever the model writes, the text holds none
    of them (it stopped before the first, or never wrote one)."""
    async with _sdk(tools_running) as sdk:
        answer = await sdk.messages.create(
            model=SMOL, max_tokens=40, stop_sequences=["e", "E"],
            messages=[{"role": "user", "content": "Describe the sea."}])
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert "e" not in text.lower()
    assert answer.usage.output_tokens < 40 or answer.stop_reason == "max_tokens"


async def test_max_tokens_is_the_stop_reason_when_reached(tools_running: Daemon) -> None:
    """With the end of generation banned (llamad's logit_bias extension), the answer
    stops at max_tokens with exactly that many tokens."""
    async with _sdk(tools_running) as sdk:
        answer = await sdk.messages.create(
            model=SMOL, max_tokens=5, messages=[{"role": "user", "content": "Count."}],
            extra_body={"logit_bias": never_end_openai(models_dir() / SMALL_MODEL)})
    assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 5


async def test_stream_events_join_into_the_final_message(tools_running: Daemon) -> None:
    """messages.stream: message_start, a text block's start, deltas and stop, then
    message_delta (stop reason, usage) and message_stop; the text deltas are the final
    message's text."""
    names: list[str] = []
    async with _sdk(tools_running) as sdk, sdk.messages.stream(model=SMOL, max_tokens=8,
                                                         messages=HELLO) as stream:
        async for ev in stream:
            names.append(ev.type)
        text = await stream.get_final_text()
        final = await stream.get_final_message()
    raw = [n for n in names if n not in ("text",)]  # the SDK's own derived events
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "content_block_delta" in raw
    assert text and text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 5


async def test_count_tokens_is_what_the_call_reads(tools_running: Daemon) -> None:
    """count_tokens is exact: for a plain question, and with a system prompt and tools
    (rendered by llamad's chatml-tools template), it equals the input_tokens that
    messages.create reports for the same body; the template's markup counts (more than
    the question's 7 tokens of text), and so do the tools."""
    async with _sdk(tools_running) as sdk:
        plain = await sdk.messages.count_tokens(model=SMOL, messages=QUESTION)
        answered = await sdk.messages.create(model=SMOL, max_tokens=1, messages=QUESTION)
        assert plain.input_tokens == answered.usage.input_tokens
        more = await sdk.messages.count_tokens(model=SMOL, messages=QUESTION,
                                               system="Answer briefly.", tools=[WEATHER])
        answered = await sdk.messages.create(model=SMOL, max_tokens=1, messages=QUESTION,
                                             system="Answer briefly.", tools=[WEATHER])
        assert more.input_tokens == answered.usage.input_tokens
    assert plain.input_tokens > 7 and more.input_tokens > plain.input_tokens + 20


async def test_a_tool_use_round_trip(tools_running: Daemon) -> None:
    """The model's call is a tool_use block (id, name, input object) with stop_reason
    tool_use; sent back with a tool_result, the model answers; streamed, the call's
    input arrives as input_json_delta pieces."""
    async with _sdk(tools_running) as sdk:
        first = await sdk.messages.create(
            model=SMOL, max_tokens=60, messages=QUESTION, tools=[WEATHER],
            tool_choice={"type": "any"}, extra_body=FORCED)
        uses = [b for b in first.content if b.type == "tool_use"]
        assert uses, first.content
        use = uses[0]
        assert use.name == "get_weather" and use.id and use.input == {"city": "Paris"}
        assert first.stop_reason in ("tool_use", "max_tokens")
        second = await sdk.messages.create(
            model=SMOL, max_tokens=16, tools=[WEATHER], extra_body={"temperature": 0}, messages=[
                *QUESTION,
                {"role": "assistant", "content": [{"type": "tool_use", "id": use.id,
                                                   "name": use.name, "input": use.input}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": '{"temperature_c": 18}'}]}])
        partial: list[str] = []
        async with sdk.messages.stream(
                model=SMOL, max_tokens=60, messages=QUESTION, tools=[WEATHER],
                tool_choice={"type": "tool", "name": "get_weather"},
                extra_body=FORCED) as stream:
            async for ev in stream:
                if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                    partial.append(ev.delta.partial_json)
            streamed = await stream.get_final_message()
    assert second.content and second.usage.input_tokens > first.usage.input_tokens
    streamed_uses = [b for b in streamed.content if b.type == "tool_use"]
    assert partial and streamed_uses[0].input == {"city": "Paris"}


async def test_errors_have_anthropics_shape(tools_running: Daemon) -> None:
    """A missing max_tokens is a 400 invalid_request_error naming it; an unknown model
    404 not_found_error; tools on a template without them 400; a wrong key 401
    authentication_error: each as the SDK raises it."""
    no_max_tokens: Any = {"max_tokens": None}  # sent as null: the SDK requires the name
    async with _sdk(tools_running) as sdk:
        with pytest.raises(anthropic.BadRequestError) as missing:
            await sdk.messages.create(model=SMOL, messages=HELLO, **no_max_tokens)
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await sdk.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
        with pytest.raises(anthropic.BadRequestError) as tools:
            await sdk.messages.create(model=td.GEMMA, max_tokens=4, messages=QUESTION,
                                      tools=[WEATHER])
    async with _sdk(tools_running, key="wrong-token-0123456789") as sdk:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            await sdk.messages.create(model=SMOL, max_tokens=4, messages=HELLO)
    body: Any = missing.value.body
    assert missing.value.status_code == 400
    assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": body["error"]["message"]}}
    assert "max_tokens" in body["error"]["message"]
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "tools" in tools.value.message
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_a_disconnect_stops_the_child_and_a_deadline_ends_the_stream(
        tools_running: Daemon) -> None:
    """A client that leaves an endless stream stops the child's generation; a stream
    that runs past x-request-timeout ends with Anthropic's error event, which the SDK
    raises (timeout_error)."""
    endless: Any = {"logit_bias": never_end_openai(models_dir() / SMALL_MODEL)}
    count: Any = [{"role": "user", "content": "Count to one thousand."}]
    async with _sdk(tools_running) as sdk:
        async with sdk.messages.stream(model=SMOL, max_tokens=3000, messages=count,
                                       extra_body=endless) as stream:
            await td.read_deltas(stream, "content_block_delta")
        assert await td.generation_stops(tools_running), "still generating"
        with pytest.raises(anthropic.APIStatusError) as late:
            async with sdk.messages.stream(
                    model=SMOL, max_tokens=3000, messages=count, extra_body=endless,
                    extra_headers={"x-request-timeout": "1"}) as stream:
                async for _ in stream:
                    pass
    assert late.value.body["error"]["type"] == "timeout_error"  # type: ignore[index]


async def test_x_api_key_is_taken_only_on_the_messages_routes(tools_running: Daemon) -> None:
    """x-api-key with the read token answers /v1/messages; on /v1/chat/completions it is
    no credential (401 in OpenAI's shape): the other routes take Authorization only."""
    url = f"http://127.0.0.1:{tools_running.http_port}/v1"
    body = {"model": SMOL, "max_tokens": 2, "messages": HELLO}
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        ok = await http.post(url + "/messages", json=body, headers={"x-api-key": td.READ})
        chat = await http.post(url + "/chat/completions", json=body,
                               headers={"x-api-key": td.READ})
        empty = await http.post(url + "/messages", json=body, headers={"x-api-key": ""})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"
    assert empty.status_code == 401
    assert empty.json()["type"] == "error"
