"""History retention: the background task that keeps history sources within their limits.

A history source (``kind == "history"``) holds time-ordered records, each dated
(``document_date``: the caller's, or when it was received). Its ``max_age_days`` and
``max_items`` (0: unlimited) bound it: every ``retrieval.retention_interval`` seconds (on
the retriever's clock) one pass removes, per history source, the records dated more than
``max_age_days`` before now, then the oldest beyond the newest ``max_items``, oldest
first, at most ``retrieval.retention_batch`` records in the whole pass (the rest go in
the next passes, so a pass never holds the writer lock for long).

Records are removed as a deletion removes a document: from SQLite (one transaction per
source, counted in the source's ``pruned``), then from tantivy and hnswlib, under the
writer lock; on the PostgreSQL store, in one transaction per source, every node running
passes (a record is deleted, and counted, once: :mod:`retrieval.postgres._history`).
:attr:`Retention.pruned` counts the records removed since start-up by this node (the
Status RPC's ``pruned``). A pass that removed something logs one info line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from ._interface import DocumentStore, StoreBackend
from ._limits import RetrievalLimits

_log = structlog.get_logger("llamad.retrieval")

DAY = 86_400
IDLE_CHECK = 60.0
"""Seconds between looks at the interval while retention is off (interval 0), so a
reload that turns it on applies within a minute."""


class RetentionClock(Protocol):
    """The time retention is measured by: ``supervisor.Clock`` fits (tests inject a manual
    clock, so no test sleeps for real)."""

    def wall(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep; cancellable like :func:`asyncio.sleep`."""
        ...


class SystemClock:
    """The real clock (the default)."""

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class Retention:
    """The retention passes of one retriever, and the task that runs them."""

    def __init__(self, indexes: StoreBackend, clock: RetentionClock,
                 limits: Callable[[], RetrievalLimits]) -> None:
        self._indexes = indexes
        self._clock = clock
        self._limits = limits
        self.pruned = 0                  # records removed since start-up
        self.passes = 0                  # passes completed since start-up
        self.task: asyncio.Task[None] | None = None
        self._in_pass = False
        self._stopping = False

    def start(self) -> None:
        """Start the background task (once)."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._loop(), name="history-retention")

    async def close(self) -> None:
        """Stop the task: a sleeping one at once; a pass under way after the source it is
        deleting from (its deletion, SQLite then tantivy and hnswlib, is never cut in
        the middle), which is at most ``retention_batch`` records."""
        task, self.task = self.task, None
        self._stopping = True
        if task is not None and not task.done():
            if not self._in_pass:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            interval = self._limits().retention_interval
            await self._clock.sleep(interval if interval > 0 else IDLE_CHECK)
            if self._limits().retention_interval <= 0:
                continue
            self._in_pass = True
            try:
                await self.run_once()
            except Exception as exc:  # the next pass tries again
                _log.warning("history retention failed", error=str(exc)[:200])
            finally:
                self._in_pass = False
            if self._stopping:
                return

    async def run_once(self) -> int:
        """One pass over every history source; return how many records it removed (at
        most ``retrieval.retention_batch``)."""
        store = self._indexes.require()
        budget = self._limits().retention_batch
        now = int(self._clock.wall())
        removed: dict[str, int] = {}
        for source in await asyncio.to_thread(store.sources):
            if budget <= 0 or self._stopping:
                break
            if source.kind != "history" or not (source.max_age_days or source.max_items):
                continue
            before = now - source.max_age_days * DAY if source.max_age_days else None
            ids = await asyncio.to_thread(functools.partial(
                store.expired_records, source.id, before=before, keep=source.max_items,
                limit=budget))
            if not ids:
                continue
            counted: list[int] = []
            # SQLite first, then tantivy and hnswlib, under the writer lock.
            await self._indexes.withdraw(
                functools.partial(_prune, store, source.id, ids, counted))
            deleted = sum(counted)
            budget -= deleted
            self.pruned += deleted
            if deleted:
                removed[source.id] = deleted
        self.passes += 1
        if removed:
            _log.info("history retention pruned records", records=sum(removed.values()),
                      sources=removed)
        return sum(removed.values())


def _prune(store: DocumentStore, source_id: str, ids: list[str],
           counted: list[int]) -> list[int]:
    """The store's ``prune_records`` for the backend's ``withdraw``: the chunk keys, and
    the count of deleted records appended to ``counted``."""
    deleted, keys = store.prune_records(source_id, ids)
    counted.append(deleted)
    return keys
