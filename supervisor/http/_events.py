"""A child's streamed answer as chunks: the server-sent events of an OpenAI-compatible
stream (``data: {json}`` lines, ``data: [DONE]``) parsed from its body's bytes into
:class:`Chunk` (text, token count, logprobs, tool-call pieces; the finish reason and
usage last). Split from :mod:`supervisor._client`, which sends the requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .._sampling import TokenLogprobs, parse_logprobs
from .._tools import ToolCallDelta, join_tool_deltas, parse_tool_deltas
from ..errors import ChildRequestError
from ._read import HTTPTransportError, Silence


@dataclass(frozen=True, slots=True, init=False)
class Chunk:
    """A piece of a streamed completion.

    ``tokens`` is the number of tokens this chunk carries (runtimes send one event per
    token; a held-back multi-byte character can make it more). The last chunk has a
    ``finish_reason`` and, when the runtime reports it, the usage counts. ``logprobs``
    has the chunk's tokens when the request asked for them. ``tool_calls`` has the pieces
    of tool calls a chat with tools streamed in this chunk.
    """

    text: str
    tokens: int
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    logprobs: tuple[TokenLogprobs, ...]
    tool_calls: tuple[ToolCallDelta, ...]

    def __init__(self, text: str, tokens: int, finish_reason: str | None = None,
                 prompt_tokens: int | None = None, completion_tokens: int | None = None,
                 *, logprobs: tuple[TokenLogprobs, ...] = (),
                 tool_calls: tuple[ToolCallDelta, ...] = ()) -> None:
        # One per streamed token: a frozen dataclass's own __init__ (object.__setattr__
        # per field) took 2.6-4.0 us here, the slots' own setters 0.8-1.5 (issue 27).
        _TEXT(self, text)
        _TOKENS(self, tokens)
        _FINISH(self, finish_reason)
        _PROMPT(self, prompt_tokens)
        _COMPLETION(self, completion_tokens)
        _LOGPROBS(self, logprobs)
        _CALLS(self, tool_calls)


_TEXT, _TOKENS, _FINISH, _PROMPT, _COMPLETION, _LOGPROBS, _CALLS = (
    Chunk.__dict__[name].__set__ for name in Chunk.__slots__)


def join_chunks(chunks: Sequence[Chunk]) -> Chunk:
    """Chunks without a finish reason that came together, as one: their texts, tokens
    and logprobs in order, their tool-call pieces joined (:func:`join_tool_deltas`)."""
    return Chunk("".join(c.text for c in chunks), sum(c.tokens for c in chunks),
                 logprobs=tuple(p for c in chunks for p in c.logprobs),
                 tool_calls=join_tool_deltas([d for c in chunks for d in c.tool_calls]))


async def sse_chunks(data: AsyncIterator[bytes], path: str, *, chat: bool, top: int | None,
                     heard: Callable[[], None], end_within: float | None = None,
                     pace: Silence | None = None) -> AsyncGenerator[Chunk, None]:
    """The chunks of one server-sent-events answer, its body's bytes ``data`` (with their
    tokens' logprobs and ``top`` alternatives each, unless ``top`` is None); ``heard``
    is called as each piece arrives (the client's activity record).

    With ``end_within`` (seconds), what follows ``data: [DONE]`` is read before the last
    chunk, up to the body's end, so that the connection can serve the next request (a
    loopback child's: see :mod:`supervisor.http._loopback`); more events, or no end within that
    time, leave it unread (the connection is then closed, as without ``end_within``).

    ``pace`` (the lean transport's stream) is told when a chunk is handed on and when the
    stream's end came (its finish reason or ``[DONE]``): the reading of ``data`` is then
    paced by the stream's interval, never before the first chunk nor after the end.

    Raises:
        ChildRequestError: a malformed event, or the child's error event (after the
            chunks that came before it).
    """
    finish: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    pending = b""
    done: bool | str = False  # "clean": [DONE] was the last of its piece
    # Bytes, split here: httpx's text and line decoders cost more per event than the
    # JSON parse itself (SSE is UTF-8, and orjson takes bytes). Measured in
    # bench/bench_generation.py: part of the added time to first token.
    # The events of one piece (what came while the consumer was busy: a relay that lags
    # behind a fast child) are yielded as one chunk, so that they cost the relay one write
    # or one message, not one each (issue 27). A child that sends one token at a time is
    # relayed token by token, without waiting for more.
    async for piece in data:
        heard()
        *lines, pending = (pending + piece).split(b"\n")
        got: list[Chunk] = []
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                # Anything after it in this piece is not an SSE stream's end.
                done = True if any(x.strip() for x in lines[i + 1:]) or pending.strip() \
                    else "clean"
                break
            try:
                event = orjson.loads(payload)
            except ValueError as exc:
                raise ChildRequestError(f"{path}: malformed stream event") from exc
            if "error" in event:
                if got:  # what came before the error is the caller's
                    yield join_chunks(got)
                raise ChildRequestError(f"{path}: {event['error']}")
            usage = event.get("usage")
            if isinstance(usage, dict):
                prompt_tokens = int_or_none(usage.get("prompt_tokens"))
                completion_tokens = int_or_none(usage.get("completion_tokens"))
            for choice in event.get("choices") or ():
                text = _choice_text(choice, chat)
                finish = choice.get("finish_reason") or finish
                calls = parse_tool_deltas((choice.get("delta") or {}).get("tool_calls")) \
                    if chat else ()
                if top is not None:
                    probs = parse_logprobs(choice.get("logprobs"), top)
                    if text or probs or calls:
                        got.append(Chunk(text, max(1, len(probs)), logprobs=probs,
                                         tool_calls=calls))
                elif text or calls:
                    got.append(Chunk(text, 1, tool_calls=calls))
        if pace is not None:
            if done or finish is not None:
                pace.ending()  # the end is never held back
            elif got:
                pace.flushed(sum(c.tokens for c in got))
        if got:
            yield got[0] if len(got) == 1 else join_chunks(got)
        if done:
            if end_within is not None and done == "clean":
                await _read_end(data, end_within)
            break
    yield Chunk("", 0, finish or "stop", prompt_tokens, completion_tokens)


async def _read_end(data: AsyncIterator[bytes], within: float) -> None:
    """Read ``data`` to its end if nothing but whitespace comes within ``within`` s."""
    try:
        async with asyncio.timeout(within):
            async for extra in data:
                if extra.strip():
                    return
    except (TimeoutError, ChildRequestError, HTTPTransportError):
        return


def _choice_text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


def int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None
