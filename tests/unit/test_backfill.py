"""The background backfill: chunks indexed without a vector (the embedding model was
unavailable, or failed) get one once it is back, batch by batch, resumably, visibly in
Status; a text the model refuses alone is left BM25-only and counted, never retried in a
loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from retrieval import Retriever
from tests.support.embedder import DOCS, HashEmbedder, fill


class Switchable(HashEmbedder):
    """A hash embedder that can be unavailable (the provider gives None), fail, or refuse
    any text containing ``refuse``."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.available = True
        self.failing = False
        self.refuse = ""
        self.texts = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.failing:
            raise ConnectionError("embedding child went away")
        if self.refuse and any(self.refuse in t for t in texts):
            raise ValueError("input is too large to process")
        self.texts += len(texts)
        return await super().embed(texts)


def opened(root: Path, embedder: Switchable) -> Retriever:
    return Retriever(root, lambda: embedder if embedder.available else None)


async def finished(r: Retriever) -> None:
    assert r.backfill_task is not None
    await asyncio.wait_for(r.backfill_task, 10)


async def test_documents_ingested_without_embeddings_get_vectors_when_they_return(
        tmp_path: Path) -> None:
    """Ingested while the embedding model is down: BM25-only. Once it is back, the
    backfill embeds every chunk and search is hybrid, with the counts in Status."""
    embedder = Switchable("model-a")
    embedder.available = False
    r = opened(tmp_path, embedder)
    await r.open()
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
    await r.close()


async def test_the_daemons_periodic_check_asks_in_a_thread_and_starts_a_run(
        tmp_path: Path) -> None:
    """backfill_soon (the daemon's periodic check): nothing to do without an embedder or
    with every chunk embedded; otherwise it starts the run."""
    embedder = Switchable("model-a")
    embedder.available = False
    r = opened(tmp_path, embedder)
    await r.open()
    await fill(r)
    assert not await r.backfill_soon()
    embedder.available = True
    assert await r.backfill_soon()
    await finished(r)
    assert not await r.backfill_soon()
    assert (await r.status()).vectors == 3
    await r.close()


async def test_a_search_starts_the_backfill_when_no_vectors_exist(tmp_path: Path) -> None:
    """With an embedder and no vector index yet, a search says so and starts the
    backfill; the next search after it is hybrid."""
    embedder = Switchable("model-a")
    embedder.available = False
    r = opened(tmp_path, embedder)
    await r.open()
    await fill(r)
    embedder.available = True
    first = await r.search("nginx logs disk")
    assert first.mode == "text"
    assert any("backfill" in w for w in first.warnings)
    await finished(r)
    assert (await r.search("nginx logs disk")).mode == "hybrid"
    await r.close()


async def test_chunks_that_missed_their_vector_are_added_to_the_current_index(
        tmp_path: Path) -> None:
    """With an index of the current model, only the chunks it lacks are embedded and
    added; what it has is not embedded again."""
    embedder = Switchable("model-a")
    r = opened(tmp_path, embedder)
    await r.open()
    await fill(r)
    embedder.failing = True  # the child fails: this document is indexed BM25-only
    await r.upsert("docs", "printer", "printer queue stuck on floor two", doc_id="docs/p")
    assert (await r.status()).vectors == 3
    embedder.failing = False
    texts = embedder.texts
    assert r.backfill()
    await finished(r)
    assert embedder.texts == texts + 1
    status = await r.status()
    assert (status.chunks, status.vectors) == (4, 4)
    hits = (await r.search("printer queue floor")).hits
    assert hits[0].doc_id == "docs/p"
    assert hits[0].vector_rank is not None
    await r.close()


async def test_a_text_the_model_refuses_is_counted_and_not_retried(tmp_path: Path) -> None:
    """A chunk the model refuses even alone stays BM25-only, counted in Status; the rest
    are embedded; the backfill is then not needed again until asked to retry."""
    embedder = Switchable("model-a")
    embedder.available = False
    r = opened(tmp_path, embedder)
    await r.open()
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
    await r.close()


async def test_an_interrupted_backfill_resumes_without_embedding_twice(tmp_path: Path) -> None:
    """When the embedding model goes away mid-run, the run stops with the reason in
    Status; what it embedded stays cached, and the next run embeds only the rest."""
    embedder = Switchable("model-a")
    embedder.available = False
    r = Retriever(tmp_path, lambda: embedder if embedder.available else None)
    r.limits = r.limits.__class__(**{**r.limits.__dict__, "embed_batch": 1})
    await r.open()
    await fill(r)
    embedder.available = True
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
    texts = embedder.texts
    assert r.backfill()
    await finished(r)
    assert embedder.texts == texts + 1  # only the chunk the first run did not reach
    assert (await r.status()).vectors == len(DOCS)
    await r.close()
