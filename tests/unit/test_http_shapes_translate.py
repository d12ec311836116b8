"""The Responses and Anthropic Messages bodies as the chat-completions bodies they stand
for (daemon.httpapi._responses.chat_body, daemon.httpapi._messages.chat_body), and the
refusals that name the caller's own fields."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from daemon.httpapi import _messages, _responses
from daemon.httpapi._chat import FROM
from daemon.httpapi._errors import ApiError, ParamError


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != FROM} for m in messages]


def test_responses_items_become_chat_messages() -> None:
    body = _responses.chat_body({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 7, "top_p": 0.5,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}})
    assert _plain(body["messages"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    assert [m[FROM] for m in body["messages"]] == ["instructions", "input[0]", "input[1]",
                                                   "input[3]"]
    assert body["max_tokens"] == 7 and body["top_p"] == 0.5
    assert body["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object"}}}


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "hi", "store": "yes"}, "store"),
    ({"input": "hi", "previous_response_id": 5}, "previous_response_id"),
    ({"input": "hi", "previous_response_id": ""}, "previous_response_id"),
    ({"input": "hi", "conversation": "c"}, "conversation"),
    ({"input": [{"type": "reasoning"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "input[0].content[0]"),
    ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"input": "hi", "max_output_tokens": 2**33}, "max_output_tokens"),
])
def test_responses_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ParamError) as info:
        _responses.chat_body({"model": "m", **body})
    assert info.value.param == param


def test_store_true_false_and_omitted_are_a_normal_call() -> None:
    for extra in ({}, {"store": True}, {"store": False}, {"store": None}):
        assert _responses.chat_body({"model": "m", "input": "hi", **extra})["messages"]


def test_a_previous_conversation_goes_after_the_instructions() -> None:
    """The conversation continued comes after the new instructions (the earlier ones are
    not carried over) and before the new input."""
    earlier = [{"role": "user", "content": "My name is Ada."},
               {"role": "assistant", "content": "Hello Ada."}]
    body = _responses.chat_body({"model": "m", "instructions": "Be brief.",
                                 "input": "What is my name?"}, earlier)
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("system", "Be brief."), ("user", "My name is Ada."), ("assistant", "Hello Ada."),
        ("user", "What is my name?")]


def test_messages_blocks_become_chat_messages() -> None:
    body = _messages.chat_body({
        "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "S"}],
        "stop_sequences": ["END"], "top_k": 3,
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1",
                 "content": [{"type": "text", "text": "R"}]},
                {"type": "text", "text": "Thanks"}]}]})
    assert _plain(body["messages"]) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f",
                                                          "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "R"},
        {"role": "user", "content": "Thanks"}]
    assert body["max_tokens"] == 9 and body["stop"] == ["END"] and body["top_k"] == 3
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["tools"][0]["function"] == {"name": "f", "description": "d",
                                            "parameters": {"type": "object"}}


def test_messages_needs_max_tokens_but_count_tokens_does_not() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Q"}]}
    with pytest.raises(ParamError) as info:
        _messages.chat_body(body)
    assert info.value.param == "max_tokens"
    assert _messages.chat_body(body, counting=True)["messages"]


def test_anthropic_error_shape() -> None:
    for status, kind in ((400, "invalid_request_error"), (401, "authentication_error"),
                         (404, "not_found_error"), (429, "rate_limit_error"),
                         (500, "api_error"), (503, "overloaded_error")):
        error = _messages.restyle(ApiError(status, "why", param="p"))
        assert error.status == status
        assert orjson.loads(error.body()) == {"type": "error", "error": {
            "type": kind, "message": "why"}}
        assert error.event({}) == b"event: error\ndata: " + error.body() + b"\n\n"


def test_responses_error_event_carries_the_next_number() -> None:
    error = _responses.responses_style(ApiError(504, "late", code="deadline_exceeded"))
    event = error.event({_responses.SEQUENCE: [12]})
    name, data = event.split(b"\n", 1)
    assert name == b"event: error"
    assert orjson.loads(data.removeprefix(b"data: ")) == {
        "type": "error", "code": "deadline_exceeded", "message": "late", "param": None,
        "sequence_number": 12}
