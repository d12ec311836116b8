"""What the two translated APIs (``/v1/messages`` and ``/v1/responses``) share: reading a
request as ``/v1/chat/completions`` after translating its body, and the buffer of events
an answer builds while it streams."""

from __future__ import annotations

from typing import Any

from ..grpcapi.rpc import Call
from . import _parse
from ._chat import Prepared, prepare
from ._context import Api


class EventBuffer:
    """The events an answer has built and the relay has not yet sent (none unless it
    streams)."""

    def __init__(self, *, stream: bool) -> None:
        self.stream = stream
        self.events: list[bytes] = []

    def take(self) -> bytes:
        """The events built since the last take, as one write."""
        out, self.events = b"".join(self.events), []
        return out


def prepare_translated(api: Api, call: Call, body: _parse.Body, translated: dict[str, Any],
                       route: str, *, messages_param: str) -> tuple[Prepared, bool]:
    """``translated`` (``body`` as a chat-completions body) read as
    ``/v1/chat/completions`` does, and whether ``body`` asks to stream (noted on
    ``call``)."""
    stream = _parse.streaming({"stream": body.get("stream")}).stream
    prepared = prepare(api, call, translated, route, messages_param=messages_param)
    call.note(stream=stream)
    return prepared, stream
