"""What storing a text once costs a filtered search (issue 30), in process.

3,000 texts of 40 words drawn from a small operations vocabulary, each a document of one
of four sources; every fifth text pushed again under another id in a random source (600
copies: 3,600 documents). 200 queries of three words, k = 10, in text, vector and hybrid
mode, unfiltered, filtered by one source, and by two sources and two categories (a filter
a shared text's holders can pass only together). HashEmbedder vectors (32 dimensions):
the cost is the stores', not an embedding model's. Run from the root of a tree to measure
that tree: ``python -m bench.bench_stored_once`` (numbers in RESULTS.md, "Stored once").
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from retrieval import Filters, Query, Retriever
from tests.support.embedder import HashEmbedder

WORDS = tuple(" ".join((
    "disk nginx logs vpn tunnel backup restic kernel quota dns cache switch port",
    "memory leak worker pool upgrade config reload database replica index vacuum",
    "cert expiry tls proxy route bgp peer flap latency queue broker")).split(" "))
FILTERS = (("none", None), ("source", Filters(sources=("b",))),
           ("source+category", Filters(sources=("b", "c"), categories=("cat-a", "cat-b"))))


async def main() -> None:
    """Ingest the corpus, then time each filter and mode; print the table rows."""
    rng = random.Random(7)
    r = Retriever(Path(tempfile.mkdtemp(prefix="stored-once-")), lambda: HashEmbedder("m"))
    await r.open()
    for s in "abcd":
        await r.add_source(s, category=f"cat-{s}")
    texts = [" ".join(rng.choice(WORDS) for _ in range(40)) + f" note {i}"
             for i in range(3000)]
    n = 0
    began = time.perf_counter()
    for i, t in enumerate(texts):
        await r.upsert(rng.choice("abcd"), f"t{i}", t, doc_id=f"d{i}")
        n += 1
        if i % 5 == 0:  # a copy under another id, in a random source
            await r.upsert(rng.choice("abcd"), f"copy{i}", t, doc_id=f"c{i}")
            n += 1
    ingest = time.perf_counter() - began
    print(f"ingest {n} documents one at a time: {ingest:.1f} s, {n / ingest:.0f} docs/s")
    status = await r.status()
    queries = [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(200)]
    for name, f in FILTERS:
        for mode in ("text", "vector", "hybrid"):
            times = []
            for q in queries:
                t0 = time.perf_counter()
                await r.search(q, k=10, filters=f, options=Query(mode=mode))
                times.append((time.perf_counter() - t0) * 1000)
            times.sort()
            print(f"{name:16s} {mode:6s} p50 {statistics.median(times):6.2f} ms  "
                  f"p95 {times[int(len(times) * 0.95)]:6.2f} ms")
    print(f"documents {n}, chunks {status.chunks}, vectors {status.vectors}")
    await r.close()


if __name__ == "__main__":
    asyncio.run(main())
