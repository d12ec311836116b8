"""The chat generation core shared by the routes of other APIs' shapes (``/v1/responses``,
``/v1/messages``): their bodies are translated into a chat-completions body, which is
read and validated by :mod:`._parse` exactly as ``/v1/chat/completions``' is, then
generated through :func:`daemon.services.inference.admitted_generation` (the same admission
queue, refusals, deadline, metrics and per-call log fields as chat completions).

A client that goes away cancels the handler (aiohttp's handler cancellation), which
closes the request to the child, which stops generating.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web

from supervisor import ChildRequestError, Chunk, Message, Sampling, ToolCallDelta, ToolUse

from ..config import Role
from ..errors import InvalidArgument
from ..grpcapi.rpc import Call
from ..services.inference import Meter, Usage, admitted_generation
from . import _parse
from ._context import RECEIVED, Api, json_response, open_stream, time_remaining
from ._errors import ParamError, http_param
from ._models import Listed

FROM = "_from"
"""The key of a translated chat message naming the caller's field it came from
(``input[2]``, ``system``): a refusal of the message names that field."""
_INDEX = re.compile(r"^messages\[(\d+)\]")


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event (``event: name``, ``data: {json}``)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@dataclass(frozen=True)
class Prepared:
    """A chat request read and validated: the model, its controls, messages and tools."""

    listed: Listed
    sampling: Sampling
    messages: list[Message]
    offered: ToolUse | None


def prepare(api: Api, call: Call, chat_body: dict[str, Any], route: str, *,
            messages_param: str) -> Prepared:
    """Read ``chat_body`` (a chat-completions body) as ``/v1/chat/completions`` does.

    A refusal of the messages that names ``messages[N]`` (an index of the translated
    list) names the field of the caller's own body that message came from (its
    :data:`FROM`; ``messages_param`` when it has none).

    Raises:
        InvalidArgument, ApiError: naming the field at fault.
    """
    limits = api.limits()
    listed = api.catalog.resolve(_parse.model_name(chat_body), Role.GENERATION, route)
    sampling = _parse.sampling(chat_body, limits, chat=True)
    try:
        messages, offered = _parse.chat_messages(chat_body, limits)
    except InvalidArgument as exc:
        field = http_param(exc.field or "")
        found = _INDEX.match(field)
        if found is None:
            raise
        index = int(found.group(1))
        given = chat_body["messages"]
        origin = given[index].get(FROM, messages_param) if index < len(given) \
            else messages_param
        rest = field[found.end():]
        if "[" not in origin:  # a string field (input, instructions, system): its content
            rest = rest.removeprefix(".content")
        text = str(exc)  # its words name the translated message: name the caller's
        head = text.partition(" ")[0]
        message = origin + rest + text[len(head):] if head.startswith("messages[") else text
        raise ParamError(origin, message) from None
    call.note(messages=len(messages), max_tokens=sampling.max_tokens)
    if offered is not None:
        call.note(tools=len(offered.tools), tool_choice=offered.choice)
    return Prepared(listed, sampling, messages, offered)


Relay = Callable[[AsyncIterator[Chunk], Meter], Awaitable[web.StreamResponse]]


async def generate(api: Api, request: web.BaseRequest, call: Call, prepared: Prepared,
                   relay: Relay) -> web.StreamResponse:
    """Hold a generation slot of the model, stream the chat from it and hand the chunks
    to ``relay`` (which writes the whole answer or the stream)."""
    meter = Meter(api.metrics, request[RECEIVED],
                  api.router.model_name(Role.GENERATION, prepared.listed.route))
    async with admitted_generation(api.router, prepared.sampling, time_remaining(call),
                                   chat=True, note=call.note,
                                   model=prepared.listed.route) as backend:
        chunks = backend.stream_chat(prepared.messages, prepared.sampling, prepared.offered)
        try:
            return await relay(chunks, meter)
        finally:
            meter.flush()  # a stream left early: what it streamed still counts
            call.fields.setdefault("tokens", meter.streamed)  # its line, its quota
            await chunks.aclose()  # type: ignore[attr-defined]


class Answer(Protocol):
    """A route's answer in its API's shape, built from the chat's chunks: the events of a
    stream (taken as they come) and the whole body (what ``finish`` returns)."""

    def start(self) -> None: ...

    def text(self, piece: str) -> None: ...

    def tool_calls(self, deltas: tuple[ToolCallDelta, ...]) -> None: ...

    def finish(self, usage: Usage, finish_reason: str) -> dict[str, Any]: ...

    def take(self) -> bytes: ...


def relay_answer(request: web.BaseRequest, call: Call, answer: Answer, *, stream: bool,
                 opened: Callable[[], None] | None = None) -> Relay:
    """The relay that writes ``answer`` as a stream of its events (``opened`` runs once
    the event stream's headers are sent) or as one JSON body."""

    async def relay(chunks: AsyncIterator[Chunk], meter: Meter) -> web.StreamResponse:
        # The first chunk before the headers: a refusal before any token is still a status.
        item: Chunk | None = await anext(chunks, None)
        response: web.StreamResponse | None = None
        if stream:
            response = await open_stream(request)
            if opened is not None:
                opened()
            answer.start()
        while item is not None:
            answer.text(item.text)
            answer.tool_calls(item.tool_calls)
            if item.finish_reason is not None:
                usage = meter.finish(item)
                note_usage(call, usage, item.finish_reason)
                whole = answer.finish(usage, item.finish_reason)
                if response is None:
                    return json_response(request, whole)
                await response.write_eof(answer.take())  # one send (issue 27)
                return response
            meter.piece(item)
            if response is not None:
                await response.write(answer.take())
            item = await anext(chunks, None)
        raise ChildRequestError("the stream ended without a finish reason")

    return relay


def note_usage(call: Call, usage: Usage, finish: str) -> None:
    call.note(tokens=usage.completion_tokens, prompt_tokens=usage.prompt_tokens,
              ttft_ms=round(usage.ttft_ms, 2), finish=finish)


EXTENSIONS = ("logit_bias", "seed", "top_k", "min_p", "repeat_penalty", "repeat_last_n",
              "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
              "dry_allowed_length", "dry_penalty_last_n")
"""Chat completions' sampling controls (and llama.cpp's) that the other APIs' routes take
too, as llamad's extensions (checked by :mod:`._parse`, named the same)."""


def copy_numbers(body: Any, out: dict[str, Any], *names: str) -> None:
    """Copy the sampling controls ``names`` and :data:`EXTENSIONS` of ``body``."""
    for name in (*names, *EXTENSIONS):
        if body.get(name) is not None:
            out[name] = body[name]


def integer(body: Any, name: str, *, low: int = 0, high: int = 2**32 - 1) -> int | None:
    """``body[name]``: an integer in ``low..high`` (None when absent or null)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError(name, f"{name} must be an integer, not {_parse.kind(value)}")
    if not low <= value <= high:
        raise ParamError(name, f"{name} must be in {low}..{high}, got {value}")
    return value
