"""``POST /v1/responses`` of a real daemon (real llama-server children on real GGUF
models), called by the official ``openai`` SDK's ``responses.create`` and
``responses.stream``: text, instructions, json_schema through ``text.format``, a
function-call round trip on SmolLM2 with llamad's chatml-tools template (the call forced
with a logit bias, as tests/integration/test_http_tools.py does), max_output_tokens,
usage, stored responses continued by previous_response_id, and the refusals (tools on a
template without them, an id not kept) naming their field.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from daemon import Daemon
from tests.conftest import SMALL_MODEL, models_dir
from tests.support import tools_daemon as td
from tests.support.endless import never_end_openai
from tests.support.tools_daemon import SMOL

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

WEATHER: Any = {"type": "function", "name": "get_weather",
                "description": "The current weather of a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}
QUESTION = "What is the weather in Paris?"
NAMELESS: Any = {"format": {"type": "json_schema", "name": 3, "schema": {}}}
IMAGE: Any = [{"type": "input_image", "image_url": "https://example.com/a.png"}]
PERSON: Any = {"type": "object", "properties": {"name": {"type": "string"},
                                                "age": {"type": "integer"}},
               "required": ["name", "age"], "additionalProperties": False}


def _sdk(daemon: Daemon, key: str = td.READ) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{daemon.http_port}/v1",
                              api_key=key, max_retries=0, timeout=120,
                              http_client=openai.DefaultAsyncHttpxClient(trust_env=False))


async def test_create_with_only_model_and_input(tools_running: Daemon) -> None:
    """The SDK's plainest call: a completed response with one assistant message, its
    text, the model as /v1/models lists it, and real usage."""
    async with _sdk(tools_running) as sdk:
        response = await sdk.responses.create(model=SMOL, input="Say hello.",
                                              max_output_tokens=8)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.model == SMOL
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.output_text
    usage = response.usage
    assert usage is not None and usage.input_tokens > 5
    assert 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


async def test_instructions_and_input_items_reach_the_prompt(tools_running: Daemon) -> None:
    """instructions and a conversation of input items (text parts, an assistant turn)
    are all rendered: the prompt grows by their tokens."""
    async with _sdk(tools_running) as sdk:
        bare = await sdk.responses.create(model=SMOL, input="Hi", max_output_tokens=1)
        full = await sdk.responses.create(
            model=SMOL, instructions="You are a terse assistant who answers in French.",
            max_output_tokens=1, store=False,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                   {"role": "assistant", "content": "Bonjour."},
                   {"type": "message", "role": "user", "content": "How are you?"}])
    assert bare.usage is not None and full.usage is not None
    assert full.usage.input_tokens > bare.usage.input_tokens + 15


async def test_max_output_tokens_makes_an_incomplete_response(tools_running: Daemon) -> None:
    """With the end of generation banned, the response stops at max_output_tokens:
    status incomplete, reason max_output_tokens, exactly that many tokens."""
    async with _sdk(tools_running) as sdk:
        response = await sdk.responses.create(
            model=SMOL, input="Count to one thousand.", max_output_tokens=6,
            extra_body={"logit_bias": never_end_openai(models_dir() / SMALL_MODEL)})
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 6


async def test_json_schema_through_text_format(tools_running: Daemon) -> None:
    """text.format json_schema constrains the output to the schema (a validator
    accepts it)."""
    async with _sdk(tools_running) as sdk:
        response = await sdk.responses.create(
            model=SMOL, input="Invent a person.", max_output_tokens=60, temperature=0,
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                             "strict": True}})
    jsonschema.validate(json.loads(response.output_text), PERSON)


async def test_a_function_call_round_trip(tools_running: Daemon) -> None:
    """The model's call comes back as a function_call item (name, call_id, JSON
    arguments); sent back with its output as input items, the model answers; sent as the
    output alone with previous_response_id, the model reads the same prompt."""
    async with _sdk(tools_running) as sdk:
        first = await sdk.responses.create(
            model=SMOL, input=QUESTION, tools=[WEATHER], tool_choice="required",
            temperature=0, max_output_tokens=60,
            extra_body={"logit_bias": td.OPEN_A_CALL, **td.NO_REPEAT_GUARD})
        calls = [item for item in first.output if item.type == "function_call"]
        assert calls, first.output
        call = calls[0]
        assert call.name == "get_weather" and call.call_id
        assert json.loads(call.arguments) == {"city": "Paris"}
        second = await sdk.responses.create(
            model=SMOL, tools=[WEATHER], temperature=0, max_output_tokens=16,
            input=[{"role": "user", "content": QUESTION},
                   {"type": "function_call", "call_id": call.call_id,
                    "name": call.name, "arguments": call.arguments},
                   {"type": "function_call_output", "call_id": call.call_id,
                    "output": '{"temperature_c": 18, "sky": "sunny"}'}])
        # As agent frameworks send it: only the call's output, the rest by reference;
        # the same prompt as the whole conversation (every call the model made) in full.
        result: Any = {"type": "function_call_output", "call_id": call.call_id,
                       "output": '{"temperature_c": 18, "sky": "sunny"}'}
        chained = await sdk.responses.create(
            model=SMOL, tools=[WEATHER], temperature=0, max_output_tokens=16,
            previous_response_id=first.id, input=[result])
        replayed: Any = [{"role": "user", "content": QUESTION},
                         *[{"type": "function_call", "call_id": c.call_id, "name": c.name,
                            "arguments": c.arguments} for c in calls], result]
        whole = await sdk.responses.create(
            model=SMOL, tools=[WEATHER], temperature=0, max_output_tokens=16, store=False,
            input=replayed)
    assert second.status in ("completed", "incomplete")
    assert second.output_text or any(i.type == "function_call" for i in second.output)
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    assert chained.usage is not None and whole.usage is not None
    assert chained.usage.input_tokens == whole.usage.input_tokens


async def test_stream_events_in_order(tools_running: Daemon) -> None:
    """responses.stream: the events the Responses API defines, in its order, numbered;
    the deltas join into the final response's text."""
    names: list[str] = []
    numbers: list[int] = []
    deltas: list[str] = []
    async with _sdk(tools_running) as sdk, sdk.responses.stream(model=SMOL, input="Say hello.",
                                    max_output_tokens=8) as stream:
        async for ev in stream:
            names.append(ev.type)
            numbers.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
            if ev.type in ("response.completed", "response.incomplete"):
                # The SDK's get_final_response() wants response.completed; a reply cut at
                # max_output_tokens ends with response.incomplete, as OpenAI's does.
                final = ev.response
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"] or \
        names[-4:] == ["response.output_text.done", "response.content_part.done",
                       "response.output_item.done", "response.incomplete"]
    assert numbers == list(range(len(names)))
    assert deltas and "".join(deltas) == final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0


async def test_a_streamed_function_call(tools_running: Daemon) -> None:
    """A streamed call: its item added, argument deltas that join into the final
    arguments, then done."""
    pieces: dict[str, str] = {}
    async with _sdk(tools_running) as sdk, sdk.responses.stream(
            model=SMOL, input=QUESTION, tools=[WEATHER], tool_choice="required",
            temperature=0, max_output_tokens=60,
            extra_body={"logit_bias": td.OPEN_A_CALL, **td.NO_REPEAT_GUARD}) as stream:
        async for ev in stream:
            if ev.type == "response.function_call_arguments.delta":
                pieces[ev.item_id] = pieces.get(ev.item_id, "") + ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response  # incomplete: the model went on past its call
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert json.loads(pieces[calls[0].id or ""]) == json.loads(calls[0].arguments) == \
        {"city": "Paris"}


async def test_a_stored_response_is_continued_by_previous_response_id(
        tools_running: Daemon) -> None:
    """The SDK's plainest call (store left to the server, whose default is true) is
    stored: a call naming it by previous_response_id reads its input and output before
    its own, exactly as sending that conversation in full does (the same input tokens;
    its instructions not carried over); a streamed continuation is stored too, so a chain
    goes on; store=False is not kept; an unknown id, or one not kept, is a 400 naming
    previous_response_id."""
    async with _sdk(tools_running) as sdk:
        first = await sdk.responses.create(model=SMOL, instructions="Be brief.",
                                           input="My name is Ada.", max_output_tokens=8)
        assert first.to_dict()["store"] is True  # (not a field of the SDK's type)
        second = await sdk.responses.create(model=SMOL, previous_response_id=first.id,
                                            input="What is my name?", max_output_tokens=1)
        assert second.previous_response_id == first.id and second.to_dict()["store"]
        full = await sdk.responses.create(
            model=SMOL, store=False, max_output_tokens=1,
            input=[{"role": "user", "content": "My name is Ada."},
                   {"role": "assistant", "content": first.output_text},
                   {"role": "user", "content": "What is my name?"}])
        assert full.to_dict()["store"] is False
        assert second.usage is not None and full.usage is not None
        assert second.usage.input_tokens == full.usage.input_tokens
        async with sdk.responses.stream(model=SMOL, previous_response_id=second.id,
                                        input="Say it again.", max_output_tokens=1) as stream:
            events = [e async for e in stream]  # incomplete at 1 token: no .completed
        assert events[-1].type == "response.incomplete"
        third = events[-1].response
        fourth = await sdk.responses.create(model=SMOL, previous_response_id=third.id,
                                            input="Thanks.", max_output_tokens=1)
        assert third.usage is not None and fourth.usage is not None
        assert fourth.usage.input_tokens > third.usage.input_tokens > \
            second.usage.input_tokens
        refused = []
        for missing in ("resp_123", full.id):
            with pytest.raises(openai.BadRequestError) as info:
                await sdk.responses.create(model=SMOL, input="Hi",
                                           previous_response_id=missing)
            refused.append(info.value)
    for error in refused:
        assert error.body["param"] == "previous_response_id"  # type: ignore[index]
        assert "cannot be continued" in error.message


async def test_refusals_name_their_field(tools_running: Daemon) -> None:
    """Bad fields are a 400 naming them; tools on a model whose template renders none
    are refused as chat refuses them; no token is a 401."""
    async with _sdk(tools_running) as sdk:
        with pytest.raises(openai.BadRequestError) as tools:
            await sdk.responses.create(model=td.GEMMA, input=QUESTION, tools=[WEATHER],
                                       max_output_tokens=4)
        with pytest.raises(openai.BadRequestError) as item:
            await sdk.responses.create(model=SMOL, input=IMAGE)
        with pytest.raises(openai.BadRequestError) as tokens:
            await sdk.responses.create(model=SMOL, input="Hi", max_output_tokens=-1)
        with pytest.raises(openai.BadRequestError) as empty:
            await sdk.responses.create(model=SMOL, instructions="Be brief.",
                                       input=[{"role": "user", "content": "Hi"},
                                              {"role": "user", "content": ""}])
        with pytest.raises(openai.BadRequestError) as huge:
            await sdk.responses.create(model=SMOL, input="Hi", max_output_tokens=2**40)
        with pytest.raises(openai.BadRequestError) as name:
            await sdk.responses.create(model=SMOL, input="Hi", text=NAMELESS)
    assert tools.value.body["param"] == "tools"  # type: ignore[index]
    assert item.value.body["param"] == "input[0].type"  # type: ignore[index]
    assert tokens.value.body["param"] == "max_output_tokens"  # type: ignore[index]
    assert huge.value.body["param"] == "max_output_tokens"  # type: ignore[index]
    # The check of the chat core names the input item, not the chat message it became.
    assert empty.value.body["param"] == "input[1]"  # type: ignore[index]
    assert empty.value.body["message"] == "input[1].content is empty"  # type: ignore[index]
    assert name.value.body["param"] == "text.format.name"  # type: ignore[index]
    async with httpx.AsyncClient(trust_env=False) as http:
        denied = await http.post(f"http://127.0.0.1:{tools_running.http_port}/v1/responses",
                                 json={"model": SMOL, "input": "Hi"})
    assert denied.status_code == 401 and denied.json()["error"]["type"] == \
        "authentication_error"


async def test_a_disconnect_stops_the_child_and_a_deadline_ends_the_stream(
        tools_running: Daemon) -> None:
    """A client that leaves an endless stream stops the child's generation; a stream
    that runs past x-request-timeout ends with an error event (deadline_exceeded, the
    next sequence number), which the SDK yields as the last event."""
    endless: Any = {"logit_bias": never_end_openai(models_dir() / SMALL_MODEL)}
    async with _sdk(tools_running) as sdk:
        async with sdk.responses.stream(model=SMOL, input="Count to one thousand.",
                                        max_output_tokens=3000, extra_body=endless) as stream:
            await td.read_deltas(stream, "response.output_text.delta")
        assert await td.generation_stops(tools_running), "still generating"
        events: list[Any] = []
        async with sdk.responses.stream(
                model=SMOL, input="Count to one thousand.", max_output_tokens=3000,
                extra_body=endless, extra_headers={"x-request-timeout": "1"}) as stream:
            async for ev in stream:
                events.append(ev)
    last = events[-1]
    assert last.type == "error" and last.code == "deadline_exceeded"
    assert last.sequence_number == events[-2].sequence_number + 1
    assert any(e.type == "response.output_text.delta" for e in events)
