"""``POST /v1/chat/completions`` and ``POST /v1/completions``: whole or streamed.

Both go through :func:`daemon.services.inference.admitted_generation`, as gRPC's Chat and
Generate do: the same admission queue, refusals and metrics. A stream's headers are sent
once its first chunk has come from the child, so a refusal before any token (an invalid
grammar, a child that failed) is still an HTTP status; a failure after that ends the
stream with ``data: {"error": {...}}`` and no ``[DONE]``, which the OpenAI SDKs raise
(written by the request's frame, :mod:`._server`).
A client that goes away cancels the handler (aiohttp's handler cancellation), which
closes the request to the child, which stops generating.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web

from supervisor import ChildRequestError, Chunk, Sampling, TokenLogprobs

from ..config import Limits, Role
from ..grpcapi.rpc import Call
from ..models.backend import InferenceBackend
from ..services.inference import Meter, Usage, admitted_generation
from . import _parse
from ._context import RECEIVED, Api, json_response, open_stream, time_remaining
from ._shapes import DONE, Shape, ToolCalls

Start = Callable[[InferenceBackend, Sampling], AsyncIterator[Chunk]]
async def chat(api: Api, request: web.BaseRequest, call: Call,
               body: _parse.Body) -> web.StreamResponse:
    return await _generate(api, request, call, body, chat=True)


async def completions(api: Api, request: web.BaseRequest, call: Call,
                      body: _parse.Body) -> web.StreamResponse:
    return await _generate(api, request, call, body, chat=False)


def _start(body: _parse.Body, limits: Limits, call: Call, *, chat: bool) -> Start:
    """How to start the stream of the request's messages (chat) or prompt."""
    if chat:
        messages, offered = _parse.chat_messages(body, limits)
        call.note(messages=len(messages))
        if offered is not None:
            call.note(tools=len(offered.tools), tool_choice=offered.choice)
        return lambda backend, sampling: backend.stream_chat(messages, sampling, offered)
    prompt = _parse.prompt(body, limits)
    call.note(prompt_chars=len(prompt))
    return lambda backend, sampling: backend.stream_completion(prompt, sampling)


async def _generate(api: Api, request: web.BaseRequest, call: Call, body: _parse.Body, *,
                    chat: bool) -> web.StreamResponse:
    limits = api.limits()
    listed = api.catalog.resolve(_parse.model_name(body), Role.GENERATION,
                                 "/v1/chat/completions" if chat else "/v1/completions")
    sampling = _parse.sampling(body, limits, chat=chat)
    start = _start(body, limits, call, chat=chat)
    mode = _parse.streaming(body)
    meter = Meter(api.metrics, request[RECEIVED],
                  api.router.model_name(Role.GENERATION, listed.route))
    call.note(max_tokens=sampling.max_tokens, stream=mode.stream)
    async with admitted_generation(api.router, sampling, time_remaining(call), chat=chat,
                                   note=call.note, model=listed.route) as backend:
        chunks = start(backend, sampling)
        try:
            shape = Shape(api.catalog.served_name(listed, backend.model_name), chat=chat,
                          usage_in_chunks=mode.include_usage)
            if mode.stream:
                return await _stream(request, call, chunks, meter, shape)
            return await _whole(request, call, chunks, meter, shape)
        finally:
            meter.flush()  # a stream left early: what it streamed still counts
            call.fields.setdefault("tokens", meter.streamed)  # its line, its quota
            await chunks.aclose()  # type: ignore[attr-defined]


async def _whole(request: web.BaseRequest, call: Call, chunks: AsyncIterator[Chunk],
                 meter: Meter, shape: Shape) -> web.Response:
    texts: list[str] = []
    logprobs: list[TokenLogprobs] = []
    calls = ToolCalls()
    async for item in chunks:
        texts.append(item.text)
        logprobs.extend(item.logprobs)
        calls.add(item.tool_calls)
        if item.finish_reason is None:
            meter.piece(item)
            continue
        usage = meter.finish(item)
        _note_usage(call, usage, item.finish_reason)
        return json_response(request, shape.whole("".join(texts), logprobs,
                                                  item.finish_reason, usage, calls.json()))
    raise ChildRequestError("the stream ended without a finish reason")


async def _stream(request: web.BaseRequest, call: Call, chunks: AsyncIterator[Chunk],
                  meter: Meter, shape: Shape) -> web.StreamResponse:
    item: Chunk | None = await anext(chunks, None)  # before the headers: see the docstring
    response = await open_stream(request)
    while item is not None:
        if item.finish_reason is None:
            meter.piece(item)
            await response.write(shape.piece(item.text, item.logprobs,
                                             tool_calls=item.tool_calls))
        else:
            usage = meter.finish(item)
            _note_usage(call, usage, item.finish_reason)
            # The last event, the usage, [DONE] and the body's end in one send (were
            # four: a write each, woken client each; issue 27).
            tail = shape.piece(item.text, item.logprobs, item.finish_reason)
            if shape.usage_in_chunks:
                tail += shape.usage_chunk(usage)
            await response.write_eof(tail + DONE)
            return response
        item = await anext(chunks, None)
    raise ChildRequestError("the stream ended without a finish reason")


def _note_usage(call: Call, usage: Usage, finish: str) -> None:
    call.note(tokens=usage.completion_tokens, prompt_tokens=usage.prompt_tokens,
              ttft_ms=round(usage.ttft_ms, 2), finish=finish)
