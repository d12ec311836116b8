"""The threads a search's reads run on.

A search reads its indexes and store in worker threads (tantivy, hnswlib, SQLite or
PostgreSQL calls block). On asyncio's default executor those reads queued behind an
ingest's thread work (each document's chunking, file reads, the group commits' batches:
up to ``retrieval.ingest_workers`` documents in flight), so an interactive search waited
in a FIFO behind background work, the priority inversion the lanes remove for the
embedding child (bench/RESULTS.md, "Lanes": Search's filters, text and fetch stages grew
from 0-1 ms idle to 7-39 ms at p95 under an ingest). A search's reads get threads of their
own (``retrieval.search_threads``); they still share the cores and the interpreter with
the ingest, but never its queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Reads:
    """A small thread pool for a search's blocking reads (:meth:`run`, as
    ``asyncio.to_thread``: the caller's context variables go with the call)."""

    def __init__(self, threads: int) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, threads), thread_name_prefix="llamad-search")

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on one of the search threads."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._pool, call)

    def close(self) -> None:
        """Let the reads under way finish in the background; take no more."""
        self._pool.shutdown(wait=False, cancel_futures=True)
