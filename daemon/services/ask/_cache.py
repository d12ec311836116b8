"""Response cache: identical re-asks within a TTL cost no generation.

Keyed on everything that decides the answer: the generation model's identity, the
prompt's SHA-256, and the sampling parameters in a canonical form
(:func:`sampling_key`) — the same prompt to the same model with other settings (a
temperature, a seed, a penalty, DRY, a shorter max_tokens) is generated again, never
answered with text that other settings produced. Bounded by entries (LRU) and by time.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from supervisor import Sampling


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str


def sampling_key(sampling: Sampling) -> str:
    """A canonical digest of every field of ``sampling``: equal for equal parameters,
    different when any field differs (an unset field, None, differs from any value)."""
    canonical = orjson.dumps(dataclasses.asdict(sampling), option=orjson.OPT_SORT_KEYS,
                             default=_plain)
    return hashlib.sha256(canonical).hexdigest()


def _plain(value: object) -> object:
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} in Sampling has no canonical form")


class ResponseCache:
    """Answers by (model identity, prompt SHA-256, :func:`sampling_key`), LRU and TTL
    bounded; a TTL or size of 0 turns the cache off."""

    def __init__(self, ttl: float, max_entries: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._items: collections.OrderedDict[tuple[str, str, str],
                                             tuple[float, CachedAnswer]] = (
            collections.OrderedDict())

    def get(self, model: str, prompt_sha256: str, sampling: Sampling) -> CachedAnswer | None:
        """The answer stored for this model, prompt and sampling, if still fresh."""
        if self._ttl <= 0 or self._max <= 0:
            return None
        key = (model, prompt_sha256, sampling_key(sampling))
        item = self._items.get(key)
        if item is None:
            return None
        stored, answer = item
        if self._clock() - stored > self._ttl:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return answer

    def put(self, model: str, prompt_sha256: str, sampling: Sampling,
            answer: CachedAnswer) -> None:
        """Store ``answer``, evicting the least recently used past the size bound."""
        if self._ttl <= 0 or self._max <= 0:
            return
        key = (model, prompt_sha256, sampling_key(sampling))
        self._items[key] = (self._clock(), answer)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
