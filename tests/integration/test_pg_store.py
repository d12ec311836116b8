"""The PostgreSQL + pgvector store against a real PostgreSQL 18 server (tests/support/postgres.py):
schema and migrations, atomic replacement, both ranked lists with filters inside, scan
locks across nodes, the corpus's embedding model, and the password kept out of every
message."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
import structlog.testing
from psycopg import sql

from retrieval.errors import (
    EmbeddingModelMismatch,
    InvalidDocument,
    SchemaTooNew,
    StoreUnavailable,
)
from retrieval.postgres._connect import PgOptions
from retrieval.postgres._schema import MIGRATION_LOCK, SCHEMA_VERSION
from retrieval.postgres._search import vector_statement, vector_top_statement
from retrieval.postgres._store import CACHED_VECTORS, PostgresStore
from retrieval.store._bm25 import Filters
from retrieval.store._metadata import ChunkRow, DocumentRow, SourceRow
from tests.support.postgres import PgServer

MODEL, DIM = "test-embed", 4


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PostgresStore]:
    s = PostgresStore.open(PgOptions(pg_dsn))
    try:
        yield s
    finally:
        s.close()


def unit(*values: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def doc(doc_id: str, source: str = "docs", **fields: object) -> DocumentRow:
    base = DocumentRow(doc_id, source, title=f"title of {doc_id}", kind="markdown",
                       content_hash=f"h-{doc_id}", indexed_at=1_700_000_000)
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def chunks(doc_id: str, *texts: str) -> list[ChunkRow]:
    return [ChunkRow(f"{doc_id}#{i}", i, "", text, f"{doc_id}:{text}")
            for i, text in enumerate(texts, start=1)]


def put(store: PostgresStore, d: DocumentRow, rows: list[ChunkRow],
        vectors: list[np.ndarray] | None = None) -> None:
    given = [(MODEL, {c.content_hash: v for c, v in zip(rows, vectors, strict=True)})] \
        if vectors is not None else []
    store.replace_documents([(d, rows)], given)


def chunk_ids(store: PostgresStore, hits: list[tuple[int, float]]) -> list[str]:
    found = store.chunks_by_keys(k for k, _ in hits)
    return [found[k].chunk_id for k, _ in hits]


def test_schema_is_created_then_reopened_unchanged(pg_dsn: str) -> None:
    """A fresh database gets every migration once; opening again applies none and keeps
    the rows."""
    first = PostgresStore.open(PgOptions(pg_dsn))
    first.upsert_source(SourceRow("docs", "push"))
    first.close()
    again = PostgresStore.open(PgOptions(pg_dsn))
    try:
        assert [s.id for s in again.sources()] == ["docs"]
        info = again.info()
        assert info.schema_version == SCHEMA_VERSION
        assert info.lexical_ranking == "bm25-sql"
        assert info.bm25_extension == ""  # the test server offers neither extension
        assert info.pgvector_version.startswith("0.8")
    finally:
        again.close()
    with psycopg.connect(pg_dsn) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM llamad_schema")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))


def test_two_nodes_opening_a_fresh_database_at_once_both_succeed(pg_dsn: str) -> None:
    """Migrations take turns under the advisory lock: neither node fails on the other's
    half-made tables, and each migration is recorded once."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: PostgresStore.open(PgOptions(pg_dsn)), range(4)))
    for s in stores:
        s.close()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM llamad_schema").fetchone() == \
            (SCHEMA_VERSION,)


def test_a_schema_newer_than_this_llamad_is_refused(pg_dsn: str) -> None:
    """A database a newer llamad migrated is refused, naming both versions; nothing is
    written to it."""
    PostgresStore.open(PgOptions(pg_dsn)).close()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("INSERT INTO llamad_schema(version, description) VALUES (%s, 'future')",
                     (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew) as refused:
        PostgresStore.open(PgOptions(pg_dsn))
    assert f"schema version {SCHEMA_VERSION + 1}" in str(refused.value)
    assert f"({SCHEMA_VERSION})" in str(refused.value)


def test_both_lists_find_a_document_with_filters_applied_inside(store: PostgresStore) -> None:
    """An upserted document is found by words and by vector; every filter (source, kind,
    category, tags, indexed and own dates, document ids, a disabled source) is applied
    in both queries."""
    store.use_embedding_model(MODEL, DIM)
    store.upsert_source(SourceRow("docs", "push"))
    store.upsert_source(SourceRow("ops", "push"))
    put(store, doc("docs/disk.md", category="runbook", tags=("storage", "linux"),
                   document_date=1_600_000_000),
        chunks("docs/disk.md", "The disks on web01.example.net are full: rotate the logs."),
        [unit(1, 0, 0, 0)])
    put(store, doc("ops/net.md", "ops", kind="text", indexed_at=1_800_000_000),
        chunks("ops/net.md", "Network switch GigabitEthernet0/1 flaps; disk is fine."),
        [unit(0.9, 0.1, 0, 0)])
    query = unit(1, 0.05, 0, 0)
    assert chunk_ids(store, store.text_search("disk full", filters=Filters(), limit=10))[0] \
        == "docs/disk.md#1"
    # As in the embedded index: the host's words are body terms too ("net" is in the
    # other document's title), and its exact term ranks the document holding it first.
    assert chunk_ids(store, store.text_search("web01.example.net", filters=Filters(),
                                              limit=10))[0] == "docs/disk.md#1"
    assert chunk_ids(store, store.vector_search(MODEL, query, filters=Filters(), limit=10)) \
        == ["docs/disk.md#1", "ops/net.md#1"]
    only_ops = [Filters(sources=("ops",)), Filters(kinds=("text",)),
                Filters(since=1_750_000_000), Filters(doc_ids=frozenset({"ops/net.md"}))]
    only_docs = [Filters(categories=("runbook",)), Filters(tags=("linux", "nope")),
                 Filters(until=1_750_000_000), Filters(dated_since=1_500_000_000),
                 Filters(dated_until=1_650_000_000)]
    for filters, expected in [*((f, ["ops/net.md#1"]) for f in only_ops),
                              *((f, ["docs/disk.md#1"]) for f in only_docs)]:
        assert chunk_ids(store, store.text_search("disk", filters=filters, limit=10)) == \
            expected, filters
        assert chunk_ids(store, store.vector_search(MODEL, query, filters=filters,
                                                    limit=10)) == expected, filters
    assert store.set_source_disabled("docs", True)
    assert chunk_ids(store, store.text_search("disk", filters=Filters(), limit=10)) == \
        ["ops/net.md#1"]
    assert chunk_ids(store, store.vector_search(MODEL, query, filters=Filters(),
                                                limit=10)) == ["ops/net.md#1"]
    # No stop words, as in the embedded index's en_stem: text without a word finds nothing.
    assert store.text_search("?! -- () ...", filters=Filters(), limit=10) == []
    assert store.text_search("zebra", filters=Filters(), limit=10) == []


@contextlib.contextmanager
def near_and_far(pg_dsn: str, *, seed: int) -> Iterator[PostgresStore]:
    """A store (ef_search 10) with 150 chunks in source ``near``, their vectors near
    (1, 0, 0, 0), and 150 in ``far`` near (0, 1, 0, 0); analysed, sorting off."""
    store = PostgresStore.open(PgOptions(pg_dsn, ef_search=10))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # Tables this small are otherwise read whole and sorted (exact): the planner
        # takes the HNSW path when sorting is off, as it does by cost on a large corpus.
        conn.execute(sql.SQL("ALTER DATABASE {} SET enable_sort = off").format(
            sql.Identifier(conn.info.dbname)))
    try:
        store.use_embedding_model(MODEL, DIM)
        rng = np.random.default_rng(seed)
        for source, direction in (("near", (1, 0, 0)), ("far", (0, 1, 0))):
            store.upsert_source(SourceRow(source, "push"))
            store.replace_documents(
                [(doc(f"{source}/{i}", source), chunks(f"{source}/{i}", f"t {i}"))
                 for i in range(150)],
                [(MODEL, {f"{source}/{i}:t {i}": unit(*direction, 0) + rng.random(4) * 0.2
                          for i in range(150)})])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")
        yield store
    finally:
        store.close()


def test_a_filter_inside_the_hnsw_scan_still_gets_k_vector_hits(pg_dsn: str) -> None:
    """On the HNSW index, a filter that the nearest chunks all fail still returns the k
    nearest that pass it (pgvector's iterative scan), not the few of a fixed top-k."""
    with near_and_far(pg_dsn, seed=7) as store:
        filters = Filters(sources=("far",))
        hits = store.vector_search(MODEL, unit(1, 0, 0, 0), filters=filters, limit=20)
        assert len(hits) == 20
        assert all(i.startswith("far/") for i in chunk_ids(store, hits))
        assert [d for _, d in hits] == sorted(d for _, d in hits)
        statement, args = vector_statement(1, DIM, filters)
        with psycopg.connect(pg_dsn) as conn:
            plan = "\n".join(r[0] for r in conn.execute(
                sql.SQL("EXPLAIN ") + statement, [[1.0, 0.0, 0.0, 0.0], *args, 20]))
        assert "Index Scan using chunk_vectors_hnsw_1" in plan, plan


def test_unfiltered_the_hnsw_scan_runs_alone_and_a_disabled_source_is_still_left_out(
        pg_dsn: str) -> None:
    """Unfiltered, the vector list takes the nearest vectors on the HNSW index alone and
    joins them to their holders after (joined in one query, the semi-join to the holders
    left the index at 100 000 chunks); when a disabled source holds every one of them, the
    filtered query still gives the k nearest of the enabled sources."""
    with near_and_far(pg_dsn, seed=11) as store:
        query = unit(1, 0, 0, 0)
        hits = store.vector_search(MODEL, query, filters=Filters(), limit=20)
        assert all(i.startswith("near/") for i in chunk_ids(store, hits))
        assert len(hits) == 20 and [d for _, d in hits] == sorted(d for _, d in hits)
        statement, args = vector_top_statement(1, DIM)
        with psycopg.connect(pg_dsn) as conn:
            plan = "\n".join(r[0] for r in conn.execute(
                sql.SQL("EXPLAIN ") + statement, [[1.0, 0.0, 0.0, 0.0], 84, *args, 20]))
        assert "Index Scan using chunk_vectors_hnsw_1" in plan, plan
        # The 84 nearest (20 asked + the margin) all in a disabled source: the filtered
        # query runs, and the 20 nearest of the enabled source come back.
        assert store.set_source_disabled("near", True)
        hits = store.vector_search(MODEL, query, filters=Filters(), limit=20)
        assert len(hits) == 20
        assert all(i.startswith("far/") for i in chunk_ids(store, hits))


def test_replace_swaps_chunks_and_a_failed_one_keeps_the_old_version(
        store: PostgresStore) -> None:
    """A replacement removes the old chunks with their vectors; a vector of the wrong
    dimension or not finite, found after the old chunks were deleted inside the
    transaction, leaves the previous version whole (chunks, text list, vectors)."""
    store.use_embedding_model(MODEL, DIM)
    store.upsert_source(SourceRow("docs", "push"))
    put(store, doc("docs/a"), chunks("docs/a", "alpha one", "alpha two"),
        [unit(1, 0, 0, 0), unit(0, 1, 0, 0)])
    old = store.document_chunk_keys("docs/a")
    replaced = store.replace_documents(
        [(doc("docs/a"), chunks("docs/a", "bravo three"))],
        [(MODEL, {"docs/a:bravo three": unit(0, 0, 1, 0)})])[0]
    assert sorted(replaced.removed) == sorted(old)
    new = store.document_chunk_keys("docs/a")
    assert new == {c.key for c in replaced.added} and not new & old
    assert store.text_search("alpha", filters=Filters(), limit=10) == []
    assert store.embedded_chunks(MODEL) == 1
    with pytest.raises(InvalidDocument, match="has 3 dimensions; the corpus's embedding "
                                              "model has 4"):
        store.replace_documents(
            [(doc("docs/a", title="changed"), chunks("docs/a", "charlie", "delta"))],
            [(MODEL, {"docs/a:charlie": unit(1, 0, 0, 0),
                      "docs/a:delta": np.ones(3, dtype=np.float32)})])
    with pytest.raises(InvalidDocument, match="chunk docs/a#2 is not finite"):
        store.replace_documents(
            [(doc("docs/a", title="changed"), chunks("docs/a", "charlie", "delta"))],
            [(MODEL, {"docs/a:charlie": unit(1, 0, 0, 0),
                      "docs/a:delta": np.array([0, np.nan, 1, 0], dtype=np.float32)})])
    assert store.document_chunk_keys("docs/a") == new
    assert store.document("docs/a").title == "title of docs/a"  # type: ignore[union-attr]
    assert chunk_ids(store, store.text_search("bravo", filters=Filters(), limit=5)) == \
        ["docs/a#1"]
    assert store.text_search("charlie", filters=Filters(), limit=5) == []
    assert chunk_ids(store, store.vector_search(MODEL, unit(0, 0, 1, 0), filters=Filters(),
                                                limit=5)) == ["docs/a#1"]


def test_two_nodes_replacing_one_document_at_once_never_collide(pg_dsn: str) -> None:
    """Concurrent replacements of the same documents by two nodes (batches overlapping in
    opposite orders) queue on each document: each succeeds, and each document ends with
    one version's chunks, never a mix."""
    nodes = [PostgresStore.open(PgOptions(pg_dsn)) for _ in range(2)]
    try:
        nodes[0].upsert_source(SourceRow("docs", "push"))

        def write(n: int) -> None:
            # Overlapping batches in opposite orders: row locks alone would deadlock.
            order = list(range(15)) if n == 0 else list(reversed(range(15)))
            for _ in range(3):
                nodes[n].replace_documents([
                    (doc(f"docs/x{r}", content_hash=f"{n}"),
                     chunks(f"docs/x{r}", f"node{n} a", f"node{n} b")) for r in order])

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(write, n) for n in range(2)]:
                done.result()
        for round_ in range(15):
            texts = [c.text for c in nodes[0].chunks_by_keys(
                nodes[0].document_chunk_keys(f"docs/x{round_}")).values()]
            assert sorted(texts) in (["node0 a", "node0 b"], ["node1 a", "node1 b"])
    finally:
        for node in nodes:
            node.close()


def test_an_unchanged_chunk_keeps_its_vector_across_a_replacement(
        store: PostgresStore) -> None:
    """A chunk whose text did not change keeps its vector without being sent again, and
    cached_vectors answers by text hash."""
    store.use_embedding_model(MODEL, DIM)
    store.upsert_source(SourceRow("docs", "push"))
    put(store, doc("docs/a"), chunks("docs/a", "same text"), [unit(1, 2, 3, 4)])
    store.replace_documents([(doc("docs/a", title="retitled"), chunks("docs/a", "same text"))])
    cached = store.cached_vectors(MODEL, ["docs/a:same text", "unknown"])
    assert list(cached) == ["docs/a:same text"]
    np.testing.assert_allclose(cached["docs/a:same text"], unit(1, 2, 3, 4), rtol=1e-6)
    assert store.embedded_chunks(MODEL) == 1


def test_an_open_waits_out_another_nodes_migration_past_the_statement_timeout(
        pg_dsn: str) -> None:
    """The statement timeout bounds searches and writes, not an open: migrations, the
    BM25 fill and an extension's index are whole-corpus work (minutes at a million
    chunks), and a node opening meanwhile waits for the migration lock that long. Here
    another session holds that lock for longer than the timeout; the open waits and
    succeeds, and the pool's sessions keep the timeout."""
    with psycopg.connect(pg_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        opened: list[PostgresStore] = []
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            opening = pool.submit(
                lambda: opened.append(PostgresStore.open(PgOptions(
                    pg_dsn, statement_timeout_ms=300))))
            time.sleep(1.5)  # five timeouts' worth
            assert not opening.done()  # waiting for the lock, not refused
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
            opening.result(timeout=60)
    store = opened[0]
    try:
        assert store.info().schema_version == SCHEMA_VERSION
        with store._conn() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("300ms",)
    finally:
        store.close()


def _plan_nodes(plan: dict[str, object]) -> Iterator[dict[str, object]]:
    yield plan
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        yield from _plan_nodes(child)


def test_cached_vectors_probes_by_hash_on_a_corpus_not_yet_analysed(
        store: PostgresStore, pg_dsn: str) -> None:
    """Ingest asks cached_vectors once a document: its plan must not read the whole
    corpus. On a database filling up (never analysed, as in a first ingest) a join of the
    three tables planned by cost read every vector and looked its chunk up (2.4-3 ms a
    call at 3,000 chunks, growing with them); the statement is driven by the hashes."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for table in ("chunks", "chunk_vectors"):  # so that nothing analyses them meanwhile
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(
                sql.Identifier(table)))
    store.use_embedding_model(MODEL, DIM)
    store.upsert_source(SourceRow("docs", "push"))
    rng = np.random.default_rng(7)
    for first in range(0, 3000, 500):
        batch = [(doc(f"docs/{i}"), chunks(f"docs/{i}", f"text {i}"))
                 for i in range(first, first + 500)]
        vectors = {rows[0].content_hash: unit(*rng.random(DIM) + 0.1) for _, rows in batch}
        store.replace_documents(batch, [(MODEL, vectors)])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        analysed = conn.execute(
            "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN ('chunks', "
            "'chunk_vectors') AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)"
        ).fetchone()
        assert analysed == (0,)  # the state the ingest meets
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + CACHED_VECTORS, (["docs/7:text 7"], MODEL)
        ).fetchone()[0][0]["Plan"]  # type: ignore[index]
    scans = {(str(n["Node Type"]), str(n.get("Relation Name", "")))
             for n in _plan_nodes(plan) if "Relation Name" in n}
    assert ("Seq Scan", "chunks") not in scans
    assert ("Seq Scan", "chunk_vectors") not in scans
    assert {table for _, table in scans} >= {"chunks", "chunk_vectors"}  # by their indexes
    got = store.cached_vectors(MODEL, ["docs/7:text 7", "docs/2999:text 2999", "none"])
    assert sorted(got) == ["docs/2999:text 2999", "docs/7:text 7"]


def test_delete_document_and_source(store: PostgresStore) -> None:
    """Deleting a document removes its chunks and vectors; deleting a source its
    documents; counts follow."""
    store.use_embedding_model(MODEL, DIM)
    for source in ("docs", "ops"):
        store.upsert_source(SourceRow(source, "push"))
    put(store, doc("docs/a"), chunks("docs/a", "alpha"), [unit(1, 0, 0, 0)])
    put(store, doc("docs/b"), chunks("docs/b", "bravo"), [unit(0, 1, 0, 0)])
    put(store, doc("ops/c", "ops"), chunks("ops/c", "charlie"), [unit(0, 0, 1, 0)])
    keys_a = store.document_chunk_keys("docs/a")
    assert store.delete_document("docs/a") == sorted(keys_a)
    assert store.delete_document("docs/a") is None
    assert store.text_search("alpha", filters=Filters(), limit=5) == []
    assert store.counts() == {"sources": 2, "chunks": 2, "documents_indexed": 2}
    assert len(store.delete_source("docs")) == 1
    assert store.counts() == {"sources": 1, "chunks": 1, "documents_indexed": 1}
    assert store.embedded_chunks(MODEL) == 1


def test_sizes_past_the_exact_count_read_the_servers_statistics(store: PostgresStore) -> None:
    """sizes counts exactly below its threshold; past it (here 0) it reads the live rows
    the server's statistics keep, which follow the commits within seconds; vectors of
    every model are capped at the chunks."""
    store.use_embedding_model(MODEL, DIM)
    store.upsert_source(SourceRow("docs", "push"))
    put(store, doc("docs/a"), chunks("docs/a", "alpha", "alpha two"),
        [unit(1, 0, 0, 0), unit(0, 1, 0, 0)])
    put(store, doc("docs/b"), chunks("docs/b", "bravo"))
    assert store.sizes() == (3, 2)
    deadline = time.monotonic() + 30  # statistics are flushed within about 10 s
    while store.sizes(exact_below=0) != (3, 2):
        assert time.monotonic() < deadline, store.sizes(exact_below=0)
        time.sleep(0.2)
    store.delete_document("docs/a")
    assert store.sizes() == (1, 0)
    while store.sizes(exact_below=0) != (1, 0):
        assert time.monotonic() < deadline + 30, store.sizes(exact_below=0)
        time.sleep(0.2)


def test_a_node_notices_that_its_lock_session_was_lost(pg_dsn: str,
                                                       store: PostgresStore) -> None:
    """When the server ends the session holding a scan lock (a restart, an operator's
    pg_terminate_backend), the node no longer claims the lock, and takes it again."""
    assert store.try_scan_lock("docs")
    assert store.holds_scan_lock("docs")
    assert not store.holds_scan_lock("other")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ended = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE "
                             "locktype = 'advisory' AND pid <> pg_backend_pid()").fetchone()
    assert ended == (1,)
    assert not store.holds_scan_lock("docs")
    assert store.try_scan_lock("docs")
    assert store.holds_scan_lock("docs")


_HOLDER = """
import sys, time
from retrieval.postgres._connect import PgOptions
from retrieval.postgres._store import CACHED_VECTORS, PostgresStore
store = PostgresStore.open(PgOptions(sys.argv[1]))
print("held:", store.try_scan_lock("docs"), flush=True)
time.sleep(120)
"""


def test_a_scan_lock_is_refused_to_other_nodes_until_its_holder_dies(
        pg_dsn: str, store: PostgresStore) -> None:
    """One scanner per source: a lock held by another node (a process) is refused here,
    and freed by the server when that process is killed -9; a lock released cleanly is
    free at once."""
    with subprocess.Popen([sys.executable, "-c", _HOLDER, pg_dsn], stdout=subprocess.PIPE,
                          text=True, cwd=os.getcwd()) as holder:
        try:
            assert holder.stdout is not None
            said = next(line for line in iter(holder.stdout.readline, "")
                        if line.startswith("held:"))
            assert said.strip() == "held: True"
            assert not store.try_scan_lock("docs")
            assert store.try_scan_lock("other")  # another source is independent
        finally:
            holder.kill()
    deadline = time.monotonic() + 20
    while not store.try_scan_lock("docs"):
        assert time.monotonic() < deadline, "the dead node's lock was never released"
        time.sleep(0.05)
    second = PostgresStore.open(store.options)
    try:
        assert not second.try_scan_lock("docs")
        store.release_scan_lock("docs")
        assert second.try_scan_lock("docs")
        assert second.try_scan_lock("docs")  # held already: still True
    finally:
        second.close()


def test_a_node_with_another_embedding_model_is_refused(pg_dsn: str) -> None:
    """The first node sets the corpus's model; a node with another model or dimension is
    refused, naming both, and can neither write nor search vectors."""
    first = PostgresStore.open(PgOptions(pg_dsn))
    other = PostgresStore.open(PgOptions(pg_dsn))
    try:
        first.use_embedding_model(MODEL, DIM)
        first.upsert_source(SourceRow("docs", "push"))
        with pytest.raises(EmbeddingModelMismatch) as refused:
            other.use_embedding_model("other-embed", 8)
        message = str(refused.value)
        assert "other-embed (8 dimensions)" in message and f"{MODEL} ({DIM} dimensions)" \
            in message
        with pytest.raises(EmbeddingModelMismatch):
            other.use_embedding_model(MODEL, 8)
        with pytest.raises(EmbeddingModelMismatch, match="other-embed"):
            other.replace_documents([(doc("docs/a"), chunks("docs/a", "x"))],
                                    [("other-embed", {"docs/a:x": np.ones(8)})])
        assert other.document("docs/a") is None
        with pytest.raises(EmbeddingModelMismatch):
            other.vector_search("other-embed", np.ones(8, dtype=np.float32),
                                filters=Filters(), limit=3)
        assert other.use_embedding_model(MODEL, DIM) == first.use_embedding_model(MODEL, DIM)
        assert other.info().corpus_model == MODEL
    finally:
        first.close()
        other.close()


def test_every_connection_has_the_session_settings_llamad_sets(pg_dsn: str) -> None:
    """The pool's connections carry the statement timeout asked for and JIT off (plan
    compilation costs more than llamad's short statements take), whatever the server's
    defaults."""
    store = PostgresStore.open(PgOptions(pg_dsn, statement_timeout_ms=4321))
    try:
        with store._conn() as conn:
            assert conn.execute("SELECT current_setting('statement_timeout'), "
                                "current_setting('jit')").fetchone() == ("4321ms", "off")
    finally:
        store.close()
    with psycopg.connect(pg_dsn) as other:  # the server's own default is untouched
        assert other.execute("SHOW jit").fetchone() == ("on",)


def test_the_password_is_read_from_a_file_or_env_and_never_shown(
        pg_server: PgServer, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A role that needs a password connects with it from a file or a variable; a wrong
    one, a DSN holding one, and a missing variable are refused with messages (and logs)
    that never hold the password."""
    secret, wrong = "s3cret-Pg-pass", "wr0ng-Pg-pass"
    pg_server.create_role("llamad_pw", secret, superuser=True)
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    dsn = pg_server.dsn(str(dbname), user="llamad_pw")
    password_file = tmp_path / "pg-password"
    password_file.write_text(secret + "\n")
    monkeypatch.setenv("LLAMAD_TEST_PG_PASSWORD", wrong)
    caplog.set_level("DEBUG")
    messages: list[str] = []
    with structlog.testing.capture_logs() as logs:
        store = PostgresStore.open(PgOptions(dsn, password_file=str(password_file)))
        store.upsert_source(SourceRow("docs", "push"))
        assert store.try_scan_lock("docs")
        store.close()
        for options in (PgOptions(dsn, password_env="LLAMAD_TEST_PG_PASSWORD"),
                        PgOptions(dsn),
                        PgOptions(f"{dsn} password={secret}"),
                        PgOptions(dsn, password_env="LLAMAD_TEST_PG_UNSET")):
            with pytest.raises(StoreUnavailable) as refused:
                PostgresStore.open(options)
            messages.append(str(refused.value))
            messages.append(repr(refused.value.__cause__))
    assert "password authentication failed" in messages[0]
    assert "holds a password" in messages[4]
    assert "LLAMAD_TEST_PG_UNSET is not set" in messages[6]
    shown = "\n".join([*messages, caplog.text, repr(logs)])
    assert "postgres store open" in repr(logs)
    assert secret not in shown and wrong not in shown


def test_unreachable_server_bad_dsn_and_missing_pgvector_are_clear(
        pg_server: PgServer, pg_dsn: str, tmp_path: Path) -> None:
    """Each failure to open names the server and what to do."""
    nowhere = PgOptions(f"host={tmp_path} port=1 dbname=kb user=llamad", connect_timeout=2)
    with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL at "
                                               r"llamad@\S+:1/kb"):
        PostgresStore.open(nowhere)
    with pytest.raises(StoreUnavailable, match="cannot be parsed"):
        PostgresStore.open(PgOptions("host=x port"))
    pg_server.create_role("llamad_plain")
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pytest.raises(StoreUnavailable, match="pgvector is not installed in "
                                               f"llamad_plain@.*/{dbname} and this role may "
                                               "not install it"):
        PostgresStore.open(PgOptions(pg_server.dsn(dbname, user="llamad_plain")))
