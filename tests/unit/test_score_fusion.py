"""Score fusions beside RRF (issue 30): DBSF and the convex combination, worked by hand on
small lists; document-level fusion; and Search running each, refusing an unknown one."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from retrieval import Filters, InvalidDocument, Query, Retriever
from retrieval.search._fusion import fuse
from retrieval.search._score_fusion import (
    by_document,
    ceiling,
    fuse_scored,
    honest_weights,
    normalised,
)
from tests.support.embedder import HashEmbedder, filled


def scores(hits: list) -> dict[int, float]:  # type: ignore[type-arg]
    return {h.key: h.score for h in hits}


def test_dbsf_maps_mean_minus_3_sd_to_0_and_plus_3_sd_to_1() -> None:
    """Text 4, 0: mean 2, sd 2, so (s + 4) / 12: 2/3 and 1/3. Vector 0.9, 0.5: mean 0.7,
    sd 0.2, so (s - 0.1) / 1.2: 2/3 and 1/3. Absent counts 0."""
    hits = fuse_scored([[(1, 4.0), (2, 0.0)], [(2, 0.9), (3, 0.5)]], "dbsf",
                       weights=[1.0, 1.0])
    assert [h.key for h in hits] == [2, 1, 3]
    assert scores(hits) == pytest.approx({2: 1.0, 1: 2 / 3, 3: 1 / 3})
    assert [h.ranks for h in hits] == [(2, 1), (1, None), (None, 2)]


def test_dbsf_clips_outliers_and_maps_a_flat_list_to_its_middle() -> None:
    """One 1 among 99 zeros is past mean + 3 sd: clipped to 1. A single score is its own
    mean: 0.5."""
    values = normalised("dbsf", [1.0] + [0.0] * 99)
    assert values[0] == 1.0
    assert values[1] == pytest.approx((0 - (0.01 - 3 * 0.0995)) / (6 * 0.0995), abs=1e-3)
    assert normalised("dbsf", [7.0]) == [0.5]
    assert scores(fuse_scored([[(5, 7.0)], []], "dbsf", weights=[2.0, 1.0])) == {5: 1.0}


def test_convex_is_alpha_text_plus_1_minus_alpha_vector_of_min_max_scores() -> None:
    """Text 10, 6, 2 -> 1, 0.5, 0; vector 0.9, 0.7, 0.5 -> 1, 0.5, 0; alpha 0.3."""
    hits = fuse_scored([[(1, 10.0), (2, 6.0), (3, 2.0)], [(3, 0.9), (4, 0.7), (1, 0.5)]],
                       "convex", weights=[0.3, 0.7])
    assert [h.key for h in hits] == [3, 4, 1, 2]
    assert scores(hits) == pytest.approx({3: 0.7, 4: 0.35, 1: 0.3, 2: 0.15})
    assert normalised("convex", [3.0, 3.0]) == [1.0, 1.0]


def test_zscore_counts_an_absent_key_at_its_lists_lowest_z() -> None:
    """Text 3, 1 -> z 1, -1; vector 5, 1 -> z 1, -1: keys 1 and 2 tie at 0 (the best
    single rank ties too: the smaller key first); key 3 is -1 + -1."""
    hits = fuse_scored([[(1, 3.0), (2, 1.0)], [(2, 5.0), (3, 1.0)]], "zscore",
                       weights=[1.0, 1.0])
    assert [(h.key, h.score) for h in hits] == [(1, 0.0), (2, 0.0), (3, -2.0)]


def test_rrf_through_fuse_scored_is_rrf_and_ceilings_normalise() -> None:
    lists = [[(1, 9.0), (2, 8.0)], [(2, 0.5), (3, 0.4)]]
    assert fuse_scored(lists, "rrf", weights=[1.0, 0.5], k=10) == fuse(
        [[1, 2], [2, 3]], 10, [1.0, 0.5])
    assert ceiling("rrf", [1.0, 1.0], 60) == pytest.approx(2 / 61)
    assert ceiling("dbsf", [0.3, 0.7]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="fusion must be one of"):
        fuse_scored(lists, "borda", weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="one weight"):
        fuse_scored(lists, "dbsf", weights=[1.0])


def test_document_fusion_credits_a_document_for_both_lists() -> None:
    """Document A has chunks 10 and 12, B has 11 and 13. BM25: 10 (A), 11 (B), 12 (A);
    vectors: 13 (B), 10 (A); weights 1 and 2, RRF k=60. Per chunk, 10 leads (1/61 +
    2/62) and B's two half-supported chunks trail; per document, B is first in vectors
    (2/61) and second in BM25 (1/62): 0.04892 against A's 0.04865."""
    lists = [[(10, 5.0), (11, 4.0), (12, 3.0)], [(13, 0.9), (10, 0.8)]]
    chunks = fuse_scored(lists, "rrf", weights=[1.0, 2.0])
    assert [h.key for h in chunks] == [10, 13, 11, 12]
    doc_of = {10: "A", 11: "B", 12: "A", 13: "B"}
    docs, others = by_document(lists, chunks, doc_of, "rrf", weights=[1.0, 2.0])
    assert [h.key for h in docs] == [13, 10]     # B (by its best chunk 13), then A
    assert scores(docs) == pytest.approx({13: 1 / 62 + 2 / 61, 10: 1 / 61 + 2 / 62})
    assert docs[0].ranks == (2, 1)
    assert others == {10: [12], 13: [11]}


def test_a_short_lexical_list_is_normalised_among_the_zeros_below_it() -> None:
    """BM25 asked for 4 found 2 (8 and 2): the two missing score 0, so the statistics are
    over 8, 2, 0, 0 (mean 2.5, sd 3.28): 8 maps to (8 + 7.35) / 19.69 = 0.780, 2 to
    0.475; unpadded they would be 2/3 and 1/3. A list of one padded to 100 maps to the
    top (1), where alone it was the middle (0.5)."""
    sd = (sum((x - 2.5) ** 2 for x in (8, 2, 0, 0)) / 4) ** 0.5
    assert normalised("dbsf", [8.0, 2.0], pad=2) == pytest.approx(
        [(8 - 2.5 + 3 * sd) / (6 * sd), (2 - 2.5 + 3 * sd) / (6 * sd)])
    assert normalised("dbsf", [8.0, 2.0]) == pytest.approx([2 / 3, 1 / 3])
    assert normalised("dbsf", [7.0], pad=99) == [1.0]
    # A few matches among 97 zeros lie beyond mean + 3 sd: the top is anchored at the
    # best of them (not clipped to one value), so they keep BM25's order.
    few = normalised("dbsf", [9.0, 8.0, 7.0], pad=97)
    assert few[0] == 1.0 and few[0] > few[1] > few[2] > 0
    assert normalised("convex", [8.0, 2.0], pad=2) == pytest.approx([1.0, 0.25])
    assert normalised("zscore", [8.0, 2.0], pad=2) == pytest.approx(
        [(8 - 2.5) / sd, (2 - 2.5) / sd])


def test_a_short_lexical_list_weighs_toward_the_other_list() -> None:
    """Depth 100, weights 0.4 / 0.6: a list of one weighs 0.6 * 100 / 100; of 11,
    0.6 * 90 / 100 = 0.54; of 34 or more, its own 0.4 (0.6 * 67 / 100 = 0.402 at 34);
    a full list, a list without a depth (vectors) and an empty one keep their weight."""
    vec = [(1000 + i, 0.5) for i in range(100)]

    def text(n: int) -> list[tuple[int, float]]:
        return [(i, 5.0) for i in range(n)]
    assert honest_weights([text(1), vec], [0.4, 0.6], [100, None]) == [0.6, 0.6]
    assert honest_weights([text(11), vec], [0.4, 0.6], [100, None]) == pytest.approx(
        [0.54, 0.6])
    assert honest_weights([text(34), vec], [0.4, 0.6], [100, None]) == pytest.approx(
        [0.402, 0.6])
    assert honest_weights([text(40), vec], [0.4, 0.6], [100, None]) == [0.4, 0.6]
    for n in (0, 100):
        assert honest_weights([text(n), vec], [0.4, 0.6], [100, None]) == [0.4, 0.6]
    assert honest_weights([text(1), vec], [0.4, 0.6], None) == [0.4, 0.6]
    assert honest_weights([text(1)], [0.4], [100]) == [0.4]


def lone_match_lists() -> list[list[tuple[int, float]]]:
    """The worst case for a word one document holds: BM25 finds document 7 alone; the
    vectors miss it, their first (key 100) well clear of the other 99 (a clipped 1)."""
    vec = [(100, 0.9)] + [(101 + i, 0.5 - i * 0.001) for i in range(99)]
    return [[(7, 3.2)], vec]


@pytest.mark.parametrize("fusion", ["rrf", "dbsf", "convex", "zscore"])
@pytest.mark.parametrize("alpha", [0.2, 0.4, 0.5, 0.8])
def test_a_lone_exact_match_ties_at_worst_with_the_vectors_first(fusion: str,
                                                                 alpha: float) -> None:
    """Whatever the fusion and weights, a lone BM25 match is first or second (tied with
    the vectors' first, the key breaking the tie) when the fusion knows the depths."""
    hits = fuse_scored(lone_match_lists(), fusion, weights=[alpha, 1 - alpha],
                       depths=[100, None])
    assert 7 in [h.key for h in hits[:2]], [(h.key, h.score) for h in hits[:4]]
    assert hits[0].score == pytest.approx(hits[1].score) or hits[0].key == 7


def test_without_the_depths_dbsf_buries_the_lone_match() -> None:
    """What fusing the lists alone did (Qdrant's DBSF, 5d913f0): the list of one maps to
    0.5, 0.4 * 0.5 = 0.2, below every vector candidate down to a normalised 1/3."""
    hits = fuse_scored(lone_match_lists(), "dbsf", weights=[0.4, 0.6])
    assert [h.key for h in hits].index(7) > 50


# -- through Search --------------------------------------------------------------------


@pytest.fixture
async def r(tmp_path: Path) -> AsyncIterator[Retriever]:
    retriever = await filled(tmp_path, HashEmbedder("m"))
    yield retriever
    await retriever.close()


@pytest.mark.parametrize("fusion", ["rrf", "dbsf", "convex"])
async def test_search_fuses_the_two_lists_as_asked(r: Retriever, fusion: str) -> None:
    """Search's order and scores are the fusion's over the two indexes' lists; the
    normalised score divides by the fusion's ceiling."""
    res = await r.search("check disk", k=20, options=Query(fusion=fusion, text_weight=0.3,
                                                           vector_weight=0.7))
    assert res.mode == "hybrid"
    text = r._indexes.text_ranked("check disk", Filters(), r.limits.text_candidates)
    qv = (await HashEmbedder("m").embed(["check disk"]))[0]
    vec = r._indexes.vector_ranked("m", np.asarray(qv, dtype=np.float32), Filters(),
                                   r.limits.vector_candidates)
    lists = [text, [(k, 1 - d) for k, d in vec]]
    depths = [r.limits.text_candidates, None]
    want = fuse_scored(lists, fusion, weights=[0.3, 0.7], k=r.limits.rrf_k, depths=depths)
    assert [h.fused_score for h in res.hits] == pytest.approx([h.score for h in want][:len(
        res.hits)])
    top = ceiling(fusion, honest_weights(lists, [0.3, 0.7], depths), r.limits.rrf_k)
    assert [h.score for h in res.hits] == pytest.approx([h.fused_score / top
                                                          for h in res.hits])


async def test_the_configured_fusion_is_the_default(r: Retriever) -> None:
    asked = await r.search("check disk", k=5, options=Query(fusion="dbsf"))
    r.limits = dataclasses.replace(r.limits, fusion="dbsf")
    default = await r.search("check disk", k=5)
    assert [h.chunk_id for h in default.hits] == [h.chunk_id for h in asked.hits]
    assert [h.fused_score for h in default.hits] == [h.fused_score for h in asked.hits]


async def test_an_unknown_fusion_is_refused_naming_the_field(r: Retriever) -> None:
    with pytest.raises(InvalidDocument, match="fusion must be one of rrf, dbsf, convex, "
                                              "got 'borda'") as caught:
        await r.search("disk", options=Query(fusion="borda"))
    assert caught.value.field == "fusion"
    with pytest.raises(InvalidDocument) as huge:  # a hostile value is not echoed whole
        await r.search("disk", options=Query(fusion="x" * 100_000))
    assert len(str(huge.value)) < 200


class _Blind(HashEmbedder):
    """Vectors that never find the one document holding ``word``: it points one way,
    the query and every other document another, each a little differently."""

    def __init__(self, word: str) -> None:
        super().__init__("blind")
        self.word = word

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out = []
        for text in texts:
            v = [0.0] * 32
            if self.word in text and "note" in text:  # the document, not the query
                v[1] = 1.0
            else:
                v[0], v[2 + len(text) % 30] = 1.0, 0.1 * (len(text) % 7)
            out.append(v)
        return out


async def test_a_word_one_document_holds_stays_near_the_top_with_every_fusion(
        tmp_path: Path) -> None:
    """A query for a word only one document holds (an error code, a host name) whose
    vectors miss that document (110 others, so it is not among the vectors' 100
    candidates): the default fusion, and each fusion Search offers at weights 0.4 / 0.6,
    keeps it first or second. Plain DBSF buried it (a lone BM25 candidate normalised to
    the middle, the vector list outweighing it: test_faults_process found it missing from
    the top 5); the search's text list is short, so it counts as what it is."""
    r = Retriever(tmp_path / "index", lambda: _Blind("quixoticword"))
    await r.open()
    try:
        await r.add_source("docs")
        await r.upsert("docs", "t", "note about quixoticword only here", doc_id="docs/target")
        for i in range(110):
            await r.upsert("docs", f"n{i}", f"another note {i} " + "x" * (i % 40),
                           doc_id=f"docs/n{i}")
        default = await r.search("quixoticword", k=5)
        (lone,) = [(t, v) for _, t, v, _ in default.fused if t is not None]
        assert lone == (1, None)  # BM25 found it alone, the vectors missed it
        assert "docs/target" in [h.doc_id for h in default.hits[:2]]
        for fusion in ("rrf", "dbsf", "convex"):
            hits = (await r.search("quixoticword", k=5, options=Query(
                fusion=fusion, text_weight=0.4, vector_weight=0.6))).hits
            assert "docs/target" in [h.doc_id for h in hits[:2]], fusion
            assert 0 < hits[0].score <= 1.0
    finally:
        await r.close()
