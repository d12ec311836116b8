"""The backfill's behaviour both stores share, run by tests/unit/test_backfill.py on the
embedded store and tests/integration/test_pg_backfill.py on PostgreSQL: an embedder that can
be made unavailable, failing, refusing or held (:class:`Switchable`), and each shared
scenario as a coroutine on an opened retriever, whose assertions are the same on both (the
test adds what only its store has)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from retrieval import Embedder, Retriever, SearchResult
from tests.support.embedder import DOCS, HashEmbedder, fill


class Switchable(HashEmbedder):
    """A hash embedder that can be unavailable (the provider gives None), fail, refuse any
    text containing ``refuse``, or hold its batches after the first ``free`` until ``gate``
    opens; it records the texts it embedded."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.available = True
        self.failing = False
        self.refuse = ""
        self.gate: asyncio.Event | None = None
        self.free = 0
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.gate is not None:
            if self.free <= 0:
                await self.gate.wait()
            self.free -= 1
        if self.failing:
            raise ConnectionError("embedding child went away")
        if self.refuse and any(self.refuse in t for t in texts):
            raise ValueError("input is too large to process")
        self.texts.extend(texts)
        return await super().embed(texts)

    def provider(self) -> Embedder | None:
        return self if self.available else None


async def finished(r: Retriever, timeout: float = 30) -> None:
    """Wait for the backfill run ``r`` has started."""
    assert r.backfill_task is not None
    await asyncio.wait_for(r.backfill_task, timeout)


async def filled_without_vectors(r: Retriever, embedder: Switchable) -> None:
    """Index the corpus while ``embedder`` is unavailable (BM25-only), then make it
    available again (the backfill has every chunk to embed)."""
    embedder.available = False
    await fill(r)
    embedder.available = True


async def vectors_when_back(r: Retriever, embedder: Switchable) -> SearchResult:
    """Ingested while the embedding model is down: BM25-only; once it is back, the backfill
    embeds every chunk, one run at a time, and search is hybrid, with the counts in
    Status. Returns that hybrid search's result."""
    embedder.available = False
    await fill(r)
    before = await r.status()
    assert (before.chunks, before.vectors, before.embedded_chunks) == (3, 0, 0)
    assert not r.backfill()  # nothing to embed with
    embedder.available = True
    assert r.backfill()
    assert not r.backfill()  # one run at a time
    await finished(r)
    after = await r.status()
    assert (after.vectors, after.embedded_chunks, after.embedding_model) == (3, 3, "model-a")
    assert (after.backfill.done, after.backfill.pending, after.backfill.failed) == (3, 0, 0)
    assert not after.backfill.running
    result = await r.search("nginx logs disk")
    assert result.mode == "hybrid"
    assert result.hits[0].vector_rank is not None
    assert not r.backfill()  # nothing left
    return result


async def periodic_check(r: Retriever, embedder: Switchable) -> None:
    """backfill_soon (the daemon's periodic check) has nothing to do without an embedder or
    with every chunk embedded; otherwise it starts the run."""
    embedder.available = False
    await fill(r)
    assert not await r.backfill_soon()
    embedder.available = True
    assert await r.backfill_soon()
    await finished(r)
    assert not await r.backfill_soon()
    assert (await r.status()).vectors == 3


async def missed_vectors_added(r: Retriever, embedder: Switchable) -> None:
    """With vectors of the current model, only the chunks without one are embedded."""
    await fill(r)
    embedder.failing = True  # the child fails: this document is indexed BM25-only
    await r.upsert("docs", "printer", "printer queue stuck on floor two", doc_id="docs/p")
    assert (await r.status()).vectors == 3
    embedder.failing = False
    texts = len(embedder.texts)
    assert r.backfill()
    await finished(r)
    assert embedder.texts[texts:] == ["printer queue stuck on floor two"]
    status = await r.status()
    assert (status.chunks, status.vectors) == (4, 4)
    hits = (await r.search("printer queue floor")).hits
    assert hits[0].doc_id == "docs/p"
    assert hits[0].vector_rank is not None


async def refused_text_counted(r: Retriever, embedder: Switchable) -> None:
    """A chunk the model refuses even alone stays BM25-only, counted in Status; the rest
    are embedded; the backfill is not needed again until asked to retry."""
    embedder.available = False
    await fill(r)
    embedder.available, embedder.refuse = True, "replication"
    assert r.backfill()
    await finished(r)
    status = await r.status()
    assert (status.vectors, status.backfill.failed) == (2, 1)
    assert not r.backfill()
    embedder.refuse = ""
    assert r.backfill(retry_failed=True)
    await finished(r)
    assert (await r.status()).vectors == 3


async def interrupted_run_resumes(r: Retriever, embedder: Switchable) -> None:
    """The embedding model going away mid-run (``r`` embeds one chunk a batch) stops the
    run with the reason in Status; what it stored stays, and the next run embeds only the
    rest."""
    await filled_without_vectors(r, embedder)
    calls = 0
    original = embedder.embed

    async def two_then_gone(texts: Sequence[str]) -> list[list[float]]:
        nonlocal calls
        calls += 1
        if calls > 2:
            embedder.available = False
            raise ConnectionError("embedding child went away")
        return await original(texts)

    embedder.embed = two_then_gone  # type: ignore[method-assign]
    assert r.backfill()
    await finished(r)
    status = await r.status()
    assert "unavailable" in status.backfill.last_error
    assert status.vectors == 2  # the first vectors made the index; both are in it
    embedder.embed = original  # type: ignore[method-assign]
    embedder.available = True
    texts = len(embedder.texts)
    assert r.backfill()
    await finished(r)
    assert len(embedder.texts) == texts + 1  # only the chunk the first run did not reach
    assert (await r.status()).vectors == len(DOCS)
