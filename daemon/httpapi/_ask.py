"""``POST /v1/llamad/ask``: grounded answers over HTTP, llamad's own extension (no OpenAI
route fits an answer with citations).

The body is a ``llamad.v1.AskRequest`` in protobuf's JSON mapping (field names as in the
proto or in lowerCamelCase, enums by name: ``{"question": "...", "top_k": 5, "task":
"TASK_TYPE_DIAGNOSE", "sampling": {"max_tokens": 200}}``), plus ``"stream": true`` to
stream. It is answered by the very code of gRPC's AnswerService/Ask (retrieval,
redaction, prompt assembly, cache, audit), so both APIs answer alike. Streamed, each
``AskResponse`` is one event in the same JSON mapping: ``data: {"text": ...}`` pieces,
then ``data: {"sources": {...}}`` (the citations), then ``data: {"done": {...}}``, then
``data: [DONE]``. Whole: ``{"text", "sources", "done"}`` in one object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from aiohttp import web
from google.protobuf import json_format

from llamad_protocol.v1 import answer_pb2 as apb

from ..grpcapi.rpc import Call
from . import _parse
from ._context import Api, json_response, open_stream, time_remaining
from ._errors import ApiError
from ._shapes import DONE, sse

Ask = Callable[[object, apb.AskRequest, object, Call], AsyncIterator[apb.AskResponse]]


class _Deadline:
    """What Ask reads of a gRPC call's context: the time left."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def time_remaining(self) -> float | None:
        return time_remaining(self._call)


def _request(body: _parse.Body) -> apb.AskRequest:
    fields = {k: v for k, v in body.items() if k != "stream"}
    try:
        return json_format.ParseDict(fields, apb.AskRequest())
    except json_format.ParseError as exc:
        raise ApiError(400, f"the body is not a valid llamad.v1.AskRequest: {exc}"[:400]
                       ) from None


def _json(event: apb.AskResponse) -> dict[str, Any]:
    return json_format.MessageToDict(event, preserving_proto_field_name=True)


async def ask(api: Api, request: web.BaseRequest, call: Call,
              body: _parse.Body) -> web.StreamResponse:
    """Answer with citations, whole or streamed (module docstring)."""
    if api.answer is None:
        raise ApiError(404, "Ask is not served by this daemon", code="not_found")
    stream = _parse.streaming(body).stream
    message = _request(body)
    run = cast(Ask, type(api.answer).Ask.__wrapped__)  # type: ignore[attr-defined]
    events = run(api.answer, message, _Deadline(call), call)
    try:
        if not stream:
            answer: dict[str, Any] = {"text": ""}
            async for piece in events:
                fields = _json(piece)
                answer["text"] += fields.pop("text", "")
                answer.update(fields)
            return json_response(request, answer)
        event: apb.AskResponse | None = await anext(events, None)  # before the headers
        response = await open_stream(request)
        while event is not None:
            await response.write(sse(_json(event)))
            event = await anext(events, None)
        await response.write(DONE)
        await response.write_eof()
        return response
    finally:
        await events.aclose()  # type: ignore[attr-defined]
