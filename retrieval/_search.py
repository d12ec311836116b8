"""Hybrid search: BM25 top-N ∥ HNSW top-N (filters applied inside both), fused by RRF.

Search never fails because of the vector side (invariant 6): without an embedding child
(down, disabled, or a vector index built for another model), or when the query cannot be
embedded within ``query_embed_timeout``, it is BM25-only and its warnings say why. Every
hit carries its chunk id (the citation key), its source, which index found it, the scores
and ranks of both sides, and when it was indexed.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._bm25 import Filters
from ._embedder import EmbedderProvider
from ._fusion import rrf
from ._indexes import Indexes
from ._limits import RetrievalLimits
from .errors import InvalidDocument


@dataclass(frozen=True)
class Hit:
    """One search hit; ``chunk_id`` is its citation key."""

    chunk_id: str
    doc_id: str
    title: str
    source_id: str
    path: str
    heading: str
    text: str
    snippet: str
    search_source: str              # text | vector | hybrid
    fused_score: float
    text_rank: int | None
    text_score: float | None
    vector_rank: int | None
    vector_score: float | None      # cosine similarity
    indexed_at: int


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    mode: str                       # hybrid | text
    warnings: list[str]


def snippet(text: str, query: str, width: int = 240) -> str:
    """A window of ``text`` around the first query term it contains."""
    lowered = text.lower()
    best = -1
    for term in sorted(set(re.findall(r"\w{3,}", query.lower())), key=len, reverse=True):
        best = lowered.find(term)
        if best >= 0:
            break
    start = max(0, best - width // 3) if best >= 0 else 0
    piece = " ".join(text[start:start + width].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


class Search:
    """Searches over :class:`~retrieval._indexes.Indexes` (reads only; no writer lock)."""

    def __init__(self, indexes: Indexes, embedder: EmbedderProvider,
                 limits: RetrievalLimits, *, unavailable_reason: Callable[[], str],
                 on_other_model: Callable[[], object]) -> None:
        """Args:
            indexes: the stores searched.
            embedder: gives the embedder to use now, or None (search is then BM25-only).
            limits: candidates, k, query length, RRF k, query embedding timeout.
            unavailable_reason: says why ``embedder`` gave None, for warnings.
            on_other_model: called when there is no vector index, or it belongs to
                another model than the embedder's (it starts the background backfill).
        """
        self._indexes = indexes
        self._embedder = embedder
        self.limits = limits
        self._unavailable = unavailable_reason
        self._on_other_model = on_other_model

    async def search(self, query: str, *, k: int | None = None,
                     filters: Filters | None = None) -> SearchResult:
        """BM25 top-N ∥ HNSW top-N, fused by RRF; top ``k`` hits.

        The query embedding is bounded by ``query_embed_timeout`` (past it, BM25-only).
        Cancellation stops waiting; an index read already running in its thread
        finishes and is discarded.

        Raises:
            InvalidDocument: empty or oversized query, k out of range.
            RetrievalError: retrieval is not open.
        """
        limits = self.limits
        store, text = self._indexes.require()
        k = limits.default_k if k is None else k
        if not 1 <= k <= limits.max_k:
            raise InvalidDocument(f"k must be in 1..{limits.max_k} (retrieval.max_k), "
                                  f"got {k}")
        if not query.strip():
            raise InvalidDocument("query is empty")
        if len(query) > limits.max_query_chars:
            raise InvalidDocument(f"query has {len(query)} characters; the limit is "
                                  f"{limits.max_query_chars} (retrieval.max_query_chars)")
        filters = filters or Filters()
        n_text = max(limits.text_candidates, k)
        n_vec = max(limits.vector_candidates, k)
        warnings: list[str] = []
        vector_task = asyncio.create_task(self._vector_search(query, n_vec, filters, warnings))
        text_hits = await asyncio.to_thread(text.search, query, filters=filters, limit=n_text)
        vec_hits = await vector_task
        mode = "hybrid" if vec_hits is not None else "text"
        fused = rrf([[key for key, _ in text_hits], [key for key, _ in (vec_hits or [])]],
                    k=limits.rrf_k)[:k]
        text_rank = {key: i for i, (key, _) in enumerate(text_hits, start=1)}
        text_score = dict(text_hits)
        vec_rank = {key: i for i, (key, _) in enumerate(vec_hits or [], start=1)}
        vec_sim = {key: 1.0 - dist for key, dist in (vec_hits or [])}
        chunks = await asyncio.to_thread(store.chunks_by_keys, [key for key, _ in fused])
        hits = []
        for key, score in fused:
            c = chunks.get(key)
            if c is None:  # deleted between the index read and now
                continue
            in_text, in_vec = key in text_rank, key in vec_rank
            hits.append(Hit(
                c.chunk_id, c.doc_id, c.title, c.source_id, c.path, c.heading, c.text,
                snippet(c.text, query),
                "hybrid" if in_text and in_vec else ("text" if in_text else "vector"),
                score, text_rank.get(key), text_score.get(key), vec_rank.get(key),
                vec_sim.get(key), c.indexed_at))
        return SearchResult(hits, mode, warnings)

    async def _vector_search(self, query: str, n: int, filters: Filters,
                             warnings: list[str]) -> list[tuple[int, float]] | None:
        embedder = self._embedder()
        if embedder is None:
            warnings.append(f"{self._unavailable()}: results are BM25-only")
            return None
        indexes = self._indexes
        if indexes.vectors is None or indexes.vector_model != embedder.model_id:
            self._on_other_model()
            if indexes.vectors is not None:
                warnings.append("the vector index belongs to another embedding model and is "
                                "being rebuilt: results are BM25-only")
            else:
                warnings.append("no vectors indexed yet (the backfill embeds what is "
                                "indexed): results are BM25-only")
            return None
        try:
            vectors = await asyncio.wait_for(embedder.embed([query]),
                                             self.limits.query_embed_timeout)
        except Exception as exc:
            warnings.append(f"query embedding failed ({type(exc).__name__}): results are "
                            "BM25-only")
            return None
        allowed = await self._allowed_keys(filters)
        vector = np.asarray(vectors[0], dtype=np.float32)
        index = indexes.vectors
        return await asyncio.to_thread(
            index.search, vector, n, None if allowed is None else allowed.__contains__)

    async def _allowed_keys(self, filters: Filters) -> set[int] | None:
        if filters == Filters():
            return None
        store, _ = self._indexes.require()
        return await asyncio.to_thread(functools.partial(
            store.keys_matching, sources=filters.sources, kinds=filters.kinds,
            categories=filters.categories, tags=filters.tags, since=filters.since,
            until=filters.until))
