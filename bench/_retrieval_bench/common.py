"""What ``bench.bench_retrieval`` shares: constants, data, the embedding child, the machine."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench._retrieval import (
    Doc,
    Vec,
    predict_chunks,
)
from bench._support import (
    foreign_benchmarks,
)
from daemon.services.retrieval_bridge import ChildEmbedder
from retrieval import RetrievalLimits
from tests.support.embedder import FixedEmbedder

Mat = npt.NDArray[np.float32]

DIM = 384

QUALITY_HEADING = "## Retrieval quality"
LATENCY_HEADING = "## Retrieval latency"
INGEST_HEADING = "## Ingest throughput"

# BM25 nDCG@10 from each collection's README ("BM25 sanity check": tantivy 0.27.0, one
# title + text field, en_stem, parse_query_lenient, sanitized query text).
README_BM25 = {"cisi": 0.3082, "cranfield": 0.3677, "medline": 0.7038, "vaswani": 0.4385}

DEEP = 100            # candidates per side for recall@100
HYBRID_K = 10         # hits asked of Retriever.search in the latency runs
SEARCH_N = 25         # candidates per side of the 25/25 rows (the default until
                      # bench_fusion moved it to 100/100)
SWEEP_K = (1, 5, 10, 20, 30, 60, 100, 200)
SWEEP_DEPTH = (10, 25, 50, 100)
MIX_NOISE = 0.05      # norm of the Gaussian perturbation of the 1M-scale mixtures
WORD = re.compile(r"\w+")


# -- data -------------------------------------------------------------------------------


def synthetic_docs(originals: Sequence[Doc], count: int, limits: RetrievalLimits,
                   seed: int = 20240601) -> list[Doc]:
    """``count`` new one-chunk documents, each the concatenation of two different original
    one-chunk documents ``a`` and ``b`` (``a.text + " " + b.text``, title of ``a``), both
    short enough that the pair stays one chunk. Pairs are drawn at random (seeded), never
    repeated."""
    half = (limits.chunk_size - 1) // 2
    pool = [d for d in originals if len(d.chunks) == 1 and len(d.text) <= half]
    if len(pool) < 2:
        raise SystemExit("too few short documents to build synthetic ones")
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, int]] = set()
    out: list[Doc] = []
    while len(out) < count:
        i, j = (int(x) for x in rng.integers(0, len(pool), 2))
        if i == j or (i, j) in seen:
            continue
        seen.add((i, j))
        a, b = pool[i], pool[j]
        text = a.text + " " + b.text
        chunks = predict_chunks(text, limits)
        if len(chunks) != 1:
            continue
        out.append(Doc("synth", str(len(out) + 1), a.title, text, chunks,
                       (a.chunks[0], b.chunks[0])))
    return out


def normalise(v: Mat) -> Mat:
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    out: Mat = (v / np.maximum(norms, 1e-12)).astype(np.float32)
    return out


# -- the embedding child ----------------------------------------------------------------


async def embed_batched(embedder: ChildEmbedder, texts: Sequence[str], batch: int,
                        deadline: float | None = None) -> tuple[dict[str, Vec], list[str], float]:
    """Embed ``texts`` through ChildEmbedder in batches, until done or ``deadline``
    (perf_counter). A failing batch is retried one text at a time; texts that still fail
    (too long for the model) are returned. Returns (vectors, failed, seconds)."""
    out: dict[str, Vec] = {}
    failed: list[str] = []
    began = time.perf_counter()
    todo = list(dict.fromkeys(texts))
    for i in range(0, len(todo), batch):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        part = todo[i:i + batch]
        try:
            vectors = await embedder.embed(part)
        except Exception:
            for text in part:
                try:
                    out[text] = np.asarray((await embedder.embed([text]))[0], dtype=np.float32)
                except Exception:
                    failed.append(text)
            continue
        out.update((t, np.asarray(v, dtype=np.float32))
                   for t, v in zip(part, vectors, strict=True))
    return out, failed, time.perf_counter() - began


class TableEmbedder(FixedEmbedder):
    """The ``retrieval.Embedder`` the bench hands the Retriever: vectors looked up by text
    in a table filled by the real model (batched, beforehand); a text not in the table
    goes to the live child (counted in ``misses``); token counts come from the live child
    (as in production)."""

    def __init__(self, table: dict[str, Vec], live: ChildEmbedder | None, model_id: str,
                 context: int) -> None:
        super().__init__(model_id, context)
        self.table = table
        self.live = live
        self.misses = 0
        self.token_calls = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            if self.live is None:
                raise RuntimeError(f"{len(missing)} texts have no vector")
            self.misses += len(missing)
            vectors = await self.live.embed(missing)
            self.table.update((t, np.asarray(v, dtype=np.float32))
                              for t, v in zip(missing, vectors, strict=True))
        return [self.table[t].tolist() for t in texts]

    async def count_tokens(self, text: str) -> int:
        self.token_calls += 1
        if self.live is None:
            return len(text) // 3
        return await self.live.count_tokens(text)


# -- machine state ----------------------------------------------------------------------


@dataclass
class StageNote:
    stage: str
    load: tuple[float, float, float]
    foreign: list[str]


NOTES: list[StageNote] = []


def stage(name: str) -> None:
    """Note the load and any other benchmark before a timed stage (and say so)."""
    foreign = foreign_benchmarks()
    load1, load5, load15 = os.getloadavg()
    NOTES.append(StageNote(name, (load1, load5, load15), foreign))
    print(f"\n== {name} (load {load1:.2f} {load5:.2f} {load15:.2f})", flush=True)
    for line in foreign:
        print(f"   WARNING: another benchmark is running: {line}", flush=True)


def wait_quiet(limit: float) -> None:
    deadline = time.monotonic() + limit
    while (foreign := foreign_benchmarks()) and time.monotonic() < deadline:
        print(f"waiting for other benchmarks to finish: {foreign}", flush=True)
        time.sleep(15)
    if foreign_benchmarks():
        raise SystemExit("other benchmarks are still running; not measuring")


def proc_kb(field_name: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: ``5`` to ``/proc/self/clear_refs``)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
