"""The background backfill: chunks indexed without a vector (the embedding model was
unavailable, or failed) get one once it is back, batch by batch, resumably, visibly in
Status; a text the model refuses alone is left BM25-only and counted, never retried in a
loop. The scenarios are tests/support/backfill.py's, shared with the PostgreSQL store's
tests (tests/integration/test_pg_backfill.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrieval import RetrievalLimits, Retriever
from tests.support import backfill
from tests.support.backfill import Switchable, finished
from tests.support.embedder import fill


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[Retriever, Switchable]]:
    embedder = Switchable("model-a")
    r = Retriever(tmp_path, embedder.provider)
    await r.open()
    try:
        yield r, embedder
    finally:
        await r.close()


async def test_documents_ingested_without_embeddings_get_vectors_when_they_return(
        opened: tuple[Retriever, Switchable]) -> None:
    """Ingested while the embedding model is down: BM25-only. Once it is back, the
    backfill embeds every chunk and search is hybrid, with the counts in Status."""
    await backfill.vectors_when_back(*opened)


async def test_the_daemons_periodic_check_asks_in_a_thread_and_starts_a_run(
        opened: tuple[Retriever, Switchable]) -> None:
    """backfill_soon (the daemon's periodic check): nothing to do without an embedder or
    with every chunk embedded; otherwise it starts the run."""
    await backfill.periodic_check(*opened)


async def test_a_search_starts_the_backfill_when_no_vectors_exist(
        opened: tuple[Retriever, Switchable]) -> None:
    """With an embedder and no vector index yet, a search says so and starts the
    backfill; the next search after it is hybrid."""
    r, embedder = opened
    embedder.available = False
    await fill(r)
    embedder.available = True
    first = await r.search("nginx logs disk")
    assert first.mode == "text"
    assert any("backfill" in w for w in first.warnings)
    await finished(r, 10)
    assert (await r.search("nginx logs disk")).mode == "hybrid"


async def test_chunks_that_missed_their_vector_are_added_to_the_current_index(
        opened: tuple[Retriever, Switchable]) -> None:
    """With an index of the current model, only the chunks it lacks are embedded and
    added; what it has is not embedded again."""
    await backfill.missed_vectors_added(*opened)


async def test_a_text_the_model_refuses_is_counted_and_not_retried(
        opened: tuple[Retriever, Switchable]) -> None:
    """A chunk the model refuses even alone stays BM25-only, counted in Status; the rest
    are embedded; the backfill is then not needed again until asked to retry."""
    await backfill.refused_text_counted(*opened)


async def test_an_interrupted_backfill_resumes_without_embedding_twice(tmp_path: Path) -> None:
    """When the embedding model goes away mid-run, the run stops with the reason in
    Status; what it embedded stays cached, and the next run embeds only the rest."""
    embedder = Switchable("model-a")
    r = Retriever(tmp_path, embedder.provider, RetrievalLimits(embed_batch=1))
    await r.open()
    try:
        await backfill.interrupted_run_resumes(r, embedder)
    finally:
        await r.close()
