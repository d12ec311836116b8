"""Score fusions beside RRF: distribution-based (DBSF) and a convex combination.

Each input is one index's candidates, best first, as ``(key, score)`` with higher scores
better (BM25 scores; cosine similarities). RRF reads only the ranks; these two read the
scores, each list normalised on its own so that BM25's unbounded scores and cosine
similarities can be added:

- **dbsf** (distribution-based score fusion, as Qdrant publishes it): a list's scores are
  mapped by ``(s - (mean - 3 sd)) / (6 sd)``, clipped to [0, 1], mean and population
  standard deviation over that list's candidates. A list's scores all equal (one
  candidate, say) map to 0.5, where its mean always maps.
- **convex** (min-max normalisation, then a convex combination): ``(s - min) / (max - min)``
  per list; all equal map to 1 (the top of the list).
- **zscore** (measured by the benches, not offered by Search): ``(s - mean) / sd``; all
  equal map to 0.

The fused score of a key is ``sum(weight_i * normalised_i)`` over the lists; a key absent
from a list gets that list's floor (0 for dbsf and convex, the list's lowest z for
zscore), being at most as good as its last candidate. With weights ``alpha`` and
``1 - alpha``, convex is the textbook ``alpha * text + (1 - alpha) * vector``; other
weights give the same order (divided by their sum, :func:`ceiling`). The order is
:func:`~retrieval.search._fusion.fuse`'s: score descending, then best single rank, then key.

**Short lexical lists** (issue 30): a BM25 list holds fewer candidates than it was asked
for when fewer documents hold the query's words; every document missing from it scores 0
there. Normalised alone, such a list misleads: a list of one (a word only one document
holds, an error code, a host name) is its own mean, so DBSF put its match in the middle
(0.5) and a vector list weighted 0.6 buried it. Given the lists' depths
(:func:`fuse_scored`), a short lexical list is normalised among those zeros (its few
matches map to the top; under DBSF, whose 3 sd band they lie beyond, the band's top is
anchored at the best match so that they keep BM25's order) and its weight rises toward
the other list's (:func:`honest_weights`), so a lone exact match ties at worst with the
vectors' first. A full list (every natural-language query on a real corpus) is fused
exactly as above.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

from ._fusion import FusedHit, best_score, fuse

FUSIONS: tuple[str, ...] = ("rrf", "dbsf", "convex")
"""The fusions Search offers (``Query.fusion``, ``retrieval.fusion``)."""

SCORED: tuple[str, ...] = ("dbsf", "convex", "zscore")
"""The fusions that read scores (``zscore`` is a bench's, not Search's)."""

Scored = Sequence[tuple[int, float]]
G = TypeVar("G", bound=Hashable)


def _padded(scores: Sequence[float], pad: int) -> list[float]:
    return [*scores, *([0.0] * pad)] if pad > 0 else list(scores)


def _dbsf(scores: Sequence[float], pad: int = 0) -> tuple[list[float], float]:
    every = _padded(scores, pad)
    mean, sd = statistics.fmean(every), statistics.pstdev(every)
    if sd == 0 or not math.isfinite(sd):
        return [0.5] * len(scores), 0.0
    low, high = mean - 3 * sd, mean + 3 * sd
    if pad > 0:
        # Among the zeros of a short list its few matches lie beyond mean + 3 sd: clipped,
        # they would all map to 1 and lose BM25's order among them. The top is anchored
        # at the best of them instead (a lone match still maps to 1).
        high = max(high, *scores)
    return [min(1.0, max(0.0, (s - low) / (high - low))) for s in scores], 0.0


def _minmax(scores: Sequence[float], pad: int = 0) -> tuple[list[float], float]:
    every = _padded(scores, pad)
    low, high = min(every), max(every)
    if high == low:
        return [1.0] * len(scores), 0.0
    return [(s - low) / (high - low) for s in scores], 0.0


def _zscore(scores: Sequence[float], pad: int = 0) -> tuple[list[float], float]:
    every = _padded(scores, pad)
    mean, sd = statistics.fmean(every), statistics.pstdev(every)
    if sd == 0 or not math.isfinite(sd):
        return [0.0] * len(scores), 0.0
    z = [(s - mean) / sd for s in every]
    return z[:len(scores)], min(z)


NORMALISE: dict[str, Callable[[Sequence[float], int], tuple[list[float], float]]] = {
    "dbsf": _dbsf, "convex": _minmax, "zscore": _zscore}
"""Each scored fusion's normalisation: a list's scores and how many zeros pad it ->
(normalised scores, floor for absent)."""


def normalised(method: str, scores: Sequence[float], pad: int = 0) -> list[float]:
    """``scores`` (one list's, any order) as ``method`` normalises them, the statistics
    taken over them and ``pad`` zeros."""
    return NORMALISE[method](scores, pad)[0] if scores else []


def honest_weights(lists: Sequence[Scored], weights: Sequence[float],
                   depths: Sequence[int | None] | None) -> list[float]:
    """``weights``, each short lexical list's raised toward the largest other weight.

    A list with a depth (``depths[i]``: the candidates it was asked for, where a document
    missing from it scores 0: BM25) that holds ``n`` of them, ``0 < n < depth``, weighs at
    least ``max(other weights) * (depth - n + 1) / depth``: a list of one (a word only one
    document holds) weighs as much as the heaviest other list, so its match ties at worst
    with that list's first; a list nearly full keeps its own weight.

    Raises:
        ValueError: weights negative or not one per list.
    """
    if len(weights) != len(lists) or any(w < 0 for w in weights):
        raise ValueError(f"one weight >= 0 per list, got {list(weights)}")
    out = list(weights)
    if not depths or len(lists) < 2:
        return out
    for i, (ranking, depth) in enumerate(zip(lists, depths, strict=True)):
        n = len({key for key, _ in ranking})
        if depth is None or not 0 < n < depth:
            continue
        heaviest = max(w for j, w in enumerate(weights) if j != i)
        out[i] = max(out[i], heaviest * (depth - n + 1) / depth)
    return out


def fuse_scored(lists: Sequence[Scored], method: str, *, weights: Sequence[float],
                k: int = 60, depths: Sequence[int | None] | None = None) -> list[FusedHit]:
    """Fuse best-first ``(key, score)`` lists by ``method`` (``rrf``, ``dbsf``,
    ``convex`` or ``zscore``; ``k`` is RRF's constant), best first.

    A key repeated within one list counts once, at its first place. ``FusedHit.ranks``
    are the keys' 1-based ranks in each list, as for RRF.

    ``depths`` (one per list, or None) names the lexical lists: ``depths[i]`` is the
    candidates list ``i`` was asked for when a document missing from it scores 0 there
    (BM25: it holds none of the query's words), None for a list without such a floor
    (cosine similarities). A lexical list shorter than its depth (fewer documents hold
    the query's words) is taken as what it is: its scores are normalised among the
    missing documents' zeros (padded to ``depth``), so its few matches map to the top
    of the range, not to the middle of a list of one; and its weight rises
    (:func:`honest_weights`). The weights used are ``honest_weights(lists, weights,
    depths)``: :func:`ceiling` of those normalises the fused scores.

    Raises:
        ValueError: an unknown method, weights negative or not one per list.
    """
    return _fuse(lists, method, honest_weights(lists, weights, depths), k, depths)


def _fuse(lists: Sequence[Scored], method: str, weights: Sequence[float], k: int,
          depths: Sequence[int | None] | None) -> list[FusedHit]:
    """:func:`fuse_scored` with the weights as given (a short list's already raised)."""
    if method == "rrf":
        return fuse([[key for key, _ in ranking] for ranking in lists], k, weights)
    if method not in NORMALISE:
        raise ValueError(f"fusion must be one of rrf, {', '.join(SCORED)}; got {method!r}")
    ranks: dict[int, list[int | None]] = {}
    parts: dict[int, list[float]] = {}
    floors = []
    for i, ranking in enumerate(lists):
        first: dict[int, float] = {}
        for key, score in ranking:
            first.setdefault(key, score)
        depth = depths[i] if depths else None
        pad = depth - len(first) if depth is not None else 0
        values, floor = NORMALISE[method](list(first.values()), pad) if first else ([], 0.0)
        floors.append(floor)
        for rank, (key, value) in enumerate(zip(first, values, strict=True), start=1):
            ranks.setdefault(key, [None] * len(lists))[i] = rank
            parts.setdefault(key, [math.nan] * len(lists))[i] = value
    hits = []
    for key, slots in ranks.items():
        got = parts[key]
        hits.append(FusedHit(key, math.fsum(
            w * (floors[i] if math.isnan(got[i]) else got[i])
            for i, w in enumerate(weights)), tuple(slots)))
    hits.sort(key=lambda h: (-h.score, h.best_rank, h.key))
    return hits


def ceiling(method: str, weights: Sequence[float], k: int = 60) -> float:
    """The best fused score ``method`` can give (a key first, or at the top of the clip,
    in every list): what normalises fused scores to [0, 1]."""
    return best_score(weights, k) if method == "rrf" else math.fsum(weights)


def per_group(ranking: Scored, group_of: Mapping[int, G]) -> list[tuple[G, float]]:
    """``ranking`` with one entry per group (a document): its best (first) chunk's score,
    in the order of those first chunks; keys without a group are dropped."""
    out: dict[G, float] = {}
    for key, score in ranking:
        group = group_of.get(key)
        if group is not None and group not in out:
            out[group] = score
    return list(out.items())


def by_document(lists: Sequence[Scored], chunks: Sequence[FusedHit],
                doc_of: Mapping[int, str], method: str, *, weights: Sequence[float],
                k: int = 60, depths: Sequence[int | None] | None = None
                ) -> tuple[list[FusedHit], dict[int, list[int]]]:
    """Fuse per document: each list reduced to one entry per document (its best chunk
    there, :func:`per_group`), then fused by ``method``. So a document whose best BM25
    chunk and best vector chunk differ gets both lists' credit, where chunk fusion would
    rank two half-supported chunks.

    Args:
        lists, weights, depths: the candidate lists and their weights and depths, as for
            :func:`fuse_scored` (a lexical list's documents counted against its depth).
        chunks: the same lists fused per chunk: each document is represented by its best
            chunk in this order.
        doc_of: chunk key -> document id (keys missing: dropped, e.g. deleted meanwhile).

    Returns:
        The documents fused, best first, each keyed by its representative chunk (its
        ``ranks`` are the document's ranks among the lists' documents); and each
        representative's other chunks among the candidates, in chunk-fusion order.
    """
    representative: dict[str, int] = {}
    others: dict[int, list[int]] = {}
    for hit in chunks:
        doc = doc_of.get(hit.key)
        if doc is None:
            continue
        if doc in representative:
            others[representative[doc]].append(hit.key)
        else:
            representative[doc] = hit.key
            others[hit.key] = []
    group = {key: representative[doc] for key, doc in doc_of.items() if doc in representative}
    # A list that was full holds the best chunks of more documents than it shows: only a
    # short one (every match there) has zeros below it, counted per document.
    short = [d if d is not None and len(ranking) < d else None
             for ranking, d in zip(lists, depths or [None] * len(lists), strict=True)]
    # The weights are the chunk lists' (what Search's ceiling is computed from).
    docs = _fuse([per_group(ranking, group) for ranking in lists], method,
                 honest_weights(lists, weights, depths), k, short)
    return docs, others
