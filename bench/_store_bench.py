"""The measurements of ``bench.bench_store``: the same Retriever calls on each store
backend (``embedded``: SQLite + tantivy + hnswlib; ``postgres``: PostgreSQL + pgvector),
timed, and the PostgreSQL plans of the slowest query kind."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.synchronize
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from bench._retrieval import Collection, Doc, Ingest, upsert_all
from bench._retrieval_bench.index import timing_commits
from bench._retrieval_bench.metrics import ndcg, pct
from daemon.telemetry import logs
from retrieval import Filters, PgOptions, Query, RetrievalError, RetrievalLimits, Retriever
from retrieval.postgres._bm25 import CANDIDATES_PER_TERM
from retrieval.postgres._entries import holders_where
from retrieval.postgres._indexes import PgIndexes
from retrieval.postgres._search import filter_sql, vector_search
from retrieval.postgres._store import PostgresStore
from tests.support.embedder import HashEmbedder

RANKER_ENV = "LLAMAD_BENCH_RANKER"
"""The PostgreSQL store's lexical ranker (``PgOptions.lexical_ranker``), in the
environment so that the node processes of (d) use it too."""
PER_TERM_ENV = "LLAMAD_BENCH_BM25_PER_TERM"
"""``PgOptions.bm25_candidates_per_term`` for the benches (default: its default)."""
COMMITS_ENV = "LLAMAD_BENCH_COMMITS_IN_FLIGHT"
"""``PgOptions.commits_in_flight`` for the benches (default: its default)."""
MODEL = "hash-bow-384"
"""The vectors: :class:`HashEmbedder` (bag of hashed words, 384 dimensions, as the default
embedding model's), not a real model: the same on both backends, cheap enough for 100k
chunks on two cores."""
DIM = 384
MODES = ("text", "vector", "hybrid")
LIST_DEPTH = 25


class TimedEmbedder(HashEmbedder):
    """:class:`HashEmbedder` counting the seconds spent embedding."""

    def __init__(self) -> None:
        super().__init__(MODEL, DIM)
        self.seconds = 0.0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        began = time.perf_counter()
        try:
            return await super().embed(texts)
        finally:
            self.seconds += time.perf_counter() - began


def retriever(kind: str, root: Path, dsn: str, embedder: HashEmbedder | None,
              limits: RetrievalLimits) -> Retriever:
    """A Retriever on ``kind`` (``embedded`` in ``root``, or ``postgres`` at ``dsn``);
    without an embedder, BM25-only."""
    ranker = os.environ.get(RANKER_ENV) or "auto"
    per_term = int(os.environ.get(PER_TERM_ENV) or CANDIDATES_PER_TERM)
    commits = int(os.environ.get(COMMITS_ENV) or PgOptions("").commits_in_flight)
    options = PgOptions(dsn, lexical_ranker=ranker, bm25_candidates_per_term=per_term,
                        commits_in_flight=commits)
    return Retriever(root, lambda: embedder, limits,
                     postgres=options if kind == "postgres" else None)


def pg_store(r: Retriever) -> PostgresStore:
    backend = r._backend
    assert isinstance(backend, PgIndexes)
    return backend.require()


# -- (a) ingest -------------------------------------------------------------------------


@dataclass
class IngestResult:
    kind: str
    ingest: Ingest
    embed_s: float          # in the embedder (HashEmbedder: the same on both)
    write_s: float          # embedded: tantivy commits; postgres: replace_documents
    write_what: str
    chunks_in_store: int
    vectors: int


def timing_pg_writes(r: Retriever) -> list[float]:
    """Instrument this Retriever's PostgresStore.replace_documents: seconds per call."""
    store = pg_store(r)
    spent: list[float] = []
    replace = store.replace_documents

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return replace(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - began)

    store.replace_documents = timed  # type: ignore[method-assign]
    return spent


async def ingest(kind: str, root: Path, dsn: str, docs: Sequence[Doc],
                 limits: RetrievalLimits, *, vectors: bool = True
                 ) -> tuple[Retriever, IngestResult]:
    """Every document through ``Retriever.upsert`` (a directory scan's concurrency, its
    commits grouped; without ``vectors``, BM25-only); the Retriever is left open for the
    latency runs."""
    embedder = TimedEmbedder()
    r = retriever(kind, root, dsn, embedder if vectors else None, limits)
    await r.open()
    for source in dict.fromkeys(d.source for d in docs):
        await r.add_source(source)
    spent = timing_commits(r) if kind == "embedded" else timing_pg_writes(r)
    step = max(1, len(docs) // 10)

    def progress(n: int, chunks: int, seconds: float) -> None:
        if n % step == 0:
            print(f"   {kind}: {n} docs, {chunks} chunks, {chunks / seconds:.0f} chunks/s",
                  flush=True)

    result = await upsert_all(r, docs, progress)
    status = await r.status()
    what = "tantivy commits" if kind == "embedded" else "replace_documents"
    return r, IngestResult(kind, result, embedder.seconds, sum(spent), what, status.chunks,
                           status.vectors)


# -- (b) latency ------------------------------------------------------------------------


def summary(seconds: Sequence[float]) -> dict[str, float]:
    if not seconds:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"),
                "mean_ms": float("nan")}
    return {"n": len(seconds), "p50_ms": pct(seconds, 0.5) * 1000,
            "p99_ms": pct(seconds, 0.99) * 1000, "mean_ms": statistics.fmean(seconds) * 1000}


async def search(r: Retriever, query: str, options: Query | None = None) -> bool:
    """One ``Retriever.search(k=10)``; False when it failed (a statement cancelled by
    ``statement_timeout`` on Postgres, say), which the tables count."""
    try:
        await r.search(query, k=10, options=options)
    except RetrievalError as exc:
        print(f"   search failed: {exc}", flush=True)
        return False
    return True


async def latency(r: Retriever, queries: Sequence[str], rounds: int
                  ) -> dict[str, tuple[dict[str, float], list[float]]]:
    """Per mode: ``Retriever.search(k=10)`` (the query embedded by the HashEmbedder, a few
    tens of microseconds), one warm-up pass, then ``rounds`` timed passes; the summary
    (of the searches that succeeded, with ``failed`` counting the others) and each
    query's mean seconds (to find the slowest)."""
    out: dict[str, tuple[dict[str, float], list[float]]] = {}
    for mode in MODES:
        options = Query(mode=mode, candidates=LIST_DEPTH)
        per_query = [0.0] * len(queries)
        seconds: list[float] = []
        failed = 0
        for q in queries:
            await search(r, q, options)
        for _ in range(rounds):
            for i, q in enumerate(queries):
                began = time.perf_counter()
                ok = await search(r, q, options)
                spent = time.perf_counter() - began
                per_query[i] += spent / rounds
                if ok:
                    seconds.append(spent)
                else:
                    failed += 1
        out[mode] = (summary(seconds) | {"failed": failed}, per_query)
    return out


class _Recorder:
    """Stands in for a connection to catch the statements a search function sends."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def execute(self, statement: Any, params: Any = None, *,
                prepare: bool | None = None) -> _Recorder:
        self.calls.append((statement, params))
        return self

    def fetchall(self) -> list[Any]:
        return []

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def explain(store: PostgresStore, mode: str, query: str) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the list query ``mode`` sends for ``query`` (the
    statement caught from :mod:`retrieval.postgres._search` or the store's lexical ranker, run
    again under EXPLAIN)."""
    rec = _Recorder()
    if mode == "vector":
        vector = asyncio.run(HashEmbedder(MODEL, DIM).embed([query]))[0]
        space = store.use_embedding_model(MODEL, DIM)
        vector_search(rec, space, DIM, vector, filters=Filters(),  # type: ignore[arg-type]
                      limit=LIST_DEPTH, ef_search=store.options.ef_search,
                      max_scan_tuples=store.options.max_scan_tuples)
    else:
        where, args = filter_sql(Filters())
        store._ranker.search(rec, query, LIST_DEPTH,  # type: ignore[arg-type]
                             holders_where(where), args, filtered=False)  # as the store
    *settings, (statement, params) = rec.calls
    with store._conn() as conn, conn.transaction():
        for s, p in settings:
            conn.execute(s, p)
        rows = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + statement,
                            params).fetchall()
    return [str(r[0]) for r in rows]


# -- (c) quality ------------------------------------------------------------------------


async def quality(kind: str, root: Path, dsn: str, col: Collection,
                  limits: RetrievalLimits) -> tuple[dict[str, float], float]:
    """nDCG@10 per mode on one collection (a fresh store; one hit per document, 100
    candidates per list), and the ingest rate."""
    r = retriever(kind, root, dsn, HashEmbedder(MODEL, DIM), limits)
    await r.open()
    try:
        await r.add_source(col.name)
        done = await upsert_all(r, col.docs)
        scores: dict[str, list[float]] = {m: [] for m in MODES}
        for q in col.queries:
            for mode in MODES:
                res = await r.search(q.text[:limits.max_query_chars], k=10, options=Query(
                    mode=mode, candidates=100, group_by_document=True))
                ranked = list(dict.fromkeys(h.doc_id.split("/", 1)[1] for h in res.hits))
                scores[mode].append(ndcg(ranked, col.qrels[q.id]))
        return {m: statistics.fmean(v) for m, v in scores.items()}, done.rate
    finally:
        await r.close()


# -- (d) nodes on one database ----------------------------------------------------------


@dataclass
class NodesResult:
    nodes: int
    queries: int
    wall_s: float
    seconds: list[float] = field(default_factory=list)
    failed: int = 0
    busy_s: float = 0.0
    """CPU seconds the whole machine was busy while the nodes searched (every process:
    the nodes, the server's backends, anything else)."""

    @property
    def qps(self) -> float:
        return self.queries / self.wall_s if self.wall_s else 0.0

    @property
    def cores(self) -> float:
        """Cores busy on average while they searched."""
        return self.busy_s / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_query(self) -> float:
        """Machine CPU per query: the same for one node and two when nothing in the
        database makes them wait on each other, so the queries/s ratio is then the
        cores' (two nodes need twice the CPU of one)."""
        return 1000 * self.busy_s / self.queries if self.queries else 0.0


def busy_seconds() -> float:
    """CPU seconds the machine has been busy since boot (/proc/stat: all but idle and
    iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _node(dsn: str, work: tuple[list[str], int], ready: Any,
          go: multiprocessing.synchronize.Event, out: Any) -> None:
    """One node (its own process): a Retriever on the database, hybrid searches of
    ``work`` (queries, rounds)."""
    queries, rounds = work
    logs.configure("json", "warning")  # a spawned process: structlog's defaults otherwise

    async def run() -> tuple[float, list[float], int]:
        with tempfile.TemporaryDirectory(prefix="llamad-bench-node-") as tmp:
            r = retriever("postgres", Path(tmp), dsn, HashEmbedder(MODEL, DIM),
                          RetrievalLimits(max_query_chars=5000))
            await r.open()
            try:
                for q in queries[:20]:
                    await search(r, q)
                ready.put(1)
                go.wait()
                seconds = []
                failed = 0
                began = time.perf_counter()
                for _ in range(rounds):
                    for q in queries:
                        t = time.perf_counter()
                        if await search(r, q):
                            seconds.append(time.perf_counter() - t)
                        else:
                            failed += 1
                return time.perf_counter() - began, seconds, failed
            finally:
                await r.close()

    out.put(asyncio.run(run()))


def nodes(dsn: str, queries: Sequence[str], count: int, rounds: int) -> NodesResult:
    """``count`` node processes searching (hybrid, k=10) the same database at once, each
    ``rounds`` passes over ``queries``; started together once all are warm."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_node, args=(dsn, (list(queries), rounds), ready, go, out))
             for _ in range(count)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=300)
        busy0 = busy_seconds()
        go.set()
        results = [out.get(timeout=3600) for _ in procs]
        busy = busy_seconds() - busy0
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    wall = max(w for w, _, _ in results)
    seconds = [s for _, ss, _ in results for s in ss]
    failed = sum(f for _, _, f in results)
    return NodesResult(count, len(seconds) + failed, wall, seconds, failed, busy_s=busy)


@contextlib.contextmanager
def timed_stage(name: str, spent: dict[str, float]) -> Iterator[None]:
    print(f"\n== {name}", flush=True)
    began = time.perf_counter()
    try:
        yield
    finally:
        spent[name] = time.perf_counter() - began
