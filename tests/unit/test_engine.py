"""The retriever's orchestration with a deterministic embedder: model changes rebuild the
vector index in the background; reconciliation repairs derived indexes from SQLite."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from retrieval import Retriever
from tests.support.embedder import DOCS, HashEmbedder, fill, filled
from tests.support.load import patience


async def test_embedding_model_change_rebuilds_vectors_in_background(tmp_path: Path) -> None:
    """After a model change search is BM25-only (and says why) until the rebuild ends,
    then hybrid again with every chunk, including ones written during the rebuild."""
    current: list[HashEmbedder] = [HashEmbedder("model-a")]
    r = Retriever(tmp_path, lambda: current[0])  # the model changes below
    await r.open()
    await fill(r)
    assert (await r.search("nginx logs disk")).mode == "hybrid"
    current[0] = HashEmbedder("model-b")
    during = await r.search("nginx logs disk")
    assert during.mode == "text"
    assert any("being rebuilt for embedding model model-b" in w for w in during.warnings)
    await r.upsert("docs", "new", "printer queue stuck on floor two", doc_id="docs/new")
    assert r.backfill_task is not None
    await asyncio.wait_for(r.backfill_task, patience(10))
    after = await r.search("nginx logs disk")
    assert after.mode == "hybrid"
    assert after.hits[0].doc_id == "docs/disk"
    assert (await r.status()).vectors == 4
    assert (await r.status()).embedding_model == "model-b"
    await r.close()


async def test_unchanged_text_is_never_embedded_twice(tmp_path: Path) -> None:
    """Re-upserting the same content is a no-op; moving text to a new id reuses the cache."""
    embedder = HashEmbedder("model-a")
    r = await filled(tmp_path, embedder)
    calls = embedder.calls
    await fill(r)
    assert embedder.calls == calls
    await r.upsert("docs", "disk copy", DOCS["disk"], doc_id="docs/disk-copy")
    assert embedder.calls == calls  # same chunk text: served from the embedding cache
    await r.close()


async def test_reopen_repairs_derived_indexes_from_sqlite(tmp_path: Path) -> None:
    """A lost BM25 index and a stale vector index are rebuilt from SQLite at open."""
    embedder = HashEmbedder("model-a")
    r = await filled(tmp_path, embedder)
    await r.close()
    shutil.rmtree(tmp_path / "bm25")
    (tmp_path / "vectors.hnsw").unlink()
    (tmp_path / "vectors.hnsw.json").unlink()
    again = Retriever(tmp_path, lambda: embedder)
    await again.open()
    assert again.repaired["text_added"] == 3
    assert again.repaired.get("vectors_added") == 3
    result = await again.search("replication lag")
    assert result.mode == "hybrid"
    assert result.hits[0].doc_id == "docs/db"
    await again.close()
