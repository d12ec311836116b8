"""What a search did: how much each list searched, how many candidates it gave, and how
long each stage took (``SearchResponse.stats``).

The sizes searched (entries in the text index, vectors in the vector index: the serving
model's) are the store's cheap sizes (``StoreBackend.sizes``: the embedded store's
tantivy and HNSW counts in memory; PostgreSQL's live-row statistics, counted exactly
below 50,000 rows), never its status (counts over every chunk, a walk of the index
directory). Read at most every :data:`SIZES_EVERY` seconds, in the background (the
first search of a retriever waits for the first), so a figure may be that many seconds
old.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .._interface import StoreBackend

SIZES_EVERY = 10.0
"""Seconds between two counts of the indexes' sizes."""


@dataclass
class SearchStats:
    """How much a search searched and how long it took (milliseconds by stage)."""

    text_chunks: int = 0        # chunks the text index holds (what its list ranked)
    vector_chunks: int = 0      # vectors the vector index holds (the serving model's)
    text_depth: int = 0         # candidates asked of each list (0: the list did not run)
    vector_depth: int = 0
    text_candidates: int = 0    # candidates each list gave
    vector_candidates: int = 0
    fused: int = 0              # candidates after fusion (and grouping by document)
    stages_ms: dict[str, float] = field(default_factory=dict)
    """``filters``, ``text``, ``embed``, ``vector``, ``fuse``, ``fetch``, ``total``: the
    stages that ran (the text list runs beside the query embedding and the vector list,
    so the stages add up to more than the total)."""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.stages_ms[name] = round(
                self.stages_ms.get(name, 0.0) + (time.perf_counter() - began) * 1000, 3)


class IndexSizes:
    """The indexes' sizes, counted at most every :data:`SIZES_EVERY` seconds."""

    def __init__(self, indexes: StoreBackend) -> None:
        self._indexes = indexes
        self._sizes: tuple[int, int] | None = None
        self._at = -SIZES_EVERY
        self._task: asyncio.Task[None] | None = None

    async def get(self) -> tuple[int, int]:
        """``(chunks, vectors)``: the last count, a new one started in the background when
        that is older than :data:`SIZES_EVERY`; awaited only when there is none yet."""
        now = time.monotonic()
        if now - self._at >= SIZES_EVERY and (self._task is None or self._task.done()):
            self._at = now
            self._task = asyncio.create_task(self._count())
        if self._sizes is None and self._task is not None:
            await asyncio.shield(self._task)
        return self._sizes or (0, 0)

    async def _count(self) -> None:
        with contextlib.suppress(Exception):  # informational: a failed count keeps the last
            self._sizes = await self._indexes.sizes()
