"""Reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009).

Each ranking is a best-first list of chunk keys. A key's fused score is the sum over the
rankings that contain it of ``1 / (k + rank)``, rank 1-based. Scores only compare keys of
one fusion; they are not probabilities and do not compare across queries.

``k`` flattens the head of each list. With the usual ``k = 60`` a first place is worth
only 15 % more than a tenth, and a key that both retrievers rank within their top 61
beats a key ranked first by only one of them; with ``k = 1`` a first place is worth 5.5
tenths and beats a key that both rank third or lower (third and third ties on score,
and the tie goes to the better single rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FusedHit:
    """One key of a fusion.

    Attributes:
        key: the chunk key.
        score: the fused score, ``sum(1 / (k + rank))`` over the rankings holding the key.
        ranks: the key's 1-based rank in each input ranking, ``None`` where it is absent;
            one entry per ranking, in input order.
    """

    key: int
    score: float
    ranks: tuple[int | None, ...]

    @property
    def best_rank(self) -> int:
        """The key's best (smallest) rank over the rankings that hold it."""
        return min(r for r in self.ranks if r is not None)


def fuse(rankings: Sequence[Sequence[int]], k: int = 60,
         weights: Sequence[float] | None = None) -> list[FusedHit]:
    """Fuse best-first rankings of keys by (weighted) RRF, keeping each key's ranks.

    A key repeated within one ranking counts once, at its first (best) place. Empty
    rankings are allowed and contribute nothing. With ``weights`` (one per ranking, none
    negative), a rank contributes ``weight / (k + rank)``; without, every weight is 1.

    The order is total and deterministic: fused score descending, then best single rank
    ascending, then key ascending. Scores are summed with :func:`math.fsum`, so keys with
    the same multiset of ranks get bit-identical scores whatever the order of the lists.

    Raises:
        ValueError: ``k`` is negative, or the weights are negative or not one per ranking.
    """
    if k < 0:
        raise ValueError(f"rrf k must be >= 0, got {k}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings) or any(w < 0 for w in weights):
        raise ValueError(f"one weight >= 0 per ranking, got {list(weights)}")
    ranks: dict[int, list[int | None]] = {}
    for i, ranking in enumerate(rankings):
        for rank, key in enumerate(ranking, start=1):
            slots = ranks.setdefault(key, [None] * len(rankings))
            if slots[i] is None:
                slots[i] = rank
    hits = [
        FusedHit(key, math.fsum(w / (k + r) for w, r in zip(weights, slots, strict=True)
                                if r is not None), tuple(slots))
        for key, slots in ranks.items()
    ]
    hits.sort(key=lambda h: (-h.score, h.best_rank, h.key))
    return hits


def rrf(rankings: Sequence[Sequence[int]], k: int = 60,
        weights: Sequence[float] | None = None) -> list[tuple[int, float]]:
    """Fuse best-first rankings of keys by RRF: ``(key, score)``, best first.

    See :func:`fuse` for the weights, the order, duplicate keys and errors.
    """
    return [(h.key, h.score) for h in fuse(rankings, k, weights)]


def best_score(weights: Sequence[float], k: int = 60) -> float:
    """The fused score of a key ranked first by every ranking: what normalises fused
    scores to [0, 1] (1 for a key every ranking puts first)."""
    return math.fsum(w / (k + 1) for w in weights)
