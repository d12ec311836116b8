"""Hybrid search: BM25 top-N ∥ HNSW top-N (filters applied inside both), fused by RRF,
DBSF or a convex combination (:mod:`._score_fusion`), per chunk or per document.

Search never fails because of the vector side (invariant 6): without an embedding child
(down, disabled), or when the query cannot be embedded within ``query_embed_timeout``, it
is BM25-only and its warnings say why. The query is embedded by the model of the vector
index: while the index is rebuilt for a new model, that is the previous one, if it is
still available (:data:`~retrieval._embedder.EmbedderLookup`); if not, the search is
BM25-only and its warnings name the rebuild and its progress. ``vector_model`` says whose
vectors answered. Every hit carries its chunk id (the citation key), its source, which
index found it, the scores and ranks of both sides, and when it was indexed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._embedder import Embedder, EmbedderLookup, EmbedderProvider, current_only
from .._interface import StoreBackend
from .._limits import RetrievalLimits
from ..errors import EmbeddingModelMismatch, InvalidDocument, VectorUnavailable
from ..store._bm25 import Filters
from ._dedup import every_holder, fetch_distinct, first_copies
from ._fusion import FusedHit
from ._reads import Reads
from ._score_fusion import FUSIONS, by_document, ceiling, fuse_scored, honest_weights
from ._stats import IndexSizes, SearchStats

if TYPE_CHECKING:
    from .._backfill import BackfillRun


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
    score: float = 0.0              # normalised to [0, 1] (see :class:`Query`)
    kind: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    ordinal: int = 0                # the chunk's place in its document, from 1
    mtime_ns: int = 0               # the file's modification time (0: pushed)
    other_chunk_ids: tuple[str, ...] = ()  # with group_by_document: its other matches
    document_date: int | None = None  # the document's own date, unix seconds (None: none)
    also_in: tuple[str, ...] = ()   # the other documents holding this text (._dedup)


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    mode: str                       # hybrid | text | vector
    warnings: list[str]
    # Every fused candidate, best first: (chunk key, text rank, vector rank, fused score),
    # before the score floor and k (for an audit of the search).
    fused: tuple[tuple[int, int | None, int | None, float], ...] = ()
    vector_model: str = ""          # whose vectors answered ("" : no vector search ran)
    stats: SearchStats = dataclasses.field(default_factory=SearchStats)


class SearchMode(enum.StrEnum):
    """Which indexes a search asks (a :class:`enum.StrEnum`: its values are the strings
    the wire's names, the audit log and :attr:`SearchResult.mode` carry)."""

    HYBRID = "hybrid"
    """Both indexes, their rankings fused (BM25-only when vectors cannot be searched)."""
    TEXT = "text"
    """The BM25 index only."""
    VECTOR = "vector"
    """The vector index only: refused when it cannot run, never degraded."""


MODES: tuple[str, ...] = tuple(m.value for m in SearchMode)
"""The values of :class:`SearchMode`."""


@dataclass(frozen=True)
class Query:
    """What a caller may choose about one search; None takes the configured default.

    Attributes:
        mode: ``hybrid`` (both indexes, fused), ``text`` (BM25 only) or ``vector`` (HNSW
            only: refused with :class:`VectorUnavailable` when it cannot run, never
            degraded).
        min_score: drop hits below it: the cosine similarity in vector mode; otherwise
            the fused score normalised to [0, 1] by the best the fusion can give (RRF:
            a chunk every answering index ranks first; dbsf and convex: the sum of the
            weights), so 1.0 is "first everywhere"; a BM25-only hybrid search is
            normalised by the text index alone.
        candidates: candidates each index contributes (at most
            ``retrieval.max_candidates``).
        fusion: ``rrf`` (reciprocal ranks), ``dbsf`` (each list's scores normalised by
            its mean and 3 standard deviations, clipped, summed) or ``convex`` (min-max
            normalised scores, summed); None: ``retrieval.fusion``.
        text_weight, vector_weight: the lists' weights in the fusion (RRF with weights
            1 and 1 is plain RRF; convex with ``alpha`` and ``1 - alpha`` is
            ``alpha * text + (1 - alpha) * vector``).
        group_by_document: one hit per document, ``k`` documents, fused per document:
            each list reduced to its best chunk per document before the fusion; the hit
            is the document's best chunk by chunk fusion, its other candidate chunks in
            ``other_chunk_ids``.
    """

    mode: str = SearchMode.HYBRID
    min_score: float | None = None
    candidates: int | None = None
    text_weight: float | None = None
    vector_weight: float | None = None
    group_by_document: bool = False
    fusion: str | None = None


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
    """Searches over a store backend (:mod:`retrieval._interface`; reads only, no writer
    lock)."""

    def __init__(self, indexes: StoreBackend, embedder: EmbedderProvider,
                 limits: RetrievalLimits, *, unavailable_reason: Callable[[], str],
                 backfill: BackfillRun,
                 embedder_for: EmbedderLookup | None = None) -> None:
        """Args:
            indexes: the store searched.
            embedder: gives the current embedder, or None (search is then BM25-only).
            limits: candidates, k, query length, RRF k, query embedding timeout.
            unavailable_reason: says why ``embedder`` gave None, for warnings.
            backfill: the store's backfill: told when the store has no vectors, or
                another model's than the embedder's (:meth:`BackfillRun.on_other_model`);
                it says why those cannot answer meanwhile (:meth:`BackfillRun.refusal`).
            embedder_for: gives an embedder of the store's vectors' model when it is not
                the current one (a rebuild is under way); default: none but the current.
        """
        self._indexes = indexes
        self._embedder = embedder
        self._embedder_for = embedder_for or current_only(embedder)
        self._backfill = backfill
        self.limits = limits
        self._unavailable = unavailable_reason
        self._sizes = IndexSizes(indexes)
        self._reads = Reads(limits.search_threads)

    def close(self) -> None:
        """Stop the search threads (a read under way ends in the background)."""
        self._reads.close()

    async def search(self, query: str, *, k: int | None = None,
                     filters: Filters | None = None, options: Query | None = None
                     ) -> SearchResult:
        """BM25 top-N ∥ HNSW top-N, fused (``options.fusion``, weighted); top ``k`` hits
        (``options``: mode, score floor, candidates, fusion, weights, grouping by
        document). A ``k`` above
        ``retrieval.max_k`` is clamped to it, with a warning.

        The query embedding is bounded by ``query_embed_timeout`` (past it, a hybrid
        search is BM25-only, and says so). Cancellation stops waiting; an index read
        already running in its thread finishes and is discarded.

        Raises:
            InvalidDocument: empty or oversized query, k below 1, bad options.
            VectorUnavailable: a vector-mode search that cannot run now (says why).
            RetrievalError: retrieval is not open.
        """
        stats = SearchStats()
        with stats.stage("total"):
            return await self._search(query, k, filters, options, stats)

    async def _search(self, query: str, k: int | None, filters: Filters | None,
                      options: Query | None, stats: SearchStats) -> SearchResult:
        limits = self.limits
        store = self._indexes.require()
        q = options or Query()
        warnings: list[str] = []
        k = self._check(query, limits.default_k if k is None else k, q, warnings)
        stats.text_chunks, stats.vector_chunks = await self._sizes.get()
        with stats.stage("filters"):
            filters = await self._enabled_only(filters or Filters(), warnings)
            if filters is not None:
                filters = await self._reads.run(self._indexes.narrow, filters)
        if filters is None:
            mode = SearchMode.TEXT if q.mode == SearchMode.HYBRID else q.mode
            return SearchResult([], mode, warnings, stats=stats)
        weights = (limits.text_weight if q.text_weight is None else q.text_weight,
                   limits.vector_weight if q.vector_weight is None else q.vector_weight)
        # The caller's depth as given; the configured one at least k deep.
        n_text = q.candidates or max(limits.text_candidates, k)
        n_vec = q.candidates or max(limits.vector_candidates, k)
        vector_task = None
        if q.mode != SearchMode.TEXT:
            vector_task = asyncio.create_task(self._vector_search(
                query, n_vec, filters, warnings, stats,
                required=q.mode == SearchMode.VECTOR))
        text_hits: list[tuple[int, float]] = []
        if q.mode != SearchMode.VECTOR:
            stats.text_depth = n_text
            with stats.stage("text"):
                text_hits = await self._reads.run(self._indexes.text_ranked, query,
                                                  filters, n_text)
        vector = await vector_task if vector_task is not None else None
        vec_hits, vector_model = vector if vector is not None else (None, "")
        mode = (q.mode if q.mode != SearchMode.HYBRID
                else SearchMode.HYBRID if vec_hits is not None else SearchMode.TEXT)
        used = [(weights[0], text_hits)] if q.mode != SearchMode.VECTOR else []
        if vec_hits is not None:
            used.append((weights[1], [(key, 1.0 - dist) for key, dist in vec_hits]))
        method = q.fusion or limits.fusion
        lists, used_weights = [ranking for _, ranking in used], [w for w, _ in used]
        stats.text_candidates, stats.vector_candidates = len(text_hits), len(vec_hits or ())
        fuse_began = time.perf_counter()
        # The text list's depth: a shorter one is every match there is (fuse_scored).
        depths = [n_text, None][:len(lists)] if q.mode != SearchMode.VECTOR else [None]
        fused_hits = fuse_scored(lists, method, weights=used_weights, k=limits.rrf_k,
                                 depths=depths)
        top = ceiling(method, honest_weights(lists, used_weights, depths),
                      limits.rrf_k) or 1.0
        text_rank = {key: i for i, (key, _) in enumerate(text_hits, start=1)}
        text_score = dict(text_hits)
        vec_rank = {key: i for i, (key, _) in enumerate(vec_hits or [], start=1)}
        vec_sim = {key: 1.0 - dist for key, dist in (vec_hits or [])}

        def normalised(key: int, score: float) -> float:
            return vec_sim[key] if mode == SearchMode.VECTOR else score / top

        others: dict[int, list[int]] = {}
        ranked: list[FusedHit] = fused_hits
        stats.stages_ms["fuse"] = round((time.perf_counter() - fuse_began) * 1000, 3)
        if q.group_by_document:
            with stats.stage("fetch"):
                chunks = await self._reads.run(store.chunks_by_keys,
                                               [h.key for h in fused_hits])
            with stats.stage("fuse"):
                ranked, others = by_document(lists, fused_hits,
                                             {key: c.doc_id for key, c in chunks.items()},
                                             method, weights=used_weights, k=limits.rrf_k,
                                             depths=depths)
        stats.fused = len(ranked)
        kept = [(h.key, h.score) for h in ranked
                if q.min_score is None or normalised(h.key, h.score) >= q.min_score]
        if not q.group_by_document:
            with stats.stage("fetch"):
                chunks = await fetch_distinct(self._reads, store, [key for key, _ in kept], k)
        holders = first_copies([key for key, _ in kept], chunks)  # one hit per text
        holders = await every_holder(self._reads, store, dict(list(holders.items())[:k]),
                                     chunks, filters, limit=limits.max_also_in)
        hits = []
        for key, score in kept:
            c = chunks.get(key)
            if c is None or key not in holders:  # deleted since, not fetched, or a copy
                continue
            in_text, in_vec = key in text_rank, key in vec_rank
            hits.append(Hit(
                c.chunk_id, c.doc_id, c.title, c.source_id, c.path, c.heading, c.text,
                snippet(c.text, query),
                "hybrid" if in_text and in_vec else ("text" if in_text else "vector"),
                score, text_rank.get(key), text_score.get(key), vec_rank.get(key),
                vec_sim.get(key), c.indexed_at, normalised(key, score), c.kind, c.category,
                c.tags, c.ordinal, c.mtime_ns, document_date=c.document_date,
                also_in=holders[key],
                other_chunk_ids=tuple(chunks[o].chunk_id for o in others.get(key, ())
                                      if o in chunks)))
        candidates = tuple((h.key, text_rank.get(h.key), vec_rank.get(h.key), h.score)
                           for h in fused_hits)
        return SearchResult(hits[:k], mode, warnings, candidates, vector_model, stats)

    async def _enabled_only(self, filters: Filters, warnings: list[str]) -> Filters | None:
        """``filters`` narrowed to the enabled sources (a disabled one is kept but not
        searched); None when only disabled sources were asked for. A disabled source
        asked for by name is named in a warning, on either backend (:meth:`disabled`)."""
        disabled = await self._indexes.disabled(filters.sources)
        if not disabled:
            return filters
        asked = filters.sources
        if not asked:
            store = self._indexes.require()
            asked = tuple(s.id for s in await self._reads.run(store.sources))
        named = sorted(set(filters.sources) & disabled)
        if named:
            warnings.append(f"source {', '.join(named)} is disabled: not searched")
        enabled = tuple(s for s in asked if s not in disabled)
        return dataclasses.replace(filters, sources=enabled) if enabled else None

    def _check(self, query: str, k: int, q: Query, warnings: list[str]) -> int:
        """Refuse what cannot be searched; return ``k``, clamped to ``max_k`` (warned)."""
        limits = self.limits
        if k < 1:
            raise InvalidDocument(f"k must be at least 1, got {k}", field="k")
        if k > limits.max_k:
            warnings.append(f"top_k {k} is above the maximum, retrieval.max_k = "
                            f"{limits.max_k}: {limits.max_k} hits at most")
            k = limits.max_k
        if not query.strip():
            raise InvalidDocument("query is empty", field="query")
        if len(query) > limits.max_query_chars:
            raise InvalidDocument(f"query has {len(query)} characters; the limit is "
                                  f"{limits.max_query_chars} (retrieval.max_query_chars)",
                                  field="query")
        if q.fusion is not None and q.fusion not in FUSIONS:
            raise InvalidDocument(f"fusion must be one of {', '.join(FUSIONS)}, got "
                                  f"{q.fusion[:40]!r}", field="fusion")  # echo bounded
        if q.mode not in MODES:
            raise InvalidDocument(f"mode must be one of {', '.join(MODES)}, got {q.mode!r}",
                                  field="mode")
        if q.candidates is not None and not 1 <= q.candidates <= limits.max_candidates:
            raise InvalidDocument(f"candidates must be in 1..{limits.max_candidates} "
                                  f"(retrieval.max_candidates), got {q.candidates}",
                                  field="candidates")
        for name, w in (("text_weight", q.text_weight), ("vector_weight", q.vector_weight)):
            if w is not None and not (math.isfinite(w) and 0 <= w <= 100):
                raise InvalidDocument(f"{name} must be in 0..100, got {w}", field=name)
        if q.text_weight == 0 and q.vector_weight == 0:
            raise InvalidDocument("text_weight and vector_weight cannot both be 0",
                                  field="text_weight")
        if q.min_score is not None and not (math.isfinite(q.min_score)
                                            and -1 <= q.min_score <= 1):
            raise InvalidDocument(f"min_score must be in -1..1, got {q.min_score}",
                                  field="min_score")
        return k

    async def _vector_search(self, query: str, n: int, filters: Filters, warnings: list[str],
                             stats: SearchStats, *, required: bool = False
                             ) -> tuple[list[tuple[int, float]], str] | None:
        """The vector side: ``(key, distance)`` best first and the model whose vectors
        answered, or None (and a warning) when it cannot answer; ``required`` (vector
        mode) raises instead."""
        def without(why: str) -> None:
            if required:
                raise VectorUnavailable(f"a vector search cannot run: {why}")
            warnings.append(f"{why}: results are BM25-only")

        indexes = self._indexes
        current = self._embedder()
        serving = await self._reads.run(indexes.serving_model)
        if current is not None and current.model_id != serving:
            self._backfill.on_other_model()  # no vectors yet, or another model's
        if not serving:
            without(self._unavailable() if current is None else
                    "no vectors indexed yet (the backfill embeds what is indexed)")
            return None
        embedder: Embedder | None = current
        if current is None or current.model_id != serving:
            embedder = self._embedder_for(serving)  # the vectors' model, if still resident
        if embedder is None:
            without(self._unavailable() if current is None
                    else self._backfill.refusal(current.model_id, serving))
            return None
        try:
            with stats.stage("embed"):
                vectors = await asyncio.wait_for(embedder.embed([query]),
                                                 self.limits.query_embed_timeout)
        except Exception as exc:
            without(f"query embedding failed ({type(exc).__name__})")
            return None
        vector = np.asarray(vectors[0], dtype=np.float32)
        stats.vector_depth = n
        try:
            with stats.stage("vector"):
                hits = await self._reads.run(indexes.vector_ranked, serving, vector,
                                             filters, n)
        except EmbeddingModelMismatch as exc:  # the vectors' model changed meanwhile
            without(str(exc))
            return None
        return hits, serving

