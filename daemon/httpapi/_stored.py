"""Stored responses of ``POST /v1/responses``, for ``previous_response_id``: kept in
memory, bounded in number (``http.responses_stored``, the oldest dropped first) and in
age (``http.responses_ttl``), and lost with the daemon.

What is kept is the conversation a response ended: its input as chat messages (without
the request's ``instructions``, which OpenAI does not carry over either) and its output
as the assistant's message, so a call naming it continues from there. Each entry holds at
most one request's text (``limits.max_prompt_chars``) and its output, so the memory is
bounded by ``responses_stored`` times that. A response is continued only with the token
that created it: to another token (or once dropped) its id is unknown.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class _Entry:
    owner: str
    messages: Messages
    expires: float


class ResponseStore:
    """At most ``max_entries`` conversations, each for ``ttl`` seconds.

    Args:
        max_entries: how many are kept (0: none; :attr:`enabled` is False).
        ttl: seconds one can be continued after it was stored.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, max_entries: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response_id: str, owner: str, messages: Messages) -> None:
        """Keep ``messages`` as ``response_id``'s conversation, for ``owner`` (a token's
        fingerprint; "" when no tokens are configured); drops the oldest past the bound."""
        if not self.enabled:
            return
        self._expire()
        while len(self._entries) >= self.max_entries:
            self._entries.popitem(last=False)
        self._entries[response_id] = _Entry(owner, messages, self._clock() + self.ttl)

    def get(self, response_id: str, owner: str) -> Messages | None:
        """``response_id``'s conversation (a copy of its list), or None: never stored,
        expired, dropped, or stored for another owner."""
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return None
        return list(entry.messages)

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.expires > now:  # stored in order, each with the same ttl
                return
            self._entries.popitem(last=False)
