"""Response cache: identical re-asks within a TTL cost no generation.

Keyed on (generation model identity, prompt SHA-256): the same prompt to the same model.
Bounded by entries (LRU) and by time.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str


class ResponseCache:
    def __init__(self, ttl: float, max_entries: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._items: collections.OrderedDict[tuple[str, str], tuple[float, CachedAnswer]] = (
            collections.OrderedDict())

    def get(self, model: str, prompt_sha256: str) -> CachedAnswer | None:
        if self._ttl <= 0 or self._max <= 0:
            return None
        key = (model, prompt_sha256)
        item = self._items.get(key)
        if item is None:
            return None
        stored, answer = item
        if self._clock() - stored > self._ttl:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return answer

    def put(self, model: str, prompt_sha256: str, answer: CachedAnswer) -> None:
        if self._ttl <= 0 or self._max <= 0:
            return
        key = (model, prompt_sha256)
        self._items[key] = (self._clock(), answer)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
