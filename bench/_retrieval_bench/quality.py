"""The quality stage of ``bench.bench_retrieval``: nDCG@10 and recall@100 per collection."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench._retrieval import (
    Child,
    Collection,
    Ingest,
    Vec,
    open_retriever,
    upsert_all,
)
from bench._retrieval_bench.common import DEEP, SEARCH_N, SWEEP_DEPTH, SWEEP_K, TableEmbedder
from bench._retrieval_bench.metrics import doc_ranking, ndcg, recall
from retrieval import Filters, RetrievalLimits, Retriever
from retrieval import Query as Options
from retrieval.search._fusion import rrf

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
        # Depths explicit: the configured ones are at least k deep, and the default
        # moved to 100/100 (## Fusion weights and depth).
        res25 = await r.search(q.text, k=limits.max_k, options=Options(candidates=SEARCH_N))
        r.limits = deep
        res100 = await r.search(q.text, k=2 * DEEP, options=Options(candidates=DEEP))
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
