"""Retrieval benchmark: quality, latency and ingest throughput of llamad's ``Retriever``.

    .venv/bin/python -m bench.bench_retrieval [--smoke]
        [--collections cisi,cranfield,medline,vaswani] [--data DIR]
        [--latency-chunks 100000] [--hnsw-vectors 1000000] [--hnsw-budget 450]
        [--embed-budget 1140] [--live-docs 600] [--bm25-docs 2000] [--upsert-docs 2000]
        [--rounds 2] [--slow-queries 40] [--out bench/RESULTS.md] [--raw FILE]
        [--workdir DIR] [--wait SECONDS]

One process, one embedding child, in this order:

1. **Embedding child.** An in-process :class:`daemon.Daemon` (127.0.0.1:0, generation
   child and RetrievalService disabled) runs the embedding child on llama-server with
   production defaults (2 threads, 2 slots, 512-token context); the bench embeds through
   the daemon's own ``ChildEmbedder`` (from ``make_provider``).
2. **Real embeddings.** Every distinct chunk text of every collection (the chunks the
   Retriever will make: ``redact`` then ``chunk_text`` with the Retriever's limits) and
   every query, in batches of ``embed_batch`` (32) through ChildEmbedder.
3. **Ingest with live embeddings** (``--live-docs`` documents sampled across the
   collections): the same chunk texts sent straight to the child (``POST
   /v1/embeddings``, httpx, the body llamad sends) in batches of 32; ``Retriever.upsert``
   with ``ingest_workers`` (4) documents in flight, as a directory scan runs them (their
   commits grouped), against the live child (fresh index, empty vector cache); the
   texts straight to the child again in the per-document batches the Retriever sends.
4. **Quality.** Per collection, a fresh Retriever (own directory: BM25 statistics are per
   collection); each corpus document is one ``upsert`` (kind ``text``, the corpus title),
   its vectors served from step 2 by text (a miss would go to the live child, and is
   counted); token counts from the live child. BM25 alone = ``TextIndex.search``,
   vectors alone = ``VectorIndex.search``, hybrid = ``Retriever.search`` (default limits:
   25/25 candidates, RRF k=60; and 100/100 for recall@100). Chunk hits map to corpus ids,
   a document keeping its best rank. nDCG@10 (linear graded gains, log2 discount),
   recall@100. An RRF k x depth sweep is computed offline from the depth-100 candidate
   lists with ``retrieval._fusion.rrf`` (checked equal to ``Retriever.search`` at 25/25).
5. **Synthetic documents** to reach ``--latency-chunks``: see :func:`synthetic_docs`. The
   first of them are embedded for real for what is left of ``--embed-budget`` seconds
   (step 2 counts against it); the rest get ``normalise(e(a) + e(b))`` of their halves.
6. **BM25-only ingest** (no embedder) of the first ``--bm25-docs`` documents, fresh index.
7. **The latency index**: the first ``--upsert-docs`` documents through
   ``Retriever.upsert`` (vectors from the table, token counts from the live child), the
   rest written to SQLite as upsert writes them and indexed by ``Retriever.open()``'s
   reconciliation (see :func:`bulk_fill`; per-document upserts are too slow for 100k).
   Peak RSS (``VmHWM`` after resetting it through ``/proc/self/clear_refs``).
8. **Latency** (daemon stopped): ``TextIndex.search`` (25), ``VectorIndex.search`` (25)
   and ``Retriever.search`` (k=10, query vector looked up, so no embedding time), one
   warm-up pass then ``--rounds`` passes over all queries; HNSW recall@10 against exact
   search; bm25s, rank_bm25 and numpy brute force over the same chunks.
9. **HNSW at scale**: a ``VectorIndex`` filled in batches to ``--hnsw-vectors`` (the
   latency vectors, then mixtures of two real embeddings plus Gaussian noise) until
   ``--hnsw-budget`` seconds of building are spent; latency, recall@10, numpy brute force.

Before starting it waits (``--wait``) while ``pgrep -fa 'bench\\.'`` shows another
benchmark, and it notes the load and any other benchmark before every stage.

Results are printed and written into ``--out``: the sections ``## Retrieval quality``,
``## Retrieval latency`` and ``## Ingest throughput`` are created or replaced, others kept.
Needs ``rank_bm25`` and ``bm25s`` (``pip install rank_bm25 bm25s``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from bench._retrieval import (
    COLLECTIONS,
    DATA_DIR,
    Child,
    Collection,
    Doc,
    Ingest,
    LiveIngest,
    Query,
    Vec,
    live_ingest,
    load_collection,
    open_retriever,
    predict_chunks,
    start_child,
    upsert_all,
)
from bench._support import (
    ROOT,
    bench_parser,
    cpu_model,
    f3,
    foreign_benchmarks,
    table,
    version_of,
    write_sections,
)
from daemon import logs
from daemon.retrieval_service import ChildEmbedder
from retrieval import Filters, RetrievalLimits, Retriever, redact
from retrieval._fusion import rrf
from retrieval._ingest import content_hash
from retrieval._store import ChunkRow, DocumentRow, Store
from retrieval._vectors import VectorIndex
from tests.support.embedder import FixedEmbedder

Mat = npt.NDArray[np.float32]

DIM = 384

QUALITY_HEADING = "## Retrieval quality"
LATENCY_HEADING = "## Retrieval latency"
INGEST_HEADING = "## Ingest throughput"

# BM25 nDCG@10 from each collection's README ("BM25 sanity check": tantivy 0.27.0, one
# title + text field, en_stem, parse_query_lenient, sanitized query text).
README_BM25 = {"cisi": 0.3082, "cranfield": 0.3677, "medline": 0.7038, "vaswani": 0.4385}

DEEP = 100            # candidates per side for recall@100
HYBRID_K = 10         # hits asked of Retriever.search in the latency runs
SEARCH_N = 25         # candidates per side the Retriever asks for by default
SWEEP_K = (1, 5, 10, 20, 30, 60, 100, 200)
SWEEP_DEPTH = (10, 25, 50, 100)
MIX_NOISE = 0.05      # norm of the Gaussian perturbation of the 1M-scale mixtures
WORD = re.compile(r"\w+")


# -- data -------------------------------------------------------------------------------


def synthetic_docs(originals: Sequence[Doc], count: int, limits: RetrievalLimits,
                   seed: int = 20240601) -> list[Doc]:
    """``count`` new one-chunk documents, each the concatenation of two different original
    one-chunk documents ``a`` and ``b`` (``a.text + " " + b.text``, title of ``a``), both
    short enough that the pair stays one chunk. Pairs are drawn at random (seeded), never
    repeated."""
    half = (limits.chunk_size - 1) // 2
    pool = [d for d in originals if len(d.chunks) == 1 and len(d.text) <= half]
    if len(pool) < 2:
        raise SystemExit("too few short documents to build synthetic ones")
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, int]] = set()
    out: list[Doc] = []
    while len(out) < count:
        i, j = (int(x) for x in rng.integers(0, len(pool), 2))
        if i == j or (i, j) in seen:
            continue
        seen.add((i, j))
        a, b = pool[i], pool[j]
        text = a.text + " " + b.text
        chunks = predict_chunks(text, limits)
        if len(chunks) != 1:
            continue
        out.append(Doc("synth", str(len(out) + 1), a.title, text, chunks,
                       (a.chunks[0], b.chunks[0])))
    return out


def normalise(v: Mat) -> Mat:
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    out: Mat = (v / np.maximum(norms, 1e-12)).astype(np.float32)
    return out


# -- the embedding child ----------------------------------------------------------------


async def embed_batched(embedder: ChildEmbedder, texts: Sequence[str], batch: int,
                        deadline: float | None = None) -> tuple[dict[str, Vec], list[str], float]:
    """Embed ``texts`` through ChildEmbedder in batches, until done or ``deadline``
    (perf_counter). A failing batch is retried one text at a time; texts that still fail
    (too long for the model) are returned. Returns (vectors, failed, seconds)."""
    out: dict[str, Vec] = {}
    failed: list[str] = []
    began = time.perf_counter()
    todo = list(dict.fromkeys(texts))
    for i in range(0, len(todo), batch):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        part = todo[i:i + batch]
        try:
            vectors = await embedder.embed(part)
        except Exception:
            for text in part:
                try:
                    out[text] = np.asarray((await embedder.embed([text]))[0], dtype=np.float32)
                except Exception:
                    failed.append(text)
            continue
        out.update((t, np.asarray(v, dtype=np.float32))
                   for t, v in zip(part, vectors, strict=True))
    return out, failed, time.perf_counter() - began


class TableEmbedder(FixedEmbedder):
    """The ``retrieval.Embedder`` the bench hands the Retriever: vectors looked up by text
    in a table filled by the real model (batched, beforehand); a text not in the table
    goes to the live child (counted in ``misses``); token counts come from the live child
    (as in production)."""

    def __init__(self, table: dict[str, Vec], live: ChildEmbedder | None, model_id: str,
                 context: int) -> None:
        super().__init__(model_id, context)
        self.table = table
        self.live = live
        self.misses = 0
        self.token_calls = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            if self.live is None:
                raise RuntimeError(f"{len(missing)} texts have no vector")
            self.misses += len(missing)
            vectors = await self.live.embed(missing)
            self.table.update((t, np.asarray(v, dtype=np.float32))
                              for t, v in zip(missing, vectors, strict=True))
        return [self.table[t].tolist() for t in texts]

    async def count_tokens(self, text: str) -> int:
        self.token_calls += 1
        if self.live is None:
            return len(text) // 3
        return await self.live.count_tokens(text)


# -- machine state ----------------------------------------------------------------------


@dataclass
class StageNote:
    stage: str
    load: tuple[float, float, float]
    foreign: list[str]


NOTES: list[StageNote] = []


def stage(name: str) -> None:
    """Note the load and any other benchmark before a timed stage (and say so)."""
    foreign = foreign_benchmarks()
    load1, load5, load15 = os.getloadavg()
    NOTES.append(StageNote(name, (load1, load5, load15), foreign))
    print(f"\n== {name} (load {load1:.2f} {load5:.2f} {load15:.2f})", flush=True)
    for line in foreign:
        print(f"   WARNING: another benchmark is running: {line}", flush=True)


def wait_quiet(limit: float) -> None:
    deadline = time.monotonic() + limit
    while (foreign := foreign_benchmarks()) and time.monotonic() < deadline:
        print(f"waiting for other benchmarks to finish: {foreign}", flush=True)
        time.sleep(15)
    if foreign_benchmarks():
        raise SystemExit("other benchmarks are still running; not measuring")


def proc_kb(field_name: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: ``5`` to ``/proc/self/clear_refs``)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# -- metrics ----------------------------------------------------------------------------


def doc_ranking(keys: Iterable[int], doc_of: Mapping[int, str]) -> list[str]:
    """Corpus ids in order of their best chunk."""
    seen: dict[str, None] = {}
    for key in keys:
        doc = doc_of.get(key)
        if doc is not None:
            seen.setdefault(doc, None)
    return list(seen)


def ndcg(ranked: Sequence[str], rels: Mapping[str, int], k: int = 10) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall(ranked: Sequence[str], rels: Mapping[str, int], k: int = 100) -> float:
    relevant = {d for d, g in rels.items() if g > 0}
    return len(relevant.intersection(ranked[:k])) / len(relevant) if relevant else 0.0


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(seconds: Sequence[float]) -> dict[str, float]:
    return {"n": float(len(seconds)), "p50_ms": pct(seconds, 0.5) * 1000,
            "p99_ms": pct(seconds, 0.99) * 1000, "mean_ms": statistics.fmean(seconds) * 1000}


def timed(fn: Callable[[int], object], n: int, rounds: int) -> list[float]:
    """Seconds per call of ``fn(i)`` for i in range(n), ``rounds`` passes after a warm-up."""
    for i in range(n):
        fn(i)
    out = []
    for _ in range(rounds):
        for i in range(n):
            began = time.perf_counter()
            fn(i)
            out.append(time.perf_counter() - began)
    return out


def exact_top(matrix: Mat, queries: Mat, k: int, block: int = 65536) -> npt.NDArray[np.int64]:
    """Row indices of the k largest inner products per query (exact; blocked)."""
    best_idx = np.zeros((len(queries), 0), dtype=np.int64)
    best_sim = np.zeros((len(queries), 0), dtype=np.float32)
    for start in range(0, len(matrix), block):
        sims = queries @ matrix[start:start + block].T
        kk = min(k, sims.shape[1])
        part = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        cand_sim = np.concatenate([best_sim, np.take_along_axis(sims, part, axis=1)], axis=1)
        cand_idx = np.concatenate([best_idx, part + start], axis=1)
        keep = np.argsort(-cand_sim, axis=1, kind="stable")[:, :k]
        best_sim = np.take_along_axis(cand_sim, keep, axis=1)
        best_idx = np.take_along_axis(cand_idx, keep, axis=1)
    return best_idx


def brute_force(matrix: Mat, query: Vec, k: int) -> npt.NDArray[np.int64]:
    """What a user would write: cosine over unit rows, top k."""
    sims = matrix @ query
    top = np.argpartition(-sims, k - 1)[:k]
    out: npt.NDArray[np.int64] = top[np.argsort(-sims[top])]
    return out


# -- stages -----------------------------------------------------------------------------


# -- stages -----------------------------------------------------------------------------



def chunk_docs(r: Retriever) -> tuple[dict[int, str], dict[int, str]]:
    """key -> corpus id, key -> chunk text, from SQLite."""
    store = r._indexes.store
    assert store is not None
    doc_of: dict[int, str] = {}
    text_of: dict[int, str] = {}
    for batch in store.iter_chunks():
        for c in batch:
            doc_of[c.key] = c.doc_id.split("/", 1)[1]
            text_of[c.key] = c.text
    return doc_of, text_of


@dataclass
class QualityRow:
    name: str
    docs: int
    chunks: int
    queries: int
    skipped_docs: int
    ingest: Ingest
    misses: int
    no_query_vector: int
    long_queries: int
    ndcg: dict[str, float]
    recall: dict[str, float]
    sweep: dict[str, float]           # "k=60,d=25" -> mean nDCG@10
    crosscheck_mismatch: int


async def quality(col: Collection, table: dict[str, Vec], child: Child, workdir: Path,
                  limits: RetrievalLimits) -> QualityRow:
    embedder = TableEmbedder(table, child.embedder, child.embedder.model_id,
                             child.embedder.context)
    r = await open_retriever(workdir / "quality" / col.name, lambda: embedder, limits,
                             [col.name])
    ingest = await upsert_all(r, col.docs)
    doc_of, _ = chunk_docs(r)
    text_index, vectors = r._indexes.text, r._indexes.vectors
    assert text_index is not None
    assert vectors is not None
    deep = dataclasses.replace(limits, text_candidates=DEEP, vector_candidates=DEEP,
                               max_k=2 * DEEP)
    ndcgs: dict[str, list[float]] = {m: [] for m in ("bm25", "vectors", "hybrid25",
                                                     "hybrid100")}
    recalls: dict[str, list[float]] = {m: [] for m in ("bm25", "vectors", "hybrid100")}
    sweep: dict[str, list[float]] = {}
    mismatch = no_vector = 0
    for q in col.queries:
        rels = col.qrels[q.id]
        text_keys = [k for k, _ in text_index.search(q.text, filters=Filters(), limit=DEEP)]
        qv = table.get(q.text)
        vec_keys = [k for k, _ in vectors.search(qv, DEEP)] if qv is not None else []
        no_vector += qv is None
        r.limits = limits
        res25 = await r.search(q.text, k=limits.max_k)
        r.limits = deep
        res100 = await r.search(q.text, k=2 * DEEP)
        r.limits = limits
        bm25 = doc_ranking(text_keys, doc_of)
        vec = doc_ranking(vec_keys, doc_of)
        h25 = list(dict.fromkeys(h.doc_id.split("/", 1)[1] for h in res25.hits))
        h100 = list(dict.fromkeys(h.doc_id.split("/", 1)[1] for h in res100.hits))
        offline = doc_ranking([k for k, _ in rrf([text_keys[:SEARCH_N], vec_keys[:SEARCH_N]],
                                                  k=limits.rrf_k)][:limits.max_k], doc_of)
        mismatch += offline != h25
        ndcgs["bm25"].append(ndcg(bm25, rels))
        ndcgs["vectors"].append(ndcg(vec, rels))
        ndcgs["hybrid25"].append(ndcg(h25, rels))
        ndcgs["hybrid100"].append(ndcg(h100, rels))
        recalls["bm25"].append(recall(bm25, rels))
        recalls["vectors"].append(recall(vec, rels))
        recalls["hybrid100"].append(recall(h100, rels))
        for rk in SWEEP_K:
            for depth in SWEEP_DEPTH:
                fused = rrf([text_keys[:depth], vec_keys[:depth]], k=rk)
                sweep.setdefault(f"k={rk},d={depth}", []).append(
                    ndcg(doc_ranking([k for k, _ in fused], doc_of), rels))
    store = r._indexes.store
    assert store is not None
    chunks = store.counts().get("chunks", 0)
    await r.close()
    return QualityRow(
        col.name, len(col.docs), int(chunks), len(col.queries), len(col.skipped), ingest,
        embedder.misses, no_vector, sum(len(q.text) > limits.max_query_chars
                                        for q in col.queries),
        {m: statistics.fmean(v) for m, v in ndcgs.items()},
        {m: statistics.fmean(v) for m, v in recalls.items()},
        {m: statistics.fmean(v) for m, v in sweep.items()}, mismatch)



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


@dataclass
class Latency:
    chunks: int
    queries: int
    rounds: int
    results: dict[str, dict[str, float]]      # name -> summary
    recall10: float
    recall25: float
    notes: dict[str, str]
    builds: dict[str, float]                  # baseline index build seconds


def bm25_corpus(r: Retriever, keys: Sequence[int]) -> list[str]:
    """title + heading + text per chunk, as tantivy's ``body`` field holds it."""
    store = r._indexes.store
    assert store is not None
    chunks = store.chunks_by_keys(keys)
    return ["\n".join(p for p in (chunks[k].title, chunks[k].heading, chunks[k].text) if p)
            for k in keys]


async def measure_latency(r: Retriever, embedder: TableEmbedder, queries: Sequence[Query],
                          qvecs: Mat, *, rounds: int, slow_queries: int) -> Latency:
    text_index, vectors, store = r._indexes.text, r._indexes.vectors, r._indexes.store
    assert text_index is not None
    assert vectors is not None
    assert store is not None
    _, text_of = chunk_docs(r)
    keys = sorted(text_of)
    matrix = normalise(np.stack([embedder.table[text_of[k]] for k in keys]))
    qtexts = [q.text for q in queries]
    n = len(queries)
    results: dict[str, dict[str, float]] = {}
    no_filter = Filters()

    stage(f"latency at {len(keys)} chunks: BM25 (TextIndex.search, limit {SEARCH_N})")
    results["bm25"] = summary(timed(
        lambda i: text_index.search(qtexts[i], filters=no_filter, limit=SEARCH_N), n, rounds))
    stage(f"latency: HNSW (VectorIndex.search, k {SEARCH_N}, ef {vectors.ef_search})")
    results["hnsw"] = summary(timed(lambda i: vectors.search(qvecs[i], SEARCH_N), n, rounds))

    stage(f"latency: hybrid (Retriever.search, k {HYBRID_K}, {SEARCH_N}+{SEARCH_N} "
          "candidates, RRF, SQLite hydration)")
    embedder.live = None   # query vectors come from the table: no embedding time
    for q in qtexts:
        await r.search(q, k=HYBRID_K)
    hybrid: list[float] = []
    modes: set[str] = set()
    for _ in range(rounds):
        for q in qtexts:
            began = time.perf_counter()
            res = await r.search(q, k=HYBRID_K)
            hybrid.append(time.perf_counter() - began)
            modes.add(res.mode)
    results["hybrid"] = summary(hybrid)

    stage("HNSW recall@10 and @25 against exact search")
    exact = exact_top(matrix, qvecs, SEARCH_N)
    hit10 = hit25 = 0
    for i in range(n):
        got10 = {k for k, _ in vectors.search(qvecs[i], 10)}
        got25 = {k for k, _ in vectors.search(qvecs[i], SEARCH_N)}
        hit10 += len(got10 & {keys[j] for j in exact[i, :10]})
        hit25 += len(got25 & {keys[j] for j in exact[i, :SEARCH_N]})
    recall10, recall25 = hit10 / (10 * n), hit25 / (SEARCH_N * n)

    stage("baseline: numpy brute-force cosine")
    results["numpy"] = summary(timed(lambda i: brute_force(matrix, qvecs[i], SEARCH_N),
                                     n, rounds))
    builds: dict[str, float] = {}
    corpus = bm25_corpus(r, keys)
    notes = {"hybrid_modes": ",".join(sorted(modes))}

    stage("baseline: bm25s")
    results["bm25s"], builds["bm25s"] = bm25s_baseline(corpus, qtexts, rounds)
    step = max(1, n // slow_queries)
    picked = [qtexts[i] for i in range(0, n, step)][:slow_queries]
    stage(f"baseline: rank_bm25 BM25Okapi ({len(picked)} queries, 1 round)")
    results["rank_bm25"], builds["rank_bm25"] = rank_bm25_baseline(corpus, picked)
    # The same queries through tantivy, for a like-for-like ratio.
    results["bm25_same_queries"] = summary(timed(
        lambda i: text_index.search(picked[i], filters=no_filter, limit=SEARCH_N),
        len(picked), rounds))
    gc.collect()
    return Latency(len(keys), n, rounds, results, recall10, recall25, notes, builds)


def bm25s_baseline(corpus: Sequence[str], queries: Sequence[str],
                   rounds: int) -> tuple[dict[str, float], float]:
    """bm25s as its README shows it (English stopwords, no stemmer): latency, build s."""
    import bm25s  # type: ignore[import-untyped]

    began = time.perf_counter()
    index = bm25s.BM25()
    index.index(bm25s.tokenize(list(corpus), stopwords="en", show_progress=False),
                show_progress=False)
    build = time.perf_counter() - began

    def query(i: int) -> object:
        tokens = bm25s.tokenize([queries[i]], stopwords="en", return_ids=False,
                                show_progress=False)
        if not tokens[0]:
            return None
        return index.retrieve(tokens, k=SEARCH_N, show_progress=False, n_threads=0)

    return summary(timed(query, len(queries), rounds)), build


def rank_bm25_baseline(corpus: Sequence[str],
                       queries: Sequence[str]) -> tuple[dict[str, float], float]:
    """rank_bm25's BM25Okapi over lower-cased words, top 25 by argpartition: latency
    (one pass after a warm-up pass), build s."""
    from rank_bm25 import BM25Okapi  # type: ignore[import-untyped]

    began = time.perf_counter()
    okapi = BM25Okapi([WORD.findall(t.lower()) for t in corpus])
    build = time.perf_counter() - began

    def query(i: int) -> object:
        scores = okapi.get_scores(WORD.findall(queries[i].lower()))
        top = np.argpartition(-scores, SEARCH_N - 1)[:SEARCH_N]
        return top[np.argsort(-scores[top])]

    return summary(timed(query, len(queries), 1)), build


@dataclass
class ScaleResult:
    target: int
    built: int
    build_s: float
    rss_before_kb: int
    peak_kb: int
    batch_rates: list[tuple[int, float]]
    results: dict[str, dict[str, float]]
    recall10: float
    recall25: float
    numpy_queries: int


def hnsw_at_scale(base: Mat, pool: Mat, qvecs: Mat, *, target: int, budget: float,
                  rounds: int, root: Path, batch: int = 25_000, seed: int = 7) -> ScaleResult:
    """Fill a VectorIndex to ``target`` vectors: ``base`` first, then mixtures
    ``normalise(a*x + (1-a)*y + noise)`` of two random real embeddings x, y of ``pool``,
    a ~ U(0.25, 0.75), noise Gaussian with norm ~MIX_NOISE. Stops adding once ``budget``
    seconds of building are spent."""
    rng = np.random.default_rng(seed)
    matrix = np.empty((target, DIM), dtype=np.float32)
    gc.collect()
    reset_peak_rss()
    before = proc_kb("VmRSS")
    index = VectorIndex(root / "vectors.hnsw", DIM)
    built = 0
    spent = 0.0
    rates: list[tuple[int, float]] = []
    while built < target and spent < budget:
        n = min(batch, target - built)
        if built < len(base):
            n = min(n, len(base) - built)
            rows = base[built:built + n]
        else:
            x = pool[rng.integers(0, len(pool), n)]
            y = pool[rng.integers(0, len(pool), n)]
            a = rng.uniform(0.25, 0.75, (n, 1)).astype(np.float32)
            noise = rng.standard_normal((n, DIM)).astype(np.float32) * (MIX_NOISE / DIM**0.5)
            rows = normalise(a * x + (1 - a) * y + noise)
        matrix[built:built + n] = rows
        began = time.perf_counter()
        index.add(list(range(built, built + n)), rows)
        took = time.perf_counter() - began
        spent += took
        built += n
        rates.append((built, n / took))
        print(f"   {built} vectors, {spent:.0f} s building, {n / took:.0f} vectors/s",
              flush=True)
    peak = proc_kb("VmHWM")
    matrix = matrix[:built]
    n = len(qvecs)
    results = {"hnsw": summary(timed(lambda i: index.search(qvecs[i], SEARCH_N), n, rounds))}
    exact = exact_top(matrix, qvecs, SEARCH_N)
    hit10 = hit25 = 0
    for i in range(n):
        hit10 += len({k for k, _ in index.search(qvecs[i], 10)} & set(exact[i, :10].tolist()))
        hit25 += len({k for k, _ in index.search(qvecs[i], SEARCH_N)}
                     & set(exact[i, :SEARCH_N].tolist()))
    nq = min(n, 100)
    results["numpy"] = summary(timed(lambda i: brute_force(matrix, qvecs[i], SEARCH_N),
                                     nq, 1))
    return ScaleResult(target, built, spent, before, peak, rates, results,
                       hit10 / (10 * n), hit25 / (SEARCH_N * n), nq)


# -- report -----------------------------------------------------------------------------


def source() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "retrieval", "daemon",
                                "supervisor"], cwd=ROOT, check=True, capture_output=True,
                               text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "(no git)"
    if not dirty:
        return rev
    mine = [line[3:] for line in dirty if line[3:].startswith("retrieval/")]
    return (f"{rev} + uncommitted changes ({', '.join(mine) or 'none'} in retrieval/; "
            f"{len(dirty) - len(mine)} files in daemon/ and supervisor/)")


def ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def mb(kb: int) -> str:
    return f"{kb / 1024:.0f} MB"


def environment(command: str, child: list[str]) -> list[str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = "; ".join(f"{n.stage.split(':')[0]} {n.load[0]:.2f}" for n in NOTES[:1] + NOTES[-1:])
    foreign = sorted({line for n in NOTES for line in n.foreign})
    return [
        f"- Date: {now}; llamad {source()}",
        f"- Machine: {os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, "
        f"Python {platform.python_version()}; tantivy {version_of('tantivy')}, hnswlib "
        f"{version_of('hnswlib')}, numpy {version_of('numpy')}, bm25s {version_of('bm25s')}, "
        f"rank_bm25 {version_of('rank_bm25')}",
        f"- 1-minute load at the first and last stage: {loads}; other benchmarks seen "
        f"during the run: {', '.join(foreign) if foreign else 'none'}",
        f"- Embedding child (llamad's production defaults): `{' '.join(child)}`",
        f"- Command: `{command}`",
    ]


def quality_section(rows: Sequence[QualityRow], env: list[str], limits: RetrievalLimits,
                    embed_note: str) -> list[str]:
    out = [QUALITY_HEADING, "", *env, f"- {embed_note}", ""]
    body = []
    for r in rows:
        body.append([r.name, f"{r.docs} / {r.chunks}", str(r.queries),
                     f3(README_BM25.get(r.name, float("nan"))), f3(r.ndcg["bm25"]),
                     f3(r.ndcg["vectors"]), f3(r.ndcg["hybrid25"]), f3(r.ndcg["hybrid100"]),
                     f3(r.recall["bm25"]), f3(r.recall["vectors"]), f3(r.recall["hybrid100"])])
    if rows:
        mean = {m: statistics.fmean(r.ndcg[m] for r in rows) for m in rows[0].ndcg}
        rmean = {m: statistics.fmean(r.recall[m] for r in rows) for m in rows[0].recall}
        body.append(["**mean**", "", "", "", f3(mean["bm25"]), f3(mean["vectors"]),
                     f"**{f3(mean['hybrid25'])}**", f3(mean["hybrid100"]),
                     f3(rmean["bm25"]), f3(rmean["vectors"]), f3(rmean["hybrid100"])])
    out += table(["collection", "docs / chunks", "queries", "README BM25 nDCG@10",
                  "BM25 nDCG@10", "vectors nDCG@10", "hybrid 25/25 nDCG@10",
                  "hybrid 100/100 nDCG@10", "BM25 R@100", "vectors R@100",
                  "hybrid 100/100 R@100"], body)
    if not rows:
        return out
    best_single = max(mean["bm25"], mean["vectors"])
    verdict = ("beats" if mean["hybrid25"] > best_single else "does **not** beat")
    out += ["", f"Hybrid (default 25/25, RRF k={limits.rrf_k}) {verdict} the better single "
            f"method on the mean over collections: {f3(mean['hybrid25'])} against "
            f"{f3(best_single)} ({'BM25' if mean['bm25'] >= mean['vectors'] else 'vectors'}); "
            "per collection: " + ", ".join(
                f"{r.name} {r.ndcg['hybrid25'] - max(r.ndcg['bm25'], r.ndcg['vectors']):+.3f}"
                for r in rows) + "."]
    out += ["", "nDCG@10 of RRF over the same depth-100 candidate lists, mean over the "
            "collections (rows: RRF k, columns: candidates per side; offline with "
            "`retrieval._fusion.rrf`):", ""]
    sweep_rows = []
    for rk in SWEEP_K:
        sweep_rows.append([str(rk)] + [
            f3(statistics.fmean(r.sweep[f"k={rk},d={d}"] for r in rows)) for d in SWEEP_DEPTH])
    out += table(["RRF k", *(f"{d}/{d}" for d in SWEEP_DEPTH)], sweep_rows)
    best = []
    for r in rows:
        cell = max(r.sweep, key=r.sweep.__getitem__)
        best.append(f"{r.name} {cell} {f3(r.sweep[cell])} (default k=60,d=25: "
                    f"{f3(r.sweep['k=60,d=25'])})")
    out += ["", "Per collection, best cell of the sweep: " + "; ".join(best) + "."]
    notes = []
    skipped = {r.name: r.skipped_docs for r in rows if r.skipped_docs}
    if skipped:
        notes.append(f"empty corpus documents not indexed (the Retriever refuses empty "
                     f"text; no qrel points at them): {skipped}")
    long_q = {r.name: r.long_queries for r in rows if r.long_queries}
    if long_q:
        notes.append(f"queries longer than the default max_query_chars "
                     f"({limits.max_query_chars}), which the bench raises to 5000 so they "
                     f"are scored unchanged: {long_q}")
    noq = {r.name: r.no_query_vector for r in rows if r.no_query_vector}
    if noq:
        notes.append(f"queries the embedding child could not embed (over its 512-token "
                     f"context; vectors alone score 0 and hybrid is BM25-only): {noq}")
    misses = sum(r.misses for r in rows)
    mism = sum(r.crosscheck_mismatch for r in rows)
    notes.append(f"vectors embedded live during ingest because the bench's chunk "
                 f"prediction missed them: {misses}; queries where Retriever.search and "
                 f"offline RRF over the same candidates disagree: {mism}")
    out += ["", *(f"- {n}" for n in notes)]
    return out


def latency_section(lat: Latency | None, scale: ScaleResult | None, env: list[str],
                    data_note: list[str]) -> list[str]:
    out = [LATENCY_HEADING, "", *env, *data_note, ""]
    if lat is not None:
        res = lat.results
        rows = []
        names = {
            "bm25": "BM25: TextIndex.search (tantivy), 25",
            "hnsw": "HNSW: VectorIndex.search (hnswlib, ef 100), 25",
            "hybrid": f"hybrid: Retriever.search k={HYBRID_K} (25+25, RRF, SQLite, snippets)",
            "numpy": "numpy brute-force cosine, 25",
            "bm25s": "bm25s 0.3 (numpy backend, stopwords en), 25",
            "rank_bm25": "rank_bm25 BM25Okapi, 25",
            "bm25_same_queries": "tantivy on the rank_bm25 query subset, 25",
        }
        for key, label in names.items():
            if key not in res:
                continue
            s = res[key]
            target = ""
            if key in ("bm25", "hnsw", "hybrid"):
                ok = s["p50_ms"] <= 10 and s["p99_ms"] <= 30
                target = "meets" if ok else "**misses**"
            rows.append([label, str(int(s["n"])), ms(s["p50_ms"]), ms(s["p99_ms"]),
                         ms(s["mean_ms"]), target])
        out += [f"At {lat.chunks} chunks, {lat.queries} queries x {lat.rounds} rounds after "
                "a warm-up pass (target p50 <= 10 ms, p99 <= 30 ms):", ""]
        out += table(["search", "samples", "p50 ms", "p99 ms", "mean ms", "target"], rows)
        ratio = []
        pairs = [("bm25s", "bm25"), ("rank_bm25", "bm25_same_queries"), ("numpy", "hnsw")]
        for base, ours in pairs:
            if base in res and ours in res:
                ratio.append(f"{base} p50 / {ours.replace('_same_queries', '')} p50 = "
                             f"{res[base]['p50_ms'] / res[ours]['p50_ms']:.1f}x")
        out += ["", "Baselines over the same chunks (title + text, as tantivy's body "
                f"field): {'; '.join(ratio)}. Index build: "
                + ", ".join(f"{k} {v:.1f} s" for k, v in lat.builds.items()) + ".", "",
                f"HNSW recall against exact search at the default ef (100): "
                f"recall@10 {lat.recall10:.4f} (target >= 0.97), recall@25 "
                f"{lat.recall25:.4f}."]
    if scale is not None:
        r = scale.results
        out += ["", f"HNSW alone at {scale.built} vectors"
                + (f" (asked {scale.target}; building stopped at the time budget)"
                   if scale.built < scale.target else "") + ":", ""]
        out += table(["search", "samples", "p50 ms", "p99 ms", "mean ms"], [
            [f"VectorIndex.search, k {SEARCH_N}", str(int(r['hnsw']['n'])),
             ms(r["hnsw"]["p50_ms"]), ms(r["hnsw"]["p99_ms"]), ms(r["hnsw"]["mean_ms"])],
            [f"numpy brute force ({scale.numpy_queries} queries, 1 round)",
             str(int(r['numpy']['n'])), ms(r["numpy"]["p50_ms"]), ms(r["numpy"]["p99_ms"]),
             ms(r["numpy"]["mean_ms"])]])
        last = scale.batch_rates[-1][1] if scale.batch_rates else 0.0
        out += ["", f"Recall@10 {scale.recall10:.4f}, recall@25 {scale.recall25:.4f} "
                f"against exact search. Build: {scale.built} vectors in {scale.build_s:.0f} s "
                f"(VectorIndex.add in batches of 25k, hnswlib's 2 threads; last batch "
                f"{last:.0f} vectors/s); peak RSS {mb(scale.peak_kb - scale.rss_before_kb)} "
                f"over the {mb(scale.rss_before_kb)} before (includes the bench's own "
                f"{scale.built * DIM * 4 / 2**20:.0f} MB copy of the vectors). numpy brute "
                f"force p50 / HNSW p50 = {r['numpy']['p50_ms'] / r['hnsw']['p50_ms']:.0f}x."]
    return out


def ingest_section(live: LiveIngest | None, bm25: Ingest | None, build: BuildResult | None,
                   *, embed_rate: str, env: list[str], limits: RetrievalLimits) -> list[str]:
    out = [INGEST_HEADING, "", *env, ""]
    rows = []

    def row(label: str, i: Ingest) -> list[str]:
        return [label, str(i.docs), str(i.chunks), f"{i.seconds:.1f}", f"{i.rate:.1f}",
                f"{1000 * i.seconds / i.docs:.1f}",
                f"{1000 * i.commit_s / i.docs:.1f}" if i.commit_s else ""]

    if bm25 is not None:
        rows.append(row("BM25 only (no embedder), fresh index", bm25))
    if build is not None:
        i = dataclasses.replace(build.ingest, commit_s=build.commit_s)
        rows.append(row("BM25 + vectors, vectors precomputed (first documents of the "
                        "latency index)", i))
    if live is not None:
        rows.append(row("BM25 + vectors, live embedding child, fresh index",
                        Ingest(live.docs, live.chunks, live.retriever_s)))
        rows.append([f"child alone: POST /v1/embeddings, batches of {limits.embed_batch}", "",
                     str(live.chunks), f"{live.direct32_s:.1f}",
                     f"{live.chunks / live.direct32_s:.1f}", "", ""])
        rows.append(["child alone: one request per document (the Retriever's batches)", "",
                     str(live.chunks), f"{live.direct_perdoc_s:.1f}",
                     f"{live.chunks / live.direct_perdoc_s:.1f}", "", ""])
    out += [f"All through `Retriever.upsert` (kind text) with {limits.ingest_workers} "
            "documents in flight, as a directory scan runs them (concurrent upserts share "
            "one SQLite transaction and one tantivy commit), unless marked \"child alone\":",
            ""]
    out += table(["path", "docs", "chunks", "seconds", "chunks/s", "ms/doc",
                  "of which TextIndex.commit, ms/doc"], rows)
    if live is not None:
        frac = live.direct32_s / live.retriever_s
        frac_doc = live.direct_perdoc_s / live.retriever_s
        out += ["", f"With live embeddings the Retriever reaches **{frac:.2f}** of the child's "
                f"own throughput at batches of {limits.embed_batch} (target >= 0.9), and "
                f"{frac_doc:.2f} of the child's throughput with the batches the Retriever "
                f"actually sends (one document's chunks: {live.chunks / live.docs:.2f} "
                f"chunks per document here). The Retriever also made {live.token_calls} "
                f"/tokenize calls (one per chunk over 510 characters: the embedding-context "
                f"check). The child alone: {live.direct32_tokens} tokens, "
                f"{live.direct32_tokens / live.direct32_s:.0f} tokens/s at batches of "
                f"{limits.embed_batch}. {embed_rate}"]
    if bm25 is not None:
        out += ["", f"BM25-only index after {bm25.docs} upserts: {bm25.segments} tantivy "
                "segments."]
    if build is not None:
        total = build.ingest.chunks + build.bulk_chunks
        grow = build.peak_kb - build.rss_before_kb
        held = build.rss_after_kb - build.rss_before_kb
        cps = build.checkpoints
        trend = ""
        if len(cps) >= 2:
            (c0, s0), (c1, s1) = cps[0], cps[-1]
            prev_c, prev_s = cps[-2]
            trend = (f" Upsert rate over the first {c0} chunks {c0 / s0:.0f} chunks/s, over "
                     f"the last {c1 - prev_c} {(c1 - prev_c) / (s1 - prev_s):.0f} chunks/s.")
        out += ["", f"Latency index, {total} chunks: {build.ingest.docs} documents by upsert, "
                f"then {build.bulk_docs} documents ({build.bulk_chunks} chunks) written to "
                f"SQLite as upsert writes them ({build.fill_s:.0f} s) and indexed by "
                f"`Retriever.open()` reconciling tantivy and hnswlib from SQLite in bulk "
                f"(**{build.reconcile_s:.0f} s, {build.bulk_chunks / build.reconcile_s:.0f} "
                f"chunks/s**; repaired {build.repaired}). Memory: peak RSS grew by "
                f"{mb(grow)} over the {mb(build.rss_before_kb)} the process held before "
                f"(the reconcile pass holds every missing chunk at once), "
                f"**{mb(int(grow * 100_000 / max(1, total)))} per 100k chunks**; the open "
                f"index holds {mb(held)} ({mb(int(held * 100_000 / max(1, total)))} per 100k "
                f"chunks). On disk {build.disk_bytes / 2**20:.0f} MB, {build.segments} "
                f"tantivy segments. /tokenize calls during the upserts {build.token_calls}; "
                f"vectors not in the table {build.misses}.{trend}"]
    return out


# -- main -------------------------------------------------------------------------------


SMOKE = {"collections": "medline,cisi", "latency_chunks": 6000, "hnsw_vectors": 30000,
         "hnsw_budget": 60.0, "embed_budget": 150.0, "live_docs": 60, "bm25_docs": 500,
         "upsert_docs": 500, "rounds": 1, "slow_queries": 10}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.bench_retrieval", __doc__)
    p.add_argument("--smoke", action="store_true",
                   help="small sizes for a quick check: " + ", ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    p.add_argument("--collections", default=",".join(COLLECTIONS))
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--latency-chunks", type=int, default=100_000)
    p.add_argument("--hnsw-vectors", type=int, default=1_000_000,
                   help="vectors for the HNSW-only scale test (0: skip)")
    p.add_argument("--hnsw-budget", type=float, default=450.0,
                   help="seconds of HNSW building at most for the scale test")
    p.add_argument("--embed-budget", type=float, default=1140.0,
                   help="seconds of real embedding (collections first, then synthetic texts)")
    p.add_argument("--live-docs", type=int, default=600,
                   help="documents ingested against the live embedding child")
    p.add_argument("--bm25-docs", type=int, default=2000,
                   help="documents ingested BM25-only")
    p.add_argument("--upsert-docs", type=int, default=2000,
                   help="documents of the latency index ingested by Retriever.upsert (the "
                   "rest: SQLite rows + Retriever.open() reconciliation)")
    p.add_argument("--rounds", type=int, default=2, help="timed passes over the queries")
    p.add_argument("--slow-queries", type=int, default=40,
                   help="queries for rank_bm25 (about 1 s each at 100k chunks)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--raw", type=Path, default=None, help="also write raw results (JSON)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="index directory (default: a temporary one, removed afterwards)")
    p.add_argument("--wait", type=float, default=1800.0,
                   help="seconds to wait for other benchmarks to finish before starting")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    if args.upsert_docs < 1:
        p.error("--upsert-docs must be >= 1 (the first upsert creates the vector index)")
    unknown = set(args.collections.split(",")) - set(COLLECTIONS)
    if unknown:
        p.error(f"unknown collections: {sorted(unknown)}")
    return args


@contextlib.contextmanager
def workdir_for(args: argparse.Namespace) -> Iterator[Path]:
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            raise SystemExit(f"--workdir {args.workdir} is not empty")
        yield args.workdir
        return
    with tempfile.TemporaryDirectory(prefix="llamad-bench-retrieval-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def daemon_log(path: Path) -> Iterator[TextIO]:
    with path.open("w") as fh:
        logs.configure("json", "info", stream=fh)
        yield fh


async def run(args: argparse.Namespace, command: str, work: Path) -> dict[str, Any]:
    began = time.perf_counter()
    limits = RetrievalLimits(max_query_chars=5000)
    names = args.collections.split(",")
    cols = [load_collection(args.data / n, n, limits) for n in names]
    originals = [d for c in cols for d in c.docs]
    queries = [q for c in cols for q in c.queries]
    print(f"{len(originals)} documents, {sum(len(d.chunks) for d in originals)} chunks, "
          f"{len(queries)} queries", flush=True)

    child = await start_child(work)
    print(f"embedding child pid {child.pid}: {' '.join(child.argv)}", flush=True)
    raw: dict[str, Any] = {"command": command, "child_argv": child.argv}
    try:
        stage("real embeddings: every collection chunk and query, batches of 32, "
              "through ChildEmbedder")
        texts = [t for d in originals for t in d.chunks]
        table, failed, took = await embed_batched(child.embedder, texts, limits.embed_batch)
        qtable, qfailed, qtook = await embed_batched(child.embedder, [q.text for q in queries],
                                                     limits.embed_batch)
        table.update(qtable)
        n_texts = len(set(texts))
        embed_rate = (f"Through ChildEmbedder (llamad's path), batches of "
                      f"{limits.embed_batch}: {n_texts} distinct collection chunks in "
                      f"{took:.0f} s ({n_texts / took:.1f} chunks/s).")
        print(f"   {embed_rate} Failed: {len(failed)} chunks, {len(qfailed)} queries",
              flush=True)
        raw["embed"] = {"chunks": n_texts, "seconds": took, "queries_seconds": qtook,
                        "failed_chunks": len(failed), "failed_queries": len(qfailed)}

        live: LiveIngest | None = None
        if args.live_docs:
            stage(f"ingest with the live embedding child ({args.live_docs} documents)")
            step = max(1, len(originals) // args.live_docs)
            sample = originals[::step][:args.live_docs]
            live = await live_ingest(sample, child, work, limits)
            raw["live_ingest"] = dataclasses.asdict(live)

        stage("quality: ingest and search, per collection")
        rows = []
        for col in cols:
            row = await quality(col, table, child, work, limits)
            rows.append(row)
            print(f"   {col.name}: ingest {row.ingest.rate:.0f} chunks/s; nDCG@10 "
                  + ", ".join(f"{k} {v:.3f}" for k, v in row.ndcg.items())
                  + "; R@100 " + ", ".join(f"{k} {v:.3f}" for k, v in row.recall.items()),
                  flush=True)
        raw["quality"] = [dataclasses.asdict(r) for r in rows]

        # Documents of the latency index: the originals, then synthetic pairs.
        n_orig_chunks = sum(len(d.chunks) for d in originals)
        docs: list[Doc] = []
        chunks = 0
        for d in originals:
            if chunks >= args.latency_chunks:
                break
            docs.append(d)
            chunks += len(d.chunks)
        synth = synthetic_docs(originals, max(0, args.latency_chunks - chunks), limits)
        docs += synth
        real_synth_texts: list[str] = []
        embed_total = took + qtook   # seconds of embedding so far, against the budget
        if synth and embed_total < args.embed_budget:
            left = args.embed_budget - embed_total
            stage(f"real embeddings of synthetic documents, {left:.0f} s left of the "
                  "embedding budget")
            extra, _, extra_s = await embed_batched(
                child.embedder, [d.chunks[0] for d in synth], limits.embed_batch,
                time.perf_counter() + left)
            embed_total += extra_s
            table.update(extra)
            real_synth_texts = [d.chunks[0] for d in synth if d.chunks[0] in extra]
            real_synth = len(real_synth_texts)
            print(f"   {real_synth} synthetic chunks embedded in {extra_s:.0f} s", flush=True)
        agreement: list[float] = []
        for d in synth:
            assert d.parts is not None
            mix = normalise(table[d.parts[0]] + table[d.parts[1]])
            if d.chunks[0] in table:
                agreement.append(float(mix @ normalise(table[d.chunks[0]])))
            else:
                table[d.chunks[0]] = mix
        data_note = [
            f"- Latency index: {len(docs)} documents, {chunks + len(synth)} chunks: the "
            f"{len(originals)} documents of {', '.join(names)} ({n_orig_chunks} chunks; "
            f"{len(docs) - len(synth)} of them used), then {len(synth)} synthetic one-chunk "
            "documents, each two different short originals joined (`a.text + ' ' + b.text`, "
            "title of a, pairs drawn at random without repetition; see `synthetic_docs`).",
            f"- Vectors: real embeddings (the model via ChildEmbedder) for every original "
            f"chunk and for the first {len(real_synth_texts)} synthetic chunks "
            f"({embed_total / 60:.0f} minutes of the {args.embed_budget / 60:.0f}-minute "
            f"embedding budget, collections included); each other synthetic chunk gets "
            f"normalise(e(a) + e(b)) of its two halves' real embeddings. On the "
            f"{len(agreement)} synthetic chunks that have both, "
            f"cosine(real, normalise(e(a)+e(b))) is "
            + (f"mean {statistics.fmean(agreement):.3f}, 5th percentile "
               f"{pct(agreement, 0.05):.3f}." if agreement else "not measured."),
            f"- Queries: the {len(queries)} queries of the collections (real embeddings; "
            "a query that could not be embedded is skipped in vector timings).",
        ]
        raw["latency_data"] = data_note

        bm25_only: Ingest | None = None
        if args.bm25_docs:
            stage(f"BM25-only ingest ({min(args.bm25_docs, len(docs))} documents)")
            r0 = await open_retriever(work / "bm25only", lambda: None, limits,
                                      [d.source for d in docs[:args.bm25_docs]])
            commits = timing_commits(r0)
            bm25_only = await upsert_all(r0, docs[:args.bm25_docs])
            await r0.close()
            bm25_only.commit_s = sum(commits)
            bm25_only.segments = segments(work / "bm25only")
            print(f"   {bm25_only.rate:.0f} chunks/s; TextIndex.commit "
                  f"{1000 * bm25_only.commit_s / bm25_only.docs:.1f} ms/doc of "
                  f"{1000 * bm25_only.seconds / bm25_only.docs:.1f}", flush=True)
            raw["bm25_ingest"] = dataclasses.asdict(bm25_only)

        stage(f"build the latency index ({len(docs)} documents; the first "
              f"{min(args.upsert_docs, len(docs))} through Retriever.upsert)")
        r, embedder, build = await build_latency_index(
            docs, table, child, root=work / "latency", limits=limits,
            upsert_docs=args.upsert_docs)
        raw["build"] = dataclasses.asdict(build)
        child_peak = proc_kb("VmHWM", child.pid)
    finally:
        await child.daemon.shutdown()
    raw["child_peak_kb"] = child_peak

    vq = [q for q in queries if q.text in table]
    qvecs = normalise(np.stack([table[q.text] for q in vq]))
    lat = await measure_latency(r, embedder, vq, qvecs, rounds=args.rounds,
                                slow_queries=args.slow_queries)
    raw["latency"] = dataclasses.asdict(lat)
    store = r._indexes.store
    assert store is not None
    base_keys = sorted(store.chunk_keys())
    _, text_of = chunk_docs(r)
    base = normalise(np.stack([table[text_of[k]] for k in base_keys]))
    real_texts = [t for d in originals for t in d.chunks if t in table] + real_synth_texts
    pool = normalise(np.stack([table[t] for t in dict.fromkeys(real_texts)]))
    await r.close()
    del r, embedder, text_of
    gc.collect()

    scale: ScaleResult | None = None
    if args.hnsw_vectors:
        stage(f"HNSW alone at {args.hnsw_vectors} vectors (build budget "
              f"{args.hnsw_budget:.0f} s)")
        (work / "scale").mkdir()
        scale = hnsw_at_scale(base, pool, qvecs, target=args.hnsw_vectors,
                              budget=args.hnsw_budget, rounds=args.rounds,
                              root=work / "scale")
        raw["scale"] = dataclasses.asdict(scale)
        print(f"   {scale.built} vectors: p50 {scale.results['hnsw']['p50_ms']:.2f} ms, "
              f"p99 {scale.results['hnsw']['p99_ms']:.2f} ms, recall@10 {scale.recall10:.4f}",
              flush=True)

    total = time.perf_counter() - began
    raw["total_seconds"] = total
    raw["stages"] = [dataclasses.asdict(n) for n in NOTES]
    env = [*environment(command, child.argv), f"- Whole run: {total / 60:.1f} minutes."]
    sections = [
        quality_section(rows, env, limits,
                        f"Each corpus document is one `Retriever.upsert` (kind text, corpus "
                        f"title) into a per-collection index; vectors by the real model, "
                        f"batched 32 ({embed_rate}). BM25 = TextIndex.search, vectors = "
                        f"VectorIndex.search (ef 100), hybrid = Retriever.search "
                        f"(RRF k={limits.rrf_k}) with 25/25 candidates (default, k=20 hits) "
                        f"or 100/100 (k=200 hits). nDCG@10 with linear graded gains "
                        f"(cranfield 1-4), recall@100 at depth 100 per side; chunk hits "
                        f"become corpus documents at their best rank."),
        latency_section(lat, scale, env, data_note),
        ingest_section(live, bm25_only, build, embed_rate=embed_rate, env=env, limits=limits),
    ]
    for section in sections:
        print("\n".join(section) + "\n")
    write_sections(args.out, sections)
    print(f"written to {args.out}", flush=True)
    return raw


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    command = ".venv/bin/python -m bench.bench_retrieval " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    wait_quiet(args.wait)
    with workdir_for(args) as work, daemon_log(work.parent / f"{work.name}.daemon.log"):
        print(f"work directory {work}; daemon log {work.parent / (work.name + '.daemon.log')}",
              flush=True)
        raw = asyncio.run(run(args, command, work))
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()
