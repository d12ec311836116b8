"""Response bodies in OpenAI's shapes: chat completions and their chunks (with tool
calls: ``message.tool_calls`` whole, ``delta.tool_calls`` pieces streamed), (legacy)
completions and theirs, logprobs in each route's form, usage, and the server-sent event
framing (``data: {json}\\n\\n``, then ``data: [DONE]\\n\\n``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from supervisor import TokenLogprob, TokenLogprobs, ToolCallDelta

from ..services.inference import Usage

DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


def usage_json(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


def _token(token: TokenLogprob) -> dict[str, Any]:
    return {"token": token.token, "logprob": token.logprob, "bytes": list(token.bytes)}


def chat_logprobs(entries: tuple[TokenLogprobs, ...] | list[TokenLogprobs]
                  ) -> dict[str, Any]:
    """Chat's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    return {"content": [{**_token(e.chosen), "top_logprobs": [_token(t) for t in e.top]}
                        for e in entries], "refusal": None}


def tool_call_delta(delta: ToolCallDelta) -> dict[str, Any]:
    """A streamed piece of a tool call: the first of a call has its id, type and name."""
    out: dict[str, Any] = {"index": delta.index}
    function: dict[str, Any] = {"arguments": delta.arguments}
    if delta.id or delta.name:
        out["id"] = delta.id
        out["type"] = "function"
        function = {"name": delta.name, **function}
    out["function"] = function
    return out


class ToolCalls:
    """The tool calls of a whole answer, joined from their streamed pieces by index."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, deltas: tuple[ToolCallDelta, ...]) -> None:
        for delta in deltas:
            call = self._calls.setdefault(delta.index, {"id": "", "type": "function",
                                                        "function": {"name": "",
                                                                     "arguments": ""}})
            call["id"] = call["id"] or delta.id
            function = call["function"]
            function["name"] = function["name"] or delta.name
            function["arguments"] += delta.arguments

    def json(self) -> list[dict[str, Any]]:
        """OpenAI's ``message.tool_calls``, in index order."""
        return [self._calls[i] for i in sorted(self._calls)]


class Shape:
    """The bodies of one response (one id, creation time and model for all its chunks).

    Args:
        chat: ``chat.completion`` shapes; else ``text_completion``.
        usage_in_chunks: ``stream_options.include_usage``: every chunk carries
            ``"usage": null`` and a last chunk with no choices carries the usage.
    """

    def __init__(self, model: str, *, chat: bool, usage_in_chunks: bool = False) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.usage_in_chunks = usage_in_chunks
        self._object = "chat.completion.chunk" if chat else "text_completion"
        self._role_sent = False
        self._offset = 0  # completions: text_offset of the next token
        self._frame: tuple[bytes, bytes] | None = None  # a text piece's event around its text

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": self._object,
                                "created": self.created, "model": self.model,
                                "system_fingerprint": None, "choices": [choice]}
        if self.usage_in_chunks:
            body["usage"] = None
        return body

    def piece(self, text: str, logprobs: tuple[TokenLogprobs, ...],
              finish_reason: str | None = None,
              tool_calls: tuple[ToolCallDelta, ...] = ()) -> bytes:
        """A streamed chunk: the text (the chat role in the first one), its logprobs, the
        pieces of tool calls, and the finish reason in the last."""
        if not (logprobs or tool_calls or finish_reason) and (
                not self.chat or (text and self._role_sent)):
            # Most events of a stream are text alone: the same bytes, the text put between
            # the rest of its event built once (issue 27: one per flush, on a cold process).
            frame = self._frame or self._text_frame()
            return frame[0] + orjson.dumps(text) + frame[1]
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {}
            if not self._role_sent:
                delta["role"] = "assistant"
                self._role_sent = True
            if text or "role" in delta:
                delta["content"] = text or (None if tool_calls else "")
            if tool_calls:
                delta["tool_calls"] = [tool_call_delta(d) for d in tool_calls]
            choice["delta"] = delta
            choice["logprobs"] = chat_logprobs(logprobs) if logprobs else None
        else:
            choice["text"] = text
            choice["logprobs"] = self.completion_logprobs(logprobs) if logprobs else None
        choice["finish_reason"] = finish_reason
        return sse(self._chunk(choice))

    def _text_frame(self) -> tuple[bytes, bytes]:
        """The event of a text piece (no logprobs, no tool call, not the last) before and
        after its text's JSON string."""
        mark = "\x00"  # the text's place: its last occurrence (the fields after it are fixed)
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {"content": mark}
        else:
            choice["text"] = mark
        choice["logprobs"] = None
        choice["finish_reason"] = None
        before, _, after = sse(self._chunk(choice)).rpartition(orjson.dumps(mark))
        self._frame = before, after
        return self._frame

    def usage_chunk(self, usage: Usage) -> bytes:
        body = self._chunk({})
        body["choices"] = []
        body["usage"] = usage_json(usage)
        return sse(body)

    def completion_logprobs(self, entries: tuple[TokenLogprobs, ...] | list[TokenLogprobs]
                            ) -> dict[str, Any]:
        """Legacy completions' ``logprobs``: parallel arrays of tokens, their logprobs,
        the alternatives by token, and each token's offset in the text."""
        tokens, lps, tops, offsets = [], [], [], []
        for e in entries:
            tokens.append(e.chosen.token)
            lps.append(e.chosen.logprob)
            tops.append({t.token: t.logprob for t in e.top})
            offsets.append(self._offset)
            self._offset += len(e.chosen.token)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
                "text_offset": offsets}

    def whole(self, text: str, logprobs: list[TokenLogprobs], finish_reason: str,
              usage: Usage, tool_calls: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
        """The response of a call that did not stream (chat: with ``tool_calls``, the
        content is null when the model wrote no text)."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant",
                                 "content": text or (None if tool_calls else ""),
                                 "refusal": None}
            if tool_calls:
                choice["message"]["tool_calls"] = tool_calls
            choice["logprobs"] = chat_logprobs(logprobs) if logprobs else None
        else:
            choice["text"] = text
            choice["logprobs"] = self.completion_logprobs(logprobs) if logprobs else None
        choice["finish_reason"] = finish_reason
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": None,
                "choices": [choice], "usage": usage_json(usage)}
