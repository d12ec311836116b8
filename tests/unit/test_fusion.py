"""Reciprocal rank fusion: exact scores, agreement between lists wins, the effect of k, and a
total, deterministic order (ties by best single rank, then key)."""

from __future__ import annotations

import itertools

import pytest

from retrieval.search._fusion import FusedHit, best_score, fuse, rrf


def test_scores_are_the_sum_of_reciprocal_ranks() -> None:
    """Each key scores sum(1 / (k + rank)) over the lists holding it, ranks 1-based."""
    assert rrf([[10, 20], [20, 30]], k=60) == [
        (20, 1 / 62 + 1 / 61),
        (10, 1 / 61),
        (30, 1 / 62),
    ]


def test_a_key_in_both_lists_beats_keys_in_one_at_similar_ranks() -> None:
    """A key both lists rank second beats the keys each list ranks first alone."""
    fused = rrf([[1, 2, 3], [4, 2, 5]])
    assert [key for key, _ in fused][:3] == [2, 1, 4]


def test_agreement_within_the_top_61_beats_a_single_first_place_at_k_60() -> None:
    """At k=60, ranks 61 and 61 beat a lone first place; 62 and 62 tie it exactly and lose
    the tie on best single rank."""

    def rankings(rank: int) -> list[list[int]]:
        # 7 is first in list a only; 99 is at ``rank`` in both; fillers are distinct.
        a = [7, *range(1000, 1000 + rank - 2), 99]
        b = [*range(2000, 2000 + rank - 1), 99]
        return [a, b]

    order = [k for k, _ in rrf(rankings(61))]
    assert order.index(99) < order.index(7)
    scores = dict(rrf(rankings(62)))
    assert scores[99] == scores[7] == 1 / 61
    order = [k for k, _ in rrf(rankings(62))]
    assert order.index(7) < order.index(99)


def test_small_k_lets_a_first_place_dominate() -> None:
    """k=1 ranks a lone first place above a key both lists rank fourth; k=60 the reverse."""
    rankings = [[1, 11, 12, 4], [21, 22, 23, 4]]
    assert rrf(rankings, k=1)[0][0] == 1
    assert rrf(rankings, k=60)[0][0] == 4


def test_ties_break_by_best_single_rank_then_key() -> None:
    """Equal scores order by best single rank, then by ascending key."""
    # 5: ranks (1, 3) and 6: ranks (3, 1) tie, best rank 1 each -> key order; likewise
    # 8 and 9, rank 2 in one list each.
    fused = fuse([[5, 8, 6], [6, 9, 5]])
    assert [h.key for h in fused] == [5, 6, 8, 9]
    assert fused[0].score == fused[1].score
    assert fused[2].score == fused[3].score


def test_order_does_not_depend_on_the_order_of_the_lists() -> None:
    """Keys holding the same ranks in different lists get bit-identical scores whatever
    the order of the lists (summed with fsum), so the tie always breaks the same way."""
    lists = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]   # every key holds ranks 1, 2 and 3
    results = {tuple(rrf(list(p))) for p in itertools.permutations(lists)}
    assert len(results) == 1
    (fused,) = results
    assert [k for k, _ in fused] == [1, 2, 3]
    assert len({score for _, score in fused}) == 1


def test_a_key_repeated_in_one_list_counts_once_at_its_best_rank() -> None:
    """Duplicates within one ranking do not add score."""
    assert dict(rrf([[1, 2, 1, 1]]))[1] == 1 / 61
    assert fuse([[1, 2, 1]])[0].ranks == (1,)


def test_ranks_per_list_are_reported() -> None:
    """FusedHit.ranks holds each list's 1-based rank, None where the key is absent."""
    hits = {h.key: h for h in fuse([[1, 2], [], [2, 3]])}
    assert hits[1] == FusedHit(1, 1 / 61, (1, None, None))
    assert hits[2].ranks == (2, None, 1)
    assert hits[2].best_rank == 1
    assert hits[3].ranks == (None, None, 2)


def test_empty_input_fuses_to_nothing() -> None:
    """No lists, or only empty lists, give an empty fusion."""
    assert rrf([]) == []
    assert rrf([[], []]) == []


def test_a_single_list_keeps_its_order() -> None:
    """Fusing one list (BM25-only search) preserves its order."""
    assert [k for k, _ in rrf([[5, 3, 9, 1]])] == [5, 3, 9, 1]


def test_negative_k_is_refused() -> None:
    """k below zero would make scores blow up or change sign: ValueError."""
    with pytest.raises(ValueError, match="k must be >= 0"):
        rrf([[1]], k=-1)


def test_weights_scale_each_rankings_contribution() -> None:
    """Weighted RRF: a rank adds weight / (k + rank); weight 0 removes a ranking from the
    order, and weights 1 and 1 are plain RRF. best_score is a key first everywhere."""
    text, vector = [1, 2, 3], [3, 2, 1]
    assert rrf([text, vector], k=60, weights=[1, 1]) == rrf([text, vector], k=60)
    assert [key for key, _ in rrf([text, vector], k=60, weights=[1, 0])] == text
    assert [key for key, _ in rrf([text, vector], k=60, weights=[0, 1])] == vector
    scores = dict(rrf([text, vector], k=60, weights=[0.3, 0.7]))
    assert scores[3] == pytest.approx(0.3 / 63 + 0.7 / 61)
    assert best_score([0.3, 0.7], k=60) == pytest.approx(1 / 61)
    assert rrf([[5], [5]], k=60, weights=[0.3, 0.7])[0][1] == pytest.approx(
        best_score([0.3, 0.7], k=60))


@pytest.mark.parametrize("weights", [[1.0], [1.0, -0.5]])
def test_bad_weights_are_refused(weights: list[float]) -> None:
    """Weights must be one per ranking and none negative."""
    with pytest.raises(ValueError, match="one weight >= 0 per ranking"):
        rrf([[1], [2]], weights=weights)
