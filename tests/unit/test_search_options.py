"""Search the caller controls (issue 16): the mode (hybrid, text, vector — vector never
silently degraded), a score floor on a normalised score, candidates per index, weighted
fusion, one hit per document, and the provenance every hit carries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from retrieval import InvalidDocument, Query, RetrievalLimits, Retriever, VectorUnavailable
from tests.support.embedder import HashEmbedder, filled


class Counting(HashEmbedder):
    """Counts the query embeddings (one text per call)."""

    def __init__(self) -> None:
        super().__init__("m")
        self.queries = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.queries += len(texts) == 1
        return await super().embed(texts)


@pytest.fixture
async def embedder() -> Counting:
    return Counting()


@pytest.fixture
async def r(tmp_path: Path, embedder: Counting) -> AsyncIterator[Retriever]:
    retriever = await filled(tmp_path, embedder)
    yield retriever
    await retriever.close()


async def test_text_mode_uses_bm25_alone(r: Retriever, embedder: Counting) -> None:
    """mode=text: BM25 hits only, no query embedding, the mode said."""
    before = embedder.queries
    result = await r.search("replication lag", options=Query(mode="text"))
    assert result.mode == "text"
    assert [h.doc_id for h in result.hits] == ["docs/db"]
    assert all(h.vector_rank is None and h.search_source == "text" for h in result.hits)
    assert embedder.queries == before


async def test_vector_mode_uses_vectors_alone(r: Retriever) -> None:
    """mode=vector: HNSW hits only (every chunk is a candidate here), scored by cosine."""
    result = await r.search("replication lag", k=3, options=Query(mode="vector"))
    assert result.mode == "vector"
    assert result.hits[0].doc_id == "docs/db"
    assert all(h.text_rank is None and h.search_source == "vector" for h in result.hits)
    assert [h.score for h in result.hits] == [h.vector_score for h in result.hits]


async def test_vector_mode_is_refused_not_degraded_without_vectors(tmp_path: Path) -> None:
    """Without an embedder, or without vectors, a vector search is refused naming why; a
    hybrid search of the same index is BM25-only and says so."""
    r = await filled(tmp_path / "none", None)
    with pytest.raises(VectorUnavailable, match="cannot run: embedding child unavailable"):
        await r.search("disk", options=Query(mode="vector"))
    assert (await r.search("disk")).mode == "text"
    await r.close()
    late = Retriever(tmp_path / "none", lambda: HashEmbedder("m"))
    await late.open()
    with pytest.raises(VectorUnavailable, match="no vectors indexed yet"):
        await late.search("disk", options=Query(mode="vector"))
    await late.close()


async def test_min_score_keeps_hits_at_or_above_the_normalised_score(r: Retriever) -> None:
    """The fused score is normalised by the best possible one: with RRF a chunk both
    indexes rank first scores 1.0; min_score drops what is below (cosine in vector mode;
    with the default fusion, dbsf, a score is in [0, 1] too)."""
    rrf = Query(fusion="rrf")
    every = await r.search("replication lag timestamp", k=3, options=rrf)
    assert every.hits[0].score == pytest.approx(1.0)
    assert all(0 < h.score <= 1 for h in every.hits)
    strict = await r.search("replication lag timestamp", k=3,
                            options=Query(fusion="rrf", min_score=0.99))
    assert [h.doc_id for h in strict.hits] == ["docs/db"]
    dbsf = await r.search("replication lag timestamp", k=3)
    assert all(0 < h.score <= 1 for h in dbsf.hits)
    cut = dbsf.hits[1].score + 1e-9
    above = await r.search("replication lag timestamp", k=3, options=Query(min_score=cut))
    assert [h.chunk_id for h in above.hits] == [dbsf.hits[0].chunk_id]
    floor = every.hits[-1].vector_score
    assert floor is not None
    cosine = await r.search("replication lag timestamp", k=3,
                            options=Query(mode="vector", min_score=floor + 1e-6))
    assert all((h.vector_score or 0) > floor for h in cosine.hits)
    assert len(cosine.hits) < 3


async def test_weights_choose_which_ranking_leads(r: Retriever) -> None:
    """A zero weight takes a ranking out of the order: BM25's order with vector_weight 0,
    the vector order with text_weight 0."""
    text = await r.search("check", k=3, options=Query(mode="text"))
    vector = await r.search("check", k=3, options=Query(mode="vector"))
    by_text = await r.search("check", k=3, options=Query(vector_weight=0))
    by_vector = await r.search("check", k=3, options=Query(text_weight=0))
    assert [h.doc_id for h in by_text.hits][:len(text.hits)] == [h.doc_id for h in text.hits]
    assert [h.doc_id for h in by_vector.hits] == [h.doc_id for h in vector.hits]


async def test_candidates_bound_each_index(r: Retriever) -> None:
    """candidates=1: each index contributes its best chunk only; above max_candidates it
    is refused naming the option."""
    one = await r.search("check disk", k=3, options=Query(candidates=1))
    assert len(one.hits) <= 2
    r.limits = RetrievalLimits(max_candidates=5)
    with pytest.raises(InvalidDocument, match=r"candidates must be in 1\.\.5 "
                                              r"\(retrieval\.max_candidates\), got 6"):
        await r.search("disk", options=Query(candidates=6))


@pytest.mark.parametrize(("options", "message"), [
    (Query(mode="fuzzy"), "mode must be one of hybrid, text, vector"),
    (Query(text_weight=-1), "text_weight must be in 0..100"),
    (Query(vector_weight=float("nan")), "vector_weight must be in 0..100"),
    (Query(text_weight=0, vector_weight=0), "cannot both be 0"),
    (Query(min_score=2), "min_score must be in -1..1"),
])
async def test_bad_options_are_refused(r: Retriever, options: Query, message: str) -> None:
    """Each option out of range is InvalidDocument saying which and why."""
    with pytest.raises(InvalidDocument, match=message):
        await r.search("disk", options=options)


async def test_group_by_document_gives_one_hit_per_document(tmp_path: Path) -> None:
    """group_by_document: a document's best chunk stands for it, its other matching
    chunks listed; k counts documents."""
    r = await filled(tmp_path, HashEmbedder("m"),
                     RetrievalLimits(chunk_size=60, chunk_overlap=0, max_chunk_chars=80))
    await r.upsert("docs", "nginx handbook", "\n\n".join(
        f"Section {i}: nginx logs rotate daily and nginx reloads." for i in range(4)),
        doc_id="docs/handbook")
    chunks = await r.search("nginx logs", k=10)
    assert sum(h.doc_id == "docs/handbook" for h in chunks.hits) > 1
    grouped = await r.search("nginx logs", k=10, options=Query(group_by_document=True))
    ids = [h.doc_id for h in grouped.hits]
    assert len(ids) == len(set(ids))
    handbook = next(h for h in grouped.hits if h.doc_id == "docs/handbook")
    assert handbook.other_chunk_ids
    assert all(c.startswith("docs/handbook#") for c in handbook.other_chunk_ids)
    assert handbook.chunk_id not in handbook.other_chunk_ids
    assert len((await r.search("nginx logs", k=1,
                               options=Query(group_by_document=True))).hits) == 1
    await r.close()


async def test_hits_carry_their_provenance(r: Retriever) -> None:
    """Each hit says its kind, category, tags, place in its document and the file's
    modification time (0 for a pushed document)."""
    await r.upsert("docs", "router", "core router bgp flap runbook", doc_id="docs/router",
                   kind="markdown", category="network", tags=("bgp", "core"),
                   mtime_ns=1_700_000_000_000_000_000)
    hit = (await r.search("bgp flap")).hits[0]
    assert (hit.doc_id, hit.kind, hit.category, hit.tags, hit.ordinal) == (
        "docs/router", "markdown", "network", ("bgp", "core"), 1)
    assert hit.mtime_ns == 1_700_000_000_000_000_000
