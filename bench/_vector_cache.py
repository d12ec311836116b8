"""Embedding vectors for benches, cached on disk by text hash and model: a bench run
again on the same collections reads them instead of embedding every text again."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench._retrieval import Child, Vec
from bench._retrieval_bench.common import embed_batched


def hashed(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_cache(cache: Path | None, model: str, wanted: Sequence[str]) -> dict[str, Vec] | None:
    """The vectors of ``wanted`` from ``cache``, if it holds them all, made by ``model``."""
    if cache is None or not cache.exists():
        return None
    with np.load(cache) as data:
        if str(data["model"]) != model:
            return None
        row = {str(h): i for i, h in enumerate(data["hashes"])}
        matrix = data["vectors"]
        table = {t: matrix[row[hashed(t)]] for t in wanted if hashed(t) in row}
    return table if len(table) == len(wanted) else None


def cached_part(cache: Path | None, model: str, wanted: Sequence[str]) -> dict[str, Vec]:
    """The vectors of those of ``wanted`` that ``cache`` holds (made by ``model``)."""
    if cache is None or not cache.exists():
        return {}
    with np.load(cache) as data:
        if str(data["model"]) != model:
            return {}
        row = {str(h): i for i, h in enumerate(data["hashes"])}
        matrix = data["vectors"]
        return {t: matrix[row[hashed(t)]] for t in set(wanted) if hashed(t) in row}


def write_cache(cache: Path, model: str, table: dict[str, Vec]) -> None:
    keys = list(table)
    np.savez(cache, model=np.array(model), hashes=np.array([hashed(t) for t in keys]),
             vectors=np.stack([table[t] for t in keys]).astype(np.float32))


async def vectors_for(texts: Sequence[str], child: Child, cache: Path | None,
                      batch: int) -> tuple[dict[str, Vec], str]:
    """Every text's vector (texts the model refuses are left out), through the child or
    from ``cache`` (written when it did not hold them); and a sentence saying which."""
    wanted = list(dict.fromkeys(texts))
    model = child.embedder.model_id
    cached = read_cache(cache, model, wanted)
    if cached is not None:
        return cached, (f"{len(wanted)} distinct chunk and query texts, vectors read from "
                        f"`{cache}` (made by the same model earlier)")
    table, failed, took = await embed_batched(child.embedder, wanted, batch)
    if cache is not None:
        write_cache(cache, model, table)
    return table, (f"{len(wanted)} distinct chunk and query texts embedded through "
                   f"ChildEmbedder in batches of {batch}: {took:.0f} s "
                   f"({len(wanted) / took:.1f} texts/s), {len(failed)} refused")
