"""A search's reads run on threads of their own (issue 28): with asyncio's default executor
taken up by other work (an ingest's chunking, file reads and commits queue there), a
hybrid search, grouped or not, with filters and copies of a text, still completes."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrieval import Filters, Query, Retriever
from retrieval.search._reads import Reads
from tests.support.embedder import HashEmbedder, filled
from tests.support.load import patience


@pytest.fixture
async def r(tmp_path: Path) -> AsyncIterator[Retriever]:
    retriever = await filled(tmp_path, HashEmbedder("m"))
    try:
        yield retriever
    finally:
        await retriever.close()


async def test_a_search_does_not_wait_for_the_default_executor(r: Retriever) -> None:
    await r.search("disk full", k=3)  # the first search counts the indexes' sizes
    loop = asyncio.get_running_loop()
    release = threading.Event()
    # Every worker of the default executor blocked, and more work queued behind them.
    blocked = [loop.run_in_executor(None, release.wait) for _ in range(64)]
    try:
        for options in (None, Query(group_by_document=True), Query(mode="text")):
            res = await asyncio.wait_for(r.search("disk full", k=3, options=options), patience(3))
            assert res.hits
        filtered = await asyncio.wait_for(
            r.search("check", k=3, filters=Filters(sources=("docs",))), patience(3))
        assert all(h.doc_id.startswith("docs/") for h in filtered.hits)
        assert not any(f.done() for f in blocked)  # the executor was busy throughout
    finally:
        release.set()
        await asyncio.gather(*blocked)


async def test_reads_carry_the_callers_context_and_their_exceptions() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="")
    reads = Reads(2)
    try:
        var.set("caller's")
        assert await reads.run(var.get) == "caller's"
        assert threading.current_thread().name != await reads.run(
            lambda: threading.current_thread().name)
        assert (await reads.run(lambda: threading.current_thread().name)).startswith(
            "llamad-search")

        def fails() -> None:
            raise ValueError("bad read")
        with pytest.raises(ValueError, match="bad read"):
            await reads.run(fails)
    finally:
        reads.close()
