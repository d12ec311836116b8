"""The latency stages of ``bench.bench_retrieval``: search, BM25 baselines, HNSW at scale."""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench._retrieval import (
    Query,
)
from bench._retrieval_bench.common import (
    DIM,
    HYBRID_K,
    MIX_NOISE,
    SEARCH_N,
    WORD,
    Mat,
    TableEmbedder,
    normalise,
    proc_kb,
    reset_peak_rss,
    stage,
)
from bench._retrieval_bench.metrics import brute_force, exact_top, summary, timed
from bench._retrieval_bench.quality import chunk_docs
from retrieval import Filters, Retriever
from retrieval import Query as Options
from retrieval.store._vectors import VectorIndex


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
    depth = Options(candidates=SEARCH_N)  # as labelled (the default is 100/100 now)
    for q in qtexts:
        await r.search(q, k=HYBRID_K, options=depth)
    hybrid: list[float] = []
    modes: set[str] = set()
    for _ in range(rounds):
        for q in qtexts:
            began = time.perf_counter()
            res = await r.search(q, k=HYBRID_K, options=depth)
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
    import bm25s

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
    from rank_bm25 import BM25Okapi

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
