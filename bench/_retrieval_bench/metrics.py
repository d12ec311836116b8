"""The metrics of ``bench.bench_retrieval``: nDCG, recall, timings, exact nearest neighbours."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from bench._retrieval import (
    Vec,
)
from bench._retrieval_bench.common import Mat

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
