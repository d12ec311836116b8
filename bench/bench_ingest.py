"""Live-ingest step of ``bench.bench_retrieval`` alone: ``Retriever.upsert`` against a live
embedding child vs the same chunk texts sent straight to it.

Same 600-document sample across the collections and same measurement as the full run's
"Ingest throughput" (see :func:`bench._retrieval.live_ingest`), without the 30 minutes
of the other steps. Prints the fraction of the child's own throughput (target >= 0.9).

    .venv/bin/python -m bench.bench_ingest [--docs 600]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench._retrieval import COLLECTIONS, DATA_DIR, live_ingest, load_collection, start_child
from retrieval import RetrievalLimits


async def run(docs: int) -> None:
    limits = RetrievalLimits(max_query_chars=5000)  # as bench_retrieval's run()
    originals = [d for n in COLLECTIONS for d in load_collection(DATA_DIR / n, n, limits).docs]
    sample = originals[::max(1, len(originals) // docs)][:docs]
    with tempfile.TemporaryDirectory(prefix="llamad-bench-ingest-") as tmp:
        child = await start_child(Path(tmp))
        try:
            live = await live_ingest(sample, child, Path(tmp), limits)
        finally:
            await child.daemon.shutdown()
    print(f"{live.docs} documents, {live.chunks} chunks: Retriever {live.retriever_s:.1f} s, "
          f"child alone {live.direct32_s:.1f} s at batches of {limits.embed_batch}, "
          f"{live.direct_perdoc_s:.1f} s one request per document")
    print(f"fraction of the child's own throughput: {live.direct32_s / live.retriever_s:.3f} "
          f"(target >= 0.9); of the per-document path: "
          f"{live.direct_perdoc_s / live.retriever_s:.3f}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.bench_ingest", description=__doc__)
    p.add_argument("--docs", type=int, default=600)
    asyncio.run(run(p.parse_args(argv).docs))


if __name__ == "__main__":
    main()
