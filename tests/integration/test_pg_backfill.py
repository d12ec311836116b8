"""The backfill, Reprocess and a switch of embedding model on the PostgreSQL store, against a
real PostgreSQL 18 + pgvector (tests/support/postgres.py): the embedded store's behaviour
(tests/unit/test_backfill.py, test_rebuild_serving.py) on a database two nodes share, and
what sharing adds: one node backfills a model at a time, no chunk is embedded twice or
lost, a node dying mid-run leaves the rest to the next, and a switch asked on one node is
carried out while the other keeps searching the previous model's vectors. The scenarios
both stores share are tests/support/backfill.py's."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import psycopg
import pytest

from retrieval import (
    Embedder,
    EmbeddingModelMismatch,
    NotFound,
    Query,
    RetrievalLimits,
    Retriever,
)
from retrieval.postgres._connect import PgOptions
from retrieval.postgres._schema import (
    SCHEMA_VERSION,
    ensure_vector_space,
    hnsw_index_name,
    migrate,
    schema_version,
)
from retrieval.postgres._store import PostgresStore
from retrieval.postgres._vectors import Space
from retrieval.store._metadata import ChunkRow, DocumentRow, SourceRow
from tests.support import backfill
from tests.support.backfill import Switchable, finished
from tests.support.embedder import DOCS, HashEmbedder, fill


def node(tmp_path: Path, name: str, dsn: str, embedder: Switchable, *, batch: int = 32,
         lookup: dict[str, Embedder] | None = None) -> Retriever:
    return Retriever(tmp_path / name, embedder.provider, RetrievalLimits(embed_batch=batch),
                     postgres=PgOptions(dsn),
                     embedder_for=None if lookup is None else lookup.get)


@contextlib.asynccontextmanager
async def same_model_nodes(tmp_path: Path, dsn: str, *, batch: int
                           ) -> AsyncIterator[tuple[Retriever, Switchable, Retriever, Switchable]]:
    """Nodes ``a`` and ``b`` of model-a on one database, each embedding ``batch`` chunks a
    call, opened, with their embedders; both closed at the end (closing one again is
    harmless)."""
    ea, eb = Switchable("model-a"), Switchable("model-a")
    a = node(tmp_path, "a", dsn, ea, batch=batch)
    b = node(tmp_path, "b", dsn, eb, batch=batch)
    await a.open()
    await b.open()
    try:
        yield a, ea, b, eb
    finally:
        await a.close()
        await b.close()


@pytest.fixture
async def opened(tmp_path: Path, pg_dsn: str) -> AsyncIterator[tuple[Retriever, Switchable]]:
    embedder = Switchable("model-a")
    r = node(tmp_path, "a", pg_dsn, embedder)
    await r.open()
    try:
        yield r, embedder
    finally:
        await r.close()


def vector_counts(dsn: str) -> dict[str, int]:
    """Vectors stored per model, and chunks without a vector of the corpus's model."""
    with psycopg.connect(dsn) as conn:
        per_model = {str(m): int(n) for m, n in conn.execute(
            "SELECT s.model, count(*) FROM chunk_vectors v JOIN vector_spaces s "
            "ON s.id = v.space_id GROUP BY s.model")}
        row = conn.execute(
            "SELECT count(*) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM chunk_vectors v "
            "JOIN corpus_model m ON m.space_id = v.space_id WHERE v.chunk_key = c.key)"
        ).fetchone()
    return {**per_model, "without": int(row[0]) if row else -1}


async def test_documents_ingested_without_embeddings_get_vectors_when_they_return(
        opened: tuple[Retriever, Switchable], pg_dsn: str) -> None:
    """Ingested while the embedding model is down: BM25-only. Once it is back, the
    backfill embeds every chunk (the first vectors set the corpus's model) and search is
    hybrid, with the counts in Status."""
    result = await backfill.vectors_when_back(*opened)
    assert result.vector_model == "model-a"
    assert vector_counts(pg_dsn) == {"model-a": 3, "without": 0}


async def test_the_daemons_periodic_check_asks_in_a_thread_and_starts_a_run(
        opened: tuple[Retriever, Switchable], pg_dsn: str) -> None:
    """backfill_soon (the daemon's periodic check): nothing to do without an embedder or
    with every chunk embedded; otherwise it starts the run."""
    await backfill.periodic_check(*opened)
    assert vector_counts(pg_dsn) == {"model-a": 3, "without": 0}


async def test_chunks_that_missed_their_vector_are_added_to_the_corpus(
        opened: tuple[Retriever, Switchable]) -> None:
    """With the corpus's model set, only the chunks without a vector are embedded;
    those with one are not embedded again."""
    await backfill.missed_vectors_added(*opened)


async def test_a_text_the_model_refuses_is_counted_and_not_retried(
        opened: tuple[Retriever, Switchable]) -> None:
    """A chunk the model refuses even alone stays BM25-only, counted in Status; the rest
    are embedded; the backfill is then not needed again until asked to retry."""
    await backfill.refused_text_counted(*opened)


async def test_an_interrupted_backfill_resumes_without_embedding_twice(
        tmp_path: Path, pg_dsn: str) -> None:
    """When the embedding model goes away mid-run, the run stops with the reason in
    Status; what it stored stays, and the next run embeds only the rest."""
    embedder = Switchable("model-a")
    r = node(tmp_path, "a", pg_dsn, embedder, batch=1)
    await r.open()
    try:
        await backfill.interrupted_run_resumes(r, embedder)
    finally:
        await r.close()


async def test_reprocess_embeds_one_document_one_source_or_all(
        opened: tuple[Retriever, Switchable]) -> None:
    """Reprocess on Postgres: a document's or a source's chunks without a vector, or
    all; unknown ids are NotFound; nothing to do says why."""
    r, embedder = opened
    embedder.available = False
    await fill(r)
    await r.add_source("more")
    await r.upsert("more", "p", "printer queue stuck on floor two", doc_id="more/p")
    assert await r.reprocess() == (0, "no embedding model is available now; the backfill "
                                      "runs once it is")
    embedder.available = True
    with pytest.raises(NotFound):
        await r.reprocess(document_id="docs/nope")
    with pytest.raises(NotFound):
        await r.reprocess(source_id="nope")
    assert await r.reprocess(document_id="docs/db") == (1, "")
    await finished(r)
    assert embedder.texts == [DOCS["db"]]
    assert await r.reprocess(source_id="more") == (1, "")
    await finished(r)
    assert (await r.status()).vectors == 2
    assert await r.reprocess() == (2, "")
    await finished(r)
    assert (await r.status()).vectors == 4
    assert await r.reprocess() == (0, "every chunk has a vector of the current embedding "
                                      "model")


async def test_two_nodes_backfill_one_database_once(tmp_path: Path, pg_dsn: str) -> None:
    """Two nodes with the same model on one database: while one backfills, the other does
    not start a run; chunks the other ingests meanwhile (without an embedder) are picked
    up by the same run; no chunk is embedded twice and none is left without a vector."""
    async with same_model_nodes(tmp_path, pg_dsn, batch=2) as (a, ea, b, eb):
        ea.available = eb.available = False
        await a.add_source("docs")
        for i in range(6):
            await a.upsert("docs", f"d{i}", f"host web{i} disk {i} full", doc_id=f"docs/{i}")
        ea.available = eb.available = True
        ea.gate = asyncio.Event()
        assert a.backfill()
        assert not b.backfill()  # A holds the model's backfill lock
        assert (await b.reprocess())[0] == 0
        eb.available = False
        for i in range(6, 9):  # B ingests BM25-only while A's run waits
            await b.upsert("docs", f"d{i}", f"host db{i} replication {i} lag",
                           doc_id=f"docs/{i}")
        ea.gate.set()
        await finished(a)
        eb.available = True
        assert not b.backfill()  # nothing left: A's run took B's chunks too
        assert len(ea.texts) == 9 and len(set(ea.texts)) == 9 and eb.texts == []
        assert vector_counts(pg_dsn) == {"model-a": 9, "without": 0}
        assert (await b.search("db7 replication")).hits[0].vector_rank is not None


async def test_a_node_stopped_mid_run_leaves_the_rest_to_the_other(
        tmp_path: Path, pg_dsn: str) -> None:
    """A node closed in the middle of a backfill releases its lock: the other node's run
    embeds only what the first did not store."""
    async with same_model_nodes(tmp_path, pg_dsn, batch=1) as (a, ea, b, eb):
        await backfill.filled_without_vectors(a, ea)
        stored = 0
        original = ea.embed

        async def first_only(texts: Sequence[str]) -> list[list[float]]:
            nonlocal stored
            if stored:
                await asyncio.Event().wait()  # hangs until the run is cancelled
            stored += 1
            return await original(texts)

        ea.embed = first_only  # type: ignore[method-assign]
        assert a.backfill()
        for _ in range(500):
            if vector_counts(pg_dsn).get("model-a") == 1:
                break
            await asyncio.sleep(0.01)
        assert not b.backfill()
        await a.close()  # stops the run and releases the lock
        assert b.backfill()
        await finished(b)
        assert len(ea.texts) + len(eb.texts) == len(DOCS)
        assert len(eb.texts) == len(DOCS) - 1
        assert vector_counts(pg_dsn) == {"model-a": 3, "without": 0}


async def test_a_reprocess_on_a_node_of_another_model_switches_the_corpus(
        tmp_path: Path, pg_dsn: str) -> None:
    """B (model-b) on A's corpus (model-a) says so until a Reprocess on it asks for the
    switch; during it A's searches stay hybrid on model-a, B's too while model-a is
    resident on B (else BM25-only naming the switch), and Status shows its progress; a
    document A writes meanwhile is embedded by the switch too; then the corpus is
    model-b's and A, of the other model now, says so."""
    ea, eb = Switchable("model-a"), Switchable("model-b")
    resident: dict[str, Embedder] = {"model-b": eb}
    a = node(tmp_path, "a", pg_dsn, ea)
    b = node(tmp_path, "b", pg_dsn, eb, batch=1, lookup=resident)
    await a.open()
    await b.open()
    try:
        await fill(a)
        before = await b.search("nginx logs disk")
        assert before.mode == "text" and any("model-b" in w and "model-a" in w
                                              for w in before.warnings)
        assert not b.backfill()  # a node of another model does not switch by itself
        eb.gate, eb.free = asyncio.Event(), 1
        assert await b.reprocess() == (3, "")
        for _ in range(500):  # the switch is asked for with B's first vectors
            if vector_counts(pg_dsn).get("model-b") == 1:
                break
            await asyncio.sleep(0.01)
        during = await b.search("nginx logs disk")
        assert (during.mode, during.vector_model) == ("text", "")
        assert any("rebuilt for embedding model model-b" in w for w in during.warnings)
        resident["model-a"] = HashEmbedder("model-a")
        served = await b.search("nginx logs disk")
        assert (served.mode, served.vector_model) == ("hybrid", "model-a")
        status = (await b.status()).rebuild
        assert (status.running, status.model, status.serving_model) == (
            True, "model-b", "model-a")
        on_a = await a.search("nginx logs disk")
        assert (on_a.mode, on_a.vector_model) == ("hybrid", "model-a")
        await a.upsert("docs", "printer", "printer queue stuck on floor two",
                       doc_id="docs/p")
        eb.gate.set()
        await finished(b)
        assert (await b.status()).embedding_model == "model-b"
        assert (await b.status()).rebuild.model == ""
        assert len(eb.texts) == 4  # each chunk once, the one written meanwhile included
        after = await b.search("printer queue floor")
        assert (after.mode, after.vector_model) == ("hybrid", "model-b")
        assert after.hits[0].doc_id == "docs/p" and after.hits[0].vector_rank == 1
        counts = vector_counts(pg_dsn)
        assert (counts["model-b"], counts["without"]) == (4, 0)
        with psycopg.connect(pg_dsn) as conn:  # built concurrently beside model-a's
            indexes = conn.execute(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON "
                "c.oid = i.indexrelid WHERE c.relname LIKE 'chunk_vectors_hnsw_%'").fetchall()
        assert sorted(valid for _, valid in indexes) == [True, True]
        stale = await a.search("nginx logs disk")
        assert stale.mode == "text" and any("model-a" in w and "model-b" in w
                                             for w in stale.warnings)
        assert (await a.search("printer queue", options=Query(mode="text"))).hits
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("old", range(1, SCHEMA_VERSION))
async def test_an_older_schema_is_upgraded_in_place(tmp_path: Path, pg_dsn: str,
                                                    old: int) -> None:
    """A database migrated by a llamad of an older schema version is upgraded at open to
    the current one, and the retriever then works on it."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        assert migrate(conn, "test", upto=old) == list(range(1, old + 1))
        assert schema_version(conn) == old
    PostgresStore.open(PgOptions(pg_dsn)).close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert schema_version(conn) == SCHEMA_VERSION
    embedder = Switchable("model-a")
    r = node(tmp_path, "a", pg_dsn, embedder)
    await r.open()
    try:
        await fill(r)
        assert (await r.status()).vectors == 3
    finally:
        await r.close()


async def test_an_old_schema_with_rows_keeps_them_through_the_upgrade(pg_dsn: str) -> None:
    """Rows written under schema version 1 (a document with a vector) survive the
    upgrade: the same chunk and vector are there after it."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        migrate(conn, "test", upto=1)
        conn.execute("INSERT INTO sources(id, kind, created_at) VALUES ('docs', 'push', 1)")
        conn.execute("INSERT INTO documents(id, source_id, state) VALUES "
                     "('docs/a', 'docs', 'indexed')")
        conn.execute("INSERT INTO chunks(chunk_id, doc_id, ordinal, text, content_hash) "
                     "VALUES ('docs/a#1', 'docs/a', 1, 'alpha bravo', 'h1')")
        conn.execute("INSERT INTO vector_spaces(model, dim) VALUES ('m', 2)")
        conn.execute("INSERT INTO chunk_vectors(chunk_key, space_id, dim, embedding) "
                     "SELECT key, 1, 2, '[1,0]' FROM chunks")
        conn.execute("INSERT INTO corpus_model(space_id) VALUES (1)")
    store = PostgresStore.open(PgOptions(pg_dsn))
    try:
        with psycopg.connect(pg_dsn) as conn:
            assert schema_version(conn) == SCHEMA_VERSION
        assert store.corpus_model() == ("m", 2)
        assert store.embedded_chunks("m") == 1
        assert store.spaces()[1] is None
        assert store.held_documents() == {}  # version 3's table is there
        store.replace_documents([(DocumentRow("docs/b", "docs"),
                                  [ChunkRow("docs/b#1", 1, "", "charlie", "h2")])])
        assert store.missing_count(1) == 1
        assert store.source("docs") == SourceRow("docs", "push", created_at=1)
    finally:
        store.close()


def index_states(dsn: str) -> list[bool]:
    with psycopg.connect(dsn) as conn:
        return [bool(r[0]) for r in conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname LIKE 'chunk_vectors_hnsw_%'")]


def test_a_space_index_is_built_once_by_two_nodes_and_a_failed_build_is_remade(
        pg_dsn: str) -> None:
    """Two nodes adding the same space at once get one space and one valid HNSW index;
    an index left invalid (a concurrent build that failed) is dropped and made again."""
    PostgresStore.open(PgOptions(pg_dsn)).close()  # the schema
    spaces: list[int] = []
    barrier = threading.Barrier(2)

    def add() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            barrier.wait()
            spaces.append(ensure_vector_space(conn, "m", 4))

    threads = [threading.Thread(target=add) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spaces) == 2 and spaces[0] == spaces[1]
    assert index_states(pg_dsn) == [True]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                     "%s::regclass", (hnsw_index_name(spaces[0]),))
        assert index_states(pg_dsn) == [False]
        assert ensure_vector_space(conn, "m", 4) == spaces[0]
    assert index_states(pg_dsn) == [True]


def test_during_a_switch_writes_of_both_models_are_taken_and_a_third_is_refused(
        pg_dsn: str) -> None:
    """With a switch asked for, a replacement stores the vectors of the corpus's model and
    of the target's, each in its space; a third model is refused naming it; the switch
    finishes only once no chunk lacks a target vector, and the corpus is then the
    target's."""
    store = PostgresStore.open(PgOptions(pg_dsn))
    try:
        corpus = store.use_embedding_model("model-a", 2)
        store.upsert_source(SourceRow("docs", "push"))
        target = store.request_switch("model-b", 3)
        assert store.spaces() == (Space(corpus, "model-a", 2), target)
        store.replace_documents(
            [(DocumentRow("docs/1", "docs"), [ChunkRow("docs/1#1", 1, "", "one", "h1")]),
             (DocumentRow("docs/2", "docs"), [ChunkRow("docs/2#1", 1, "", "two", "h2")])],
            [("model-a", {"h1": np.ones(2), "h2": np.ones(2)}),
             ("model-b", {"h1": np.ones(3)})])
        assert (store.embedded_chunks("model-a"), store.embedded_chunks("model-b")) == (2, 1)
        with pytest.raises(EmbeddingModelMismatch, match="model-c"):
            store.replace_documents(
                [(DocumentRow("docs/3", "docs"), [ChunkRow("docs/3#1", 1, "", "x", "h3")])],
                [("model-c", {"h3": np.ones(2)})])
        assert store.finish_switch(target.id) == "incomplete"
        [(key, _, _)] = store.missing_chunks(target.id, after=0, limit=10)
        assert store.add_vectors(target, {key: np.ones(3, dtype=np.float32)}) == 1
        assert store.finish_switch(target.id) == "done"
        assert store.corpus_model() == ("model-b", 3) and store.spaces()[1] is None
        assert store.add_vectors(Space(corpus, "model-a", 2), {key: np.ones(2)}) is None
    finally:
        store.close()
