"""Background re-embedding benchmark: the vector backfill's throughput as a fraction of the
embedding child's own.

    .venv/bin/python -m bench.bench_backfill [--chunks 640] [--rounds 3] [--no-write]
        [--out bench/RESULTS.md]

One process, one embedding child (an in-process daemon runs all-MiniLM-L6-v2 on
llama-server with production defaults: :func:`bench._retrieval.start_child`). The corpus:
CISI documents (every chunk at most 1300 characters, so none is over the child's
context) until ``--chunks`` chunks. Each round measures, in an order alternating round by
round:

* **child**: the chunk texts POSTed straight to the child's ``/v1/embeddings``, one
  request at a time, in batches of ``retrieval.embed_batch`` (32): the page size the
  backfill embeds by, one request at a time too; base64 float32 vectors decoded with
  numpy, as llamad asks its child (the least a client can add to the child's time);
* **backfill**: a fresh Retriever ingests the documents while its embedder provider gives
  None (embeddings unavailable: BM25-only, no vector cached), then the provider gives
  the daemon's own embedder (``make_provider``: ``ChildEmbedder`` through the router,
  admission and the supervisor's client) and ``Retriever.backfill()`` runs until every
  chunk has a vector: reading pages from SQLite, embedding, caching the vectors (one
  SQLite transaction each), making the HNSW index and adding each page to it.

chunks/s per way is the median over rounds; the ratio is the median of the per-round
ratios (each round's two measurements are seconds apart, under the same load). The
machine is shared: the 1-minute load and the cores other processes used during each
measurement are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import _support as support
from bench._direct import child_http
from bench._retrieval import DATA_DIR, Child, Doc, load_collection, start_child
from daemon.services.retrieval_bridge import ChildEmbedder, make_provider
from retrieval import RetrievalLimits, Retriever, Vector
from tests.support.embedder import FixedEmbedder

SECTION = "## Background re-embedding throughput"
MAX_CHUNK_CHARS = 1300


@dataclass
class Measure:
    way: str
    seconds: float
    chunks: int
    load: float             # 1-minute load average at the end
    foreign: float          # cores other processes used meanwhile
    in_requests: float = 0.0  # seconds inside embedding requests (the backfill's)

    @property
    def rate(self) -> float:
        return self.chunks / self.seconds


def corpus(chunks: int, limits: RetrievalLimits) -> list[Doc]:
    docs: list[Doc] = []
    total = 0
    for d in load_collection(DATA_DIR / "cisi", "cisi", limits).docs:
        if total >= chunks:
            break
        if all(len(c) <= MAX_CHUNK_CHARS for c in d.chunks):
            docs.append(d)
            total += len(d.chunks)
    return docs


async def direct(child: Child, texts: list[str], batch: int) -> float:
    """POST ``texts`` to the child's /v1/embeddings in batches of ``batch``, one request
    at a time, vectors as base64 float32; returns the seconds it took."""
    async with child_http(child.socket, child.pid) as http:
        began = time.perf_counter()
        for i in range(0, len(texts), batch):
            part = texts[i:i + batch]
            resp = await http.post("/v1/embeddings",
                                   json={"input": part, "encoding_format": "base64"})
            resp.raise_for_status()
            rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                    for d in resp.json()["data"]]
            if len(rows) != len(part):
                raise RuntimeError("the child returned the wrong number of vectors")
        return time.perf_counter() - began


async def child_alone(child: Child, texts: list[str], batch: int) -> Measure:
    before = support.cpu_snap()
    seconds = await direct(child, texts, batch)
    return Measure("child", seconds, len(texts), os.getloadavg()[0],
                   support.foreign_cores(before, support.cpu_snap()))


class Timed(FixedEmbedder):
    """The daemon's ChildEmbedder as it is, adding up the time its embed calls take."""

    def __init__(self, inner: ChildEmbedder, clock: list[float]) -> None:
        super().__init__(inner.model_id, inner.context)
        self.inner = inner
        self.clock = clock

    async def embed(self, texts: Sequence[str]) -> Sequence[Vector]:
        began = time.perf_counter()
        try:
            return await self.inner.embed(texts)
        finally:
            self.clock[0] += time.perf_counter() - began

    async def count_tokens(self, text: str) -> int:
        return await self.inner.count_tokens(text)


async def backfill(child: Child, docs: list[Doc], chunks: int, limits: RetrievalLimits,
                   root: Path) -> Measure:
    provider = make_provider(child.daemon.router, child.daemon.children)
    available = False
    in_requests = [0.0]

    def gated() -> Timed | None:
        inner = provider() if available else None
        return Timed(inner, in_requests) if inner is not None else None

    r = Retriever(root, gated, limits)
    await r.open()
    try:
        await r.add_source("cisi")
        for d in docs:  # BM25-only: the embedder is unavailable
            await r.upsert(d.source, d.title, d.text, doc_id=d.doc_id, kind="text")
        status = await r.status()
        if (status.chunks, status.vectors, status.embedded_chunks) != (chunks, 0, 0):
            raise RuntimeError(f"unexpected corpus before the backfill: {status}")
        available = True
        before = support.cpu_snap()
        began = time.perf_counter()
        if not r.backfill():
            raise RuntimeError("the backfill did not start")
        task = r.backfill_task
        assert task is not None
        await task
        seconds = time.perf_counter() - began
        foreign = support.foreign_cores(before, support.cpu_snap())
        status = await r.status()
        if status.vectors != chunks or status.backfill.failed or status.backfill.last_error:
            raise RuntimeError(f"the backfill did not embed every chunk: {status.backfill}")
    finally:
        await r.close()
    return Measure("backfill", seconds, chunks, os.getloadavg()[0], foreign, in_requests[0])


async def run(args: argparse.Namespace) -> list[str]:
    limits = RetrievalLimits()
    docs = corpus(args.chunks, limits)
    texts = [t for d in docs for t in d.chunks]
    batch = limits.embed_batch
    print(f"{len(docs)} documents, {len(texts)} chunks, batches of {batch}", flush=True)
    rounds: list[tuple[Measure, Measure]] = []
    with tempfile.TemporaryDirectory(prefix="llamad-bench-backfill-") as tmp:
        child = await start_child(Path(tmp))
        try:
            await direct(child, texts[:batch], batch)  # warm-up
            for i in range(args.rounds):
                got: dict[str, Measure] = {}
                for way in (("child", "backfill") if i % 2 == 0 else ("backfill", "child")):
                    if way == "child":
                        got[way] = await child_alone(child, texts, batch)
                    else:
                        got[way] = await backfill(child, docs, len(texts), limits,
                                                  Path(tmp) / f"round-{i}")
                    m = got[way]
                    print(f"  round {i + 1} {way}: {m.rate:.1f} chunks/s ({m.seconds:.1f} s, "
                          f"{m.in_requests:.1f} s in requests; load {m.load:.2f}, others "
                          f"{m.foreign:.2f} cores)", flush=True)
                rounds.append((got["child"], got["backfill"]))
            argv = child.argv
        finally:
            await child.daemon.shutdown()
    return section(args, docs, texts, batch=batch, rounds=rounds, argv=argv)


def section(args: argparse.Namespace, docs: list[Doc], texts: list[str], *, batch: int,
            rounds: list[tuple[Measure, Measure]], argv: list[str]) -> list[str]:
    ratios = [b.rate / c.rate for c, b in rounds]
    child_rate = statistics.median(c.rate for c, _ in rounds)
    backfill_rate = statistics.median(b.rate for _, b in rounds)
    ratio = statistics.median(ratios)
    loads = [m.load for pair in rounds for m in pair]
    foreign = [m.foreign for pair in rounds for m in pair]
    lines = [SECTION, "", *support.environment(
        "python -m bench.bench_backfill" + (f" --chunks {args.chunks}" if args.chunks != 640
                                            else "")
        + (f" --rounds {args.rounds}" if args.rounds != 3 else "")),
        f"- Embedding child (llamad's production defaults): `{' '.join(argv)}`",
        f"- Load: 1-minute load {min(loads):.2f}-{max(loads):.2f} at the end of the "
        f"measurements; other processes used {min(foreign):.2f}-{max(foreign):.2f} cores "
        "during them (other helpers' tests on this 2-core machine), hence the rounds "
        "interleaved and the median of per-round ratios.",
        f"- Corpus: {len(docs)} CISI documents, {len(texts)} chunks (each at most "
        f"{MAX_CHUNK_CHARS} characters, {sum(map(len, texts)) / len(texts):.0f} on "
        f"average), ingested while the embedder was unavailable (BM25-only, nothing "
        "cached); batches of "
        f"{batch} (retrieval.embed_batch), one request at a time both ways.",
        "- child: POST /v1/embeddings to the child's socket (httpx; base64 float32 "
        "vectors decoded with numpy, as llamad asks its child). backfill: "
        "`Retriever.backfill()` through the daemon's own embedder (`make_provider`: "
        "router, admission, supervisor client), from start to every chunk in the HNSW "
        "index (SQLite pages, vectors cached in SQLite, index made and added to).",
        "",
    ]
    rows = [[str(i + 1), "child first" if i % 2 == 0 else "backfill first",
             f"{c.rate:.1f}", f"{b.rate:.1f}", f"{b.rate / c.rate:.3f}",
             f"{b.in_requests / b.seconds:.1%}",
             f"{max(c.load, b.load):.2f}", f"{c.foreign:.2f} / {b.foreign:.2f}"]
            for i, (c, b) in enumerate(rounds)]
    lines += support.table(["round", "order", "child chunks/s", "backfill chunks/s",
                            "backfill / child", "backfill time in embedding requests",
                            "load", "others' cores (child / backfill)"], rows)
    lines += ["",
              f"Median over {len(rounds)} rounds: child **{child_rate:.1f} chunks/s**, "
              f"backfill **{backfill_rate:.1f} chunks/s**; median per-round ratio "
              f"**{ratio:.3f}** of the child's own throughput. The backfill spends "
              f"{statistics.median(b.in_requests / b.seconds for _, b in rounds):.1%} "
              "(median) of its time inside embedding requests; the rest is its own work "
              "between them (SQLite page reads, caching each page's vectors in one "
              "transaction, adding them to the HNSW index), during which the child idles: "
              "one request at a time by design, leaving the child room for queries and "
              "ingest.",
              "",
              "Reproduce: `.venv/bin/python -m bench.bench_backfill`"]
    return lines


def main() -> None:
    p = support.bench_parser("bench.bench_backfill", __doc__)
    p.add_argument("--chunks", type=int, default=640)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    args = p.parse_args()
    lines = asyncio.run(run(args))
    print("\n".join(lines))
    if not args.no_write:
        support.write_sections(args.out, [lines])


if __name__ == "__main__":
    main()
