"""Rebuilding and repairing the derived indexes holds one page of chunks at a time: the
Python memory they peak at stays flat as the corpus grows (issue 16; all at once, 100k
chunks held about 1 GB)."""

from __future__ import annotations

import asyncio
import shutil
import tracemalloc
from pathlib import Path

import pytest

from retrieval import RetrievalLimits, Retriever
from retrieval.store import _indexes
from tests.support.embedder import HashEmbedder

SECTION = "Paragraph {i}: the nginx access log of web{i:03d} grew past its quota, " \
    "rotate it with logrotate, then check the disk with df -h and the journal size. " * 8


async def corpus(root: Path, docs: int) -> Retriever:
    """``docs`` documents of 20 sections, chunked into about 1 kB pieces."""
    r = Retriever(root, lambda: HashEmbedder("m"),
                  RetrievalLimits(chunk_size=1000, chunk_overlap=0, max_chunk_chars=1200))
    await r.open()
    await r.add_source("docs")
    for d in range(docs):
        text = "\n\n".join(SECTION.format(i=d * 20 + i) for i in range(20))
        await r.upsert("docs", f"doc {d}", text, doc_id=f"docs/{d}")
    return r


def peak_of_reopen(root: Path) -> tuple[int, int]:
    """Drop both derived indexes, reopen: (chunks, peak Python bytes of the repair)."""
    shutil.rmtree(root / "bm25")
    for name in ("vectors.hnsw", "vectors.hnsw.json"):
        (root / name).unlink()
    indexes = _indexes.Indexes(root)
    tracemalloc.start()
    try:
        indexes.open_sync()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    chunks = indexes.store.counts()["chunks"] if indexes.store else 0
    indexes.close_sync()
    return chunks, peak


async def test_repair_memory_is_flat_as_the_corpus_grows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rebuilding tantivy and hnswlib from SQLite holds pages of chunks (64 here), never
    the whole corpus: for each chunk more, the peak grows by its key's bookkeeping (a few
    hundred bytes in the key sets), not by its 1 kB of text and its vector (the
    all-at-once repair grew about 2.6 kB per chunk here)."""
    monkeypatch.setattr(_indexes, "PAGE", 64)
    peaks, sizes = {}, {}
    for docs in (10, 40):
        r = await corpus(tmp_path / str(docs), docs)
        await r.close()
        sizes[docs], peaks[docs] = await asyncio.to_thread(
            peak_of_reopen, tmp_path / str(docs))
    assert sizes[40] == 4 * sizes[10] > 200
    per_chunk = (peaks[40] - peaks[10]) / (sizes[40] - sizes[10])
    assert per_chunk < 600, (peaks, sizes)
