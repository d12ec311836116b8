"""``POST /v1/responses``: OpenAI's Responses API, whole or streamed, over the chat core
(:mod:`._chat`).

The body is translated into a chat-completions body: ``instructions`` becomes the first
(system) message; ``input`` is a string (one user message) or input items (messages
with text parts, ``function_call`` items as an assistant's tool calls,
``function_call_output`` items as tool messages); function ``tools``, ``tool_choice``
and ``parallel_tool_calls`` become chat's (a model whose template cannot render tools
is refused as chat refuses it); ``text.format`` becomes ``response_format`` (the same
schema checks); ``max_output_tokens`` is ``max_tokens``.

A response is stored unless ``store`` is false (OpenAI's default is true, which its SDKs
leave to the server): its conversation is kept in a bounded, in-memory store
(:mod:`._stored`: ``http.responses_stored`` entries, ``http.responses_ttl`` seconds; 0
entries: none kept, and the response says ``store: false``), and ``previous_response_id``
continues it, for the token that created it: the earlier input and output come before
the new input (the earlier ``instructions`` are not carried over). An id that is not
kept is a 400 naming ``previous_response_id``; ``conversation`` and ``background`` are
refused by name.

A stream is the Responses API's events, numbered by ``sequence_number``:
``response.created``, ``response.in_progress``, per output item
``response.output_item.added``, its text (``response.content_part.added``,
``response.output_text.delta`` ..., ``response.output_text.done``,
``response.content_part.done``) or its call's arguments
(``response.function_call_arguments.delta`` / ``.done``), ``response.output_item.done``,
then ``response.completed`` (or ``response.incomplete`` at ``max_output_tokens``). A
failure after the stream began is an ``error`` event.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from supervisor import ToolCallDelta

from ..grpcapi.rpc import Call
from ..services.inference import Usage
from . import _parse
from ._chat import (
    FROM,
    copy_numbers,
    event,
    generate,
    integer,
    relay_answer,
)
from ._context import CALLER, Api
from ._errors import ApiError, ParamError
from ._parse import kind
from ._translated import EventBuffer, prepare_translated

Messages = Sequence[dict[str, Any]]

SEQUENCE = web.RequestKey("responses_sequence", list)
"""The next ``sequence_number`` of a Responses stream (a one-item list), for its error
event."""

_STATEFUL = {
    "conversation": "conversations are not kept by llamad: continue a response with "
                    "previous_response_id, or send the whole conversation as input items",
    "background": "background responses are not available: llamad answers in the request",
}
_PART_TYPES = ("input_text", "output_text", "text")


class ResponsesError(ApiError):
    """An error of a Responses stream: its ``error`` event carries the next number."""

    def event(self, request: Mapping[Any, Any]) -> bytes:
        counter = request.get(SEQUENCE) or [0]
        return event("error", {"type": "error", "code": self.code, "message": self.message,
                               "param": self.param, "sequence_number": counter[0]})


def responses_style(error: ApiError) -> ApiError:
    out = ResponsesError(error.status, error.message, param=error.param, code=error.code,
                         retry_after=error.retry_after, grpc_code=error.grpc_code)
    return out


def _stateful(body: _parse.Body) -> tuple[bool, str | None]:
    """Whether the response is to be stored (``store``, true unless false), and the
    ``previous_response_id`` it continues; the other stateful fields refused."""
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise ParamError("store", f"store must be true or false, not {kind(store)}")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise ParamError("previous_response_id", "previous_response_id must be the id of a "
                         f"response (resp_...), not {kind(previous)}")
    for name, why in _STATEFUL.items():
        if body.get(name) not in (None, False, ""):
            raise ParamError(name, f"{name} is not supported: {why}")
    return store is not False, previous


def _text(value: object, where: str) -> str:
    """A content: a string or an array of text parts."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ParamError(where, f"{where} must be a string or an array of text parts, not "
                         f"{kind(value)}")
    texts: list[str] = []
    for j, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") not in _PART_TYPES or \
                not isinstance(part.get("text"), str):
            raise ParamError(f"{where}[{j}]", f'{where}[{j}] must be a {{"type": '
                             '"input_text", "text": ...} part (only text is accepted)')
        texts.append(part["text"])
    return "".join(texts)


def _messages(body: _parse.Body) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ParamError("instructions", f"instructions must be a string, not "
                             f"{kind(instructions)}")
        out.append({"role": "system", "content": instructions, FROM: "instructions"})
    value = body.get("input")
    if isinstance(value, str):
        return [*out, {"role": "user", "content": value, FROM: "input"}]
    if not isinstance(value, list) or not value:
        raise ParamError("input", "input must be a string or a non-empty array of input "
                         "items")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ParamError(where, f"{where} must be an object (an input item)")
        kind_ = item.get("type", "message")
        if kind_ == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ParamError(f"{where}.role", f"{where}.role must be user, assistant, "
                                 "system or developer")
            out.append({"role": role, FROM: where,
                        "content": _text(item.get("content"), f"{where}.content")})
        elif kind_ == "function_call":
            call = _function_call(item, where)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call],
                            FROM: where})
        elif kind_ == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ParamError(f"{where}.call_id", f"{where}.call_id must be a string")
            out.append({"role": "tool", "tool_call_id": call_id, FROM: where,
                        "content": _text(item.get("output"), f"{where}.output")})
        else:
            raise ParamError(f"{where}.type", f"{where}.type {str(kind_)[:40]!r} is not "
                             "supported: message, function_call or function_call_output")
    return out


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise ParamError(f"{where}.{name}", f"{where}.{name} must be a string")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _tools(body: _parse.Body, out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ParamError("tools", "tools must be an array of function tools")
        chat_tools = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise ParamError(f"tools[{i}].type", f'tools[{i}] must be {{"type": '
                                 '"function", "name": ..., "parameters": {...}} (only '
                                 "function tools are available)")
            chat_tools.append({"type": "function", "function": {
                k: tool[k] for k in ("name", "description", "parameters") if k in tool}})
        if chat_tools:
            out["tools"] = chat_tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise ParamError("tool_choice", 'tool_choice must be auto, none, required or '
                             '{"type": "function", "name": ...}')
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        out["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]


def _format(body: _parse.Body, out: dict[str, Any]) -> None:
    text = body.get("text")
    if text is None:
        return
    if not isinstance(text, dict):
        raise ParamError("text", "text must be an object ({\"format\": {...}})")
    spec = text.get("format")
    if spec is None:
        return
    if not isinstance(spec, dict) or spec.get("type") not in ("text", "json_object",
                                                               "json_schema"):
        raise ParamError("text.format", 'text.format must be {"type": "text"}, '
                         '{"type": "json_object"} or {"type": "json_schema", "name": ..., '
                         '"schema": {...}}')
    if spec["type"] != "json_schema":
        out["response_format"] = {"type": spec["type"]}
        return
    if not isinstance(spec.get("schema"), dict):
        raise ParamError("text.format.schema", "text.format.schema must be a JSON Schema "
                         "object")
    name = spec.get("name", "")
    if not isinstance(name, str):
        raise ParamError("text.format.name", "text.format.name must be a string")
    out["response_format"] = {"type": "json_schema", "json_schema": {
        "name": name, "schema": spec["schema"]}}


def chat_body(body: _parse.Body, previous: Messages = ()) -> dict[str, Any]:
    """The chat-completions body a Responses body stands for, ``previous`` (the
    conversation of the response it continues) before its input."""
    _stateful(body)
    messages = _messages(body)
    at = 1 if messages and messages[0].get(FROM) == "instructions" else 0
    out: dict[str, Any] = {"model": body.get("model"),
                           "messages": [*messages[:at], *previous, *messages[at:]]}
    max_tokens = integer(body, "max_output_tokens", low=1)
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    copy_numbers(body, out, "temperature", "top_p")
    _tools(body, out)
    _format(body, out)
    return out


class _Output(EventBuffer):
    """The output items of one response, built from the chunks (text first as it came,
    then each tool call), and the events that announce them when streaming."""

    def __init__(self, body: _parse.Body, model: str, *, stream: bool,
                 keep: Callable[[str, Messages], None] | None = None) -> None:
        super().__init__(stream=stream)
        self.id = "resp_" + secrets.token_hex(12)
        self.keep = keep  # stores the conversation with the output once it is whole
        self.model = model
        self.body = body
        self.created = int(time.time())
        self.items: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.sequence = [0]

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self.stream:
            self.events.append(event(name, {"type": name, **data,
                                            "sequence_number": self.sequence[0]}))
            self.sequence[0] += 1

    def response(self, status: str, usage: Usage | None = None,
                 incomplete: str | None = None) -> dict[str, Any]:
        body = self.body
        text_format = (body.get("text") or {}).get("format") or {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": self.model,
            "output": self.items if status != "in_progress" else [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "store": self.keep is not None,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "text": {"format": text_format}, "truncation": "disabled",
            "metadata": body.get("metadata") or {},
            "usage": None if usage is None else {
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.total_tokens}}

    def start(self) -> None:
        self._emit("response.created", {"response": self.response("in_progress")})
        self._emit("response.in_progress", {"response": self.response("in_progress")})

    def text(self, piece: str) -> None:
        if not piece:
            return
        if self.message is None:
            self.message = {"id": "msg_" + secrets.token_hex(12), "type": "message",
                            "status": "in_progress", "role": "assistant", "content": []}
            self.items.append(self.message)
            self._emit("response.output_item.added", {
                "output_index": len(self.items) - 1, "item": {**self.message,
                                                              "content": []}})
            self.message["content"].append({"type": "output_text", "text": "",
                                            "annotations": [], "logprobs": []})
            self._emit("response.content_part.added", {
                "item_id": self.message["id"], "output_index": len(self.items) - 1,
                "content_index": 0, "part": {"type": "output_text", "text": "",
                                             "annotations": []}})
        part = self.message["content"][0]
        part["text"] += piece
        self._emit("response.output_text.delta", {
            "item_id": self.message["id"], "output_index": self.items.index(self.message),
            "content_index": 0, "delta": piece, "logprobs": []})

    def tool_calls(self, deltas: tuple[ToolCallDelta, ...]) -> None:
        for delta in deltas:
            item = self.calls.get(delta.index)
            if item is None:
                item = {"id": "fc_" + secrets.token_hex(12), "type": "function_call",
                        "status": "in_progress",
                        "call_id": delta.id or "call_" + secrets.token_hex(8),
                        "name": delta.name, "arguments": ""}
                self.calls[delta.index] = item
                self.items.append(item)
                self._emit("response.output_item.added", {
                    "output_index": len(self.items) - 1, "item": dict(item)})
            item["name"] = item["name"] or delta.name
            if delta.arguments:
                item["arguments"] += delta.arguments
                self._emit("response.function_call_arguments.delta", {
                    "item_id": item["id"], "output_index": self.items.index(item),
                    "delta": delta.arguments})

    def finish(self, usage: Usage, finish_reason: str) -> dict[str, Any]:
        for index, item in enumerate(self.items):
            item["status"] = "completed"
            if item is self.message:
                part = item["content"][0]
                common = {"item_id": item["id"], "output_index": index, "content_index": 0}
                self._emit("response.output_text.done", {**common, "text": part["text"],
                                                         "logprobs": []})
                self._emit("response.content_part.done", {**common, "part": part})
            else:
                self._emit("response.function_call_arguments.done", {
                    "item_id": item["id"], "output_index": index,
                    "arguments": item["arguments"]})
            self._emit("response.output_item.done", {"output_index": index, "item": item})
        if self.keep is not None:
            self.keep(self.id, [self._turn()])
        if finish_reason == "length":
            final = self.response("incomplete", usage, "max_output_tokens")
            self._emit("response.incomplete", {"response": final})
        else:
            final = self.response("completed", usage)
            self._emit("response.completed", {"response": final})
        return final


    def _turn(self) -> dict[str, Any]:
        """The output as the assistant's chat message (its text, its calls)."""
        calls = [{"id": c["call_id"], "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for c in self.calls.values()]
        text = self.message["content"][0]["text"] if self.message is not None else \
            None if calls else ""
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls
                                                         else {})}


async def create(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    """``POST /v1/responses``."""
    store, previous_id = _stateful(body)
    caller, stored = request[CALLER], api.responses
    previous: Messages = ()
    if previous_id is not None:
        found = stored.get(previous_id, caller)
        if found is None:
            why = ("it is not (or no longer) kept: responses are kept "
                   f"{stored.ttl:.0f} s, the newest {stored.max_entries} "
                   "(http.responses_ttl, http.responses_stored), for the token that made "
                   "them" if stored.enabled else
                   "this daemon keeps no responses (http.responses_stored = 0)")
            raise ApiError(400, f"previous_response_id {previous_id[:80]!r} cannot be "
                           f"continued: {why}; send the whole conversation as input items",
                           param="previous_response_id", code="previous_response_not_found")
        previous = [{**m, FROM: "previous_response_id"} for m in found]
        call.note(previous_turns=len(previous))
    translated = chat_body(body, previous)
    prepared, stream = prepare_translated(api, call, body, translated, "/v1/responses",
                                          messages_param="input")
    conversation = [m for m in translated["messages"] if m.get(FROM) != "instructions"]

    def keep(response_id: str, output: Messages) -> None:
        stored.put(response_id, caller, [*conversation, *output])

    output = _Output(body, prepared.listed.name, stream=stream,
                     keep=keep if store and stored.enabled else None)

    def opened() -> None:
        request[SEQUENCE] = output.sequence  # an error event after this one follows on

    return await generate(api, request, call, prepared,
                          relay_answer(request, call, output, stream=stream, opened=opened))
