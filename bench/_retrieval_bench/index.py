"""The latency index of ``bench.bench_retrieval``: built by ingest or filled in bulk, timed."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._retrieval import (
    Child,
    Doc,
    Ingest,
    Vec,
    open_retriever,
    upsert_all,
)
from bench._retrieval_bench.common import TableEmbedder, proc_kb, reset_peak_rss
from retrieval import RetrievalLimits, Retriever, redact
from retrieval._ingest import content_hash
from retrieval.store._metadata import ChunkRow, DocumentRow, Store


@dataclass
class BuildResult:
    ingest: Ingest                   # the head, through Retriever.upsert
    commit_s: float                  # of which in TextIndex.commit
    bulk_docs: int
    bulk_chunks: int
    fill_s: float                    # the rest into SQLite (Store.replace_document)
    reconcile_s: float               # Retriever.open(): tantivy + hnswlib from SQLite
    repaired: dict[str, int]
    rss_before_kb: int
    rss_upserted_kb: int
    peak_kb: int
    rss_after_kb: int
    disk_bytes: int
    segments: int
    misses: int
    token_calls: int
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (chunks, seconds)


def timing_commits(r: Retriever) -> list[float]:
    """Instrument this Retriever's TextIndex.commit (the instance only): seconds per call."""
    text = r._indexes.text
    assert text is not None
    spent: list[float] = []
    commit = text.commit

    def timed_commit() -> None:
        began = time.perf_counter()
        try:
            commit()
        finally:
            spent.append(time.perf_counter() - began)

    text.commit = timed_commit  # type: ignore[method-assign]
    return spent


def segments(root: Path) -> int:
    """Segments of the tantivy index (from its meta.json)."""
    try:
        meta = json.loads((root / "bm25" / "meta.json").read_text())
    except (OSError, ValueError):
        return 0
    return len(meta.get("segments", []))


def bulk_fill(store: Store, docs: Sequence[Doc], table: Mapping[str, Vec], model: str,
              limits: RetrievalLimits) -> None:
    """What ``Retriever.upsert`` writes to SQLite for each document (same rows, same
    hashes, one ``Store.replace_document`` transaction per document), and the documents'
    vectors into the embedding cache (``Store.put_vectors``, grouped in transactions of
    1000), without touching tantivy or hnswlib: the next ``Retriever.open()`` adds what is
    missing there from SQLite (its crash-repair path), in bulk."""
    now = int(time.time())
    pending: dict[str, Vec] = {}

    def flush() -> None:
        with store._lock:
            store._db.execute("BEGIN")
            store.put_vectors(model, pending)
            store._db.execute("COMMIT")
        pending.clear()

    for d in docs:
        cleaned = redact(d.text, hostnames=limits.redact_hostnames, ips=limits.redact_ips)
        title = redact(d.title).text[:500]
        doc = DocumentRow(d.doc_id, d.source, "", title, "text", "", (),
                          content_hash(title + "\x00" + cleaned.text + "\x00text"), 0, 0,
                          "processing", "", now, sum(cleaned.counts.values()))
        rows = [ChunkRow(f"{d.doc_id}#{i}", i, "", t, content_hash(t))
                for i, t in enumerate(d.chunks, start=1)]
        store.replace_document(doc, rows)
        pending.update((row.content_hash, table[row.text]) for row in rows)
        if len(pending) >= 1000:
            flush()
    if pending:
        flush()


async def build_latency_index(docs: Sequence[Doc], table: dict[str, Vec], child: Child, *,
                              root: Path, limits: RetrievalLimits, upsert_docs: int,
                              ) -> tuple[Retriever, TableEmbedder, BuildResult]:
    """The first ``upsert_docs`` documents through ``Retriever.upsert`` (timed: that is
    the ingest path), the rest by :func:`bulk_fill` and a reopen (per-document upserts
    run at tens of documents a second, which would take most of an hour at 100k)."""
    embedder = TableEmbedder(table, child.embedder, child.embedder.model_id,
                             child.embedder.context)
    provider = lambda: embedder  # noqa: E731
    gc.collect()
    reset_peak_rss()
    before = proc_kb("VmRSS")
    r = await open_retriever(root, provider, limits, [d.source for d in docs])
    commits = timing_commits(r)
    head, tail = docs[:upsert_docs], docs[upsert_docs:]
    checkpoints: list[tuple[int, float]] = []
    step = max(250, len(head) // 8)

    def progress(n: int, chunks: int, seconds: float) -> None:
        if n % step == 0 or n == len(head):
            checkpoints.append((chunks, seconds))
            print(f"   upsert: {n} docs, {chunks} chunks, {seconds:.0f} s, "
                  f"{chunks / seconds:.0f} chunks/s", flush=True)

    ingest = await upsert_all(r, head, progress)
    upserted = proc_kb("VmRSS")
    store = r._indexes.store
    assert store is not None
    began = time.perf_counter()
    await asyncio.to_thread(bulk_fill, store, tail, table, embedder.model_id, limits)
    fill_s = time.perf_counter() - began
    print(f"   SQLite filled with {len(tail)} more documents in {fill_s:.0f} s", flush=True)
    await r.close()
    began = time.perf_counter()
    r = Retriever(root, provider, limits)
    await r.open()
    reconcile_s = time.perf_counter() - began
    print(f"   Retriever.open() reconciled in {reconcile_s:.0f} s: {r.repaired}", flush=True)
    peak = proc_kb("VmHWM")
    return r, embedder, BuildResult(
        ingest, sum(commits), len(tail), sum(len(d.chunks) for d in tail), fill_s,
        reconcile_s, dict(r.repaired), before, upserted, peak, proc_kb("VmRSS"),
        r._indexes.disk_bytes(), segments(root), embedder.misses, embedder.token_calls, checkpoints)
