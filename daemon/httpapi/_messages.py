"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API
over the chat core (:mod:`._chat`), errors in Anthropic's shape
(``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``).

The body is translated into a chat-completions body: ``system`` (a string or text blocks)
is the first message; a message's content is a string or blocks (``text``; ``tool_use``
in an assistant's, as its tool calls; ``tool_result`` in a user's, as tool messages);
``tools`` (``name``, ``description``, ``input_schema``) and ``tool_choice`` (auto, any,
tool, none) become chat's (a model whose template cannot render tools is refused as
chat refuses it); ``max_tokens`` is required; ``stop_sequences`` is ``stop``.

A stream is Anthropic's events: ``message_start``, per content block
``content_block_start``, ``content_block_delta`` (``text_delta`` or
``input_json_delta``), ``content_block_stop``, then ``message_delta`` (the stop reason
and usage) and ``message_stop``. A failure after the stream began is an ``error`` event.
``stop_reason`` is ``end_turn`` whether the model ended or a stop sequence did (the
child does not say which), ``max_tokens`` or ``tool_use``.

``count_tokens`` is exact: the prompt the model's chat template renders for the system
prompt, the messages and the tools (the child's ``/apply-template``), tokenized as a
chat's prompt is (with the model's special tokens): the ``input_tokens`` a
``/v1/messages`` call of the same body reports. A runtime that renders no template on
request (the bundled one, an endpoint that is not llama-server) is a 400 saying so.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from supervisor import ToolCallDelta

from ..config import Role
from ..grpcapi.rpc import Call
from ..services.inference import Usage
from . import _parse
from ._chat import (
    FROM,
    copy_numbers,
    event,
    generate,
    integer,
    prepare,
    relay_answer,
)
from ._context import Api, json_response, time_remaining
from ._errors import ApiError, ParamError
from ._parse import kind
from ._translated import EventBuffer, prepare_translated

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          503: "overloaded_error", 504: "timeout_error"}
_STOP = {"length": "max_tokens", "tool_calls": "tool_use"}


class AnthropicError(ApiError):
    """An HTTP refusal in Anthropic's error shape."""

    def _json(self) -> dict[str, Any]:
        kind_ = _TYPES.get(self.status, "api_error" if self.status >= 500
                           else "invalid_request_error")
        return {"type": "error", "error": {"type": kind_, "message": self.message}}

    def body(self) -> bytes:
        return orjson.dumps(self._json())

    def event(self, request: Mapping[Any, Any]) -> bytes:
        return event("error", self._json())


def restyle(error: ApiError) -> ApiError:
    return AnthropicError(error.status, error.message, param=error.param, code=error.code,
                          retry_after=error.retry_after, grpc_code=error.grpc_code)


def _system(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ParamError("system", f"system must be a string or an array of text blocks, "
                         f"not {kind(value)}")
    return "\n".join(_parse.text_blocks(value, "system", '{"type": "text", "text": ...}'))


def _blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """A message as chat messages: its text, tool calls and tool results."""
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise ParamError(f"{where}.role", f"{where}.role must be user or assistant")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ParamError(f"{where}.content", f"{where}.content must be a string or an array "
                         "of content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind_ = block.get("type") if isinstance(block, dict) else None
        if kind_ == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind_ == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ParamError(at, f"{at}.id and {at}.name must be strings")
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise ParamError(f"{at}.input", f"{at}.input must be an object")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": arguments}})
        elif kind_ == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise ParamError(f"{at}.tool_use_id", f"{at}.tool_use_id must be a string")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result(block.get("content"), f"{at}.content")})
        else:
            raise ParamError(at, f"{at} must be a text block, a tool_use block (assistant) "
                             "or a tool_result block (user); other blocks are not accepted")
    out: list[dict[str, Any]] = list(results)
    if texts or calls or not results:
        turn: dict[str, Any] = {"role": role, "content": "".join(texts) or
                                (None if calls else "")}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    return out


def _result(value: object, where: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text" and
                                       isinstance(b.get("text"), str) for b in value):
        return "".join(b["text"] for b in value)
    raise ParamError(where, f"{where} must be a string or an array of text blocks")


def _tools(body: _parse.Body, out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ParamError("tools", "tools must be an array of {name, description, "
                             "input_schema} objects")
        chat_tools = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or \
                    not isinstance(tool.get("name"), str):
                raise ParamError(f"tools[{i}]", f"tools[{i}] must be a client tool "
                                 "{name, description, input_schema} (server tools are not "
                                 "available)")
            function = {"name": tool["name"], "parameters": tool.get("input_schema")}
            if tool.get("description") is not None:
                function["description"] = tool["description"]
            chat_tools.append({"type": "function", "function": function})
        if chat_tools:
            out["tools"] = chat_tools
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool",
                                                                   "none"):
        raise ParamError("tool_choice", 'tool_choice must be {"type": "auto"}, '
                         '{"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}')
    if choice["type"] == "tool":
        if not isinstance(choice.get("name"), str):
            raise ParamError("tool_choice.name", "tool_choice.name must be a string")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[
            choice["type"]]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def _messages(body: _parse.Body) -> list[dict[str, Any]]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise ParamError("messages", "messages must be a non-empty array of {role, content}")
    out: list[dict[str, Any]] = []
    system = _system(body.get("system"))
    if system:
        out.append({"role": "system", "content": system, FROM: "system"})
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ParamError(f"messages[{i}]", f"messages[{i}] must be an object")
        out.extend({**turn, FROM: f"messages[{i}]"}
                   for turn in _blocks(message, f"messages[{i}]"))
    return out


def chat_body(body: _parse.Body, *, counting: bool = False) -> dict[str, Any]:
    """The chat-completions body a Messages body stands for."""
    out: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    if not counting:
        if body.get("max_tokens") is None:
            raise ParamError("max_tokens", "max_tokens: Field required (the most tokens "
                             "to generate)")
        out["max_tokens"] = integer(body, "max_tokens", low=1)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ParamError("stop_sequences", "stop_sequences must be an array of strings")
        out["stop"] = stops
    copy_numbers(body, out, "temperature", "top_p", "top_k")
    _tools(body, out)
    return out


def _arguments(text: str) -> Any:
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _Message(EventBuffer):
    """The content blocks of one answer and, when streaming, their events."""

    def __init__(self, model: str, *, stream: bool) -> None:
        super().__init__(stream=stream)
        self.id = "msg_" + secrets.token_hex(12)
        self.model = model
        self.blocks: list[dict[str, Any]] = []
        self.text_block: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        if self.stream:
            self.events.append(event(name, {"type": name, **data}))

    def whole(self, content: list[dict[str, Any]], stop_reason: str | None,
              usage: Usage | None) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": usage.prompt_tokens if usage else 0,
                          "output_tokens": usage.completion_tokens if usage else 0}}

    def start(self) -> None:
        self._emit("message_start", {"message": self.whole([], None, None)})

    def _open(self, block: dict[str, Any]) -> None:
        if self.blocks:
            self._emit("content_block_stop", {"index": len(self.blocks) - 1})
        self.blocks.append(block)
        start = {**block, "input": {}} if block["type"] == "tool_use" else \
            {**block, "text": ""}
        start.pop("_arguments", None)
        self._emit("content_block_start", {"index": len(self.blocks) - 1,
                                           "content_block": start})

    def text(self, piece: str) -> None:
        if not piece:
            return
        if self.text_block is None or self.blocks[-1] is not self.text_block:
            self.text_block = {"type": "text", "text": ""}
            self._open(self.text_block)
        self.text_block["text"] += piece
        self._emit("content_block_delta", {"index": len(self.blocks) - 1, "delta": {
            "type": "text_delta", "text": piece}})

    def tool_calls(self, deltas: tuple[ToolCallDelta, ...]) -> None:
        for delta in deltas:
            block = self.calls.get(delta.index)
            if block is None:
                block = {"type": "tool_use", "id": delta.id or "toolu_" + secrets.token_hex(8),
                         "name": delta.name, "_arguments": ""}
                self.calls[delta.index] = block
                self._open(block)
            block["name"] = block["name"] or delta.name
            if delta.arguments:
                block["_arguments"] += delta.arguments
                self._emit("content_block_delta", {
                    "index": self.blocks.index(block),
                    "delta": {"type": "input_json_delta", "partial_json": delta.arguments}})

    def finish(self, usage: Usage, finish_reason: str) -> dict[str, Any]:
        content = []
        for block in self.blocks:
            if block["type"] == "tool_use":
                content.append({"type": "tool_use", "id": block["id"], "name": block["name"],
                                "input": _arguments(block["_arguments"])})
            else:
                content.append(block)
        stop = _STOP.get(finish_reason, "end_turn")
        if self.calls and stop == "end_turn":
            stop = "tool_use"
        if self.blocks:
            self._emit("content_block_stop", {"index": len(self.blocks) - 1})
        self._emit("message_delta", {
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"input_tokens": usage.prompt_tokens,
                      "output_tokens": usage.completion_tokens}})
        self._emit("message_stop", {})
        return self.whole(content, stop, usage)


async def create(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    """``POST /v1/messages``."""
    translated = chat_body(body)
    prepared, stream = prepare_translated(api, call, body, translated, "/v1/messages",
                                          messages_param="messages")
    message = _Message(prepared.listed.name, stream=stream)
    return await generate(api, request, call, prepared,
                          relay_answer(request, call, message, stream=stream))


async def count_tokens(api: Api, request: web.BaseRequest, call: Call,
                       body: _parse.Body) -> web.StreamResponse:
    """``POST /v1/messages/count_tokens``: the tokens of the prompt ``/v1/messages`` would
    give the model (read and checked as ``/v1/messages``): rendered by the model's own chat
    template with its tools, tokenized as a chat's prompt is."""
    translated = chat_body(body, counting=True)
    prepared = prepare(api, call, translated, "/v1/messages/count_tokens",
                       messages_param="messages")
    backend = await api.router.backend_of(Role.GENERATION, prepared.listed.route,
                                          time_remaining(call))
    prompt = await backend.apply_template(prepared.messages, prepared.offered)
    total = len(await backend.tokenize(prompt, add_special=True))
    call.note(prompt_tokens=total)
    return json_response(request, {"input_tokens": total})
