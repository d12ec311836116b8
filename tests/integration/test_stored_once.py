"""A text several documents hold is stored once (issue 30), on both store backends (the
embedded store in a temporary directory, a real PostgreSQL 18 + pgvector server), counted
in the index itself: one BM25 entry and one vector per text, each document keeping its
rows; the entry moves to another holder when its indexed holder goes, and leaves with the
last (its postings and its document frequency too); filters apply to the holders; copies
neither take candidate slots nor count twice; two writers of one text leave one entry; a
store made before this upgrades in place at open.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest

from retrieval import Filters, Query, Retriever
from retrieval.postgres._bm25 import write_terms
from retrieval.postgres._connect import PgOptions
from retrieval.postgres._schema import ensure_vector_space, migrate
from retrieval.store._bm25 import IndexedChunk, TextIndex
from retrieval.store._indexes import Indexes
from retrieval.store._vectors import VectorIndex
from tests.support.embedder import HashEmbedder
from tests.support.postgres import two_nodes

pytestmark = pytest.mark.integration

TEXT = ("Rotate the nginx logs on web01 when the disk fills up, then check df -h and "
        "restart the log shipper.")
OTHER = "The vpn tunnel flaps: tune dead peer detection on both gateways, then nginx."
QUERY = "nginx logs disk df"
DATED = 1_700_000_000

Counts = Callable[[], tuple[int, int, int]]
"""(BM25 entries, vectors, entries holding "nginx": its document frequency)."""


@pytest.fixture(params=("embedded", "postgres"))
async def store(request: pytest.FixtureRequest, tmp_path: Path
                ) -> AsyncIterator[tuple[Retriever, Counts]]:
    dsn = request.getfixturevalue("pg_dsn") if request.param == "postgres" else ""
    r = Retriever(tmp_path / "node", lambda: HashEmbedder("m"),
                  postgres=PgOptions(dsn) if dsn else None)
    await r.open()
    try:
        assert r.store_kind == request.param
        await r.add_source("runbooks", category="ops")
        await r.add_source("wiki", category="notes")
        yield r, (lambda: pg_counts(dsn)) if dsn else (lambda: counts(r))
    finally:
        await r.close()


def _indexes(r: Retriever) -> Indexes:
    indexes = r._indexes
    assert indexes.text is not None and indexes.vectors is not None
    return indexes


def counts(r: Retriever) -> tuple[int, int, int]:
    """The embedded index's (tantivy's live documents, hnswlib's live vectors)."""
    indexes = _indexes(r)
    assert indexes.text is not None and indexes.vectors is not None
    return indexes.text.count(), indexes.vectors.count(), indexes.text.holding("nginx")


def pg_counts(dsn: str) -> tuple[int, int, int]:
    """The PostgreSQL store's: BM25 documents, vectors, and the statistics' document
    frequency of "nginx" (checked against its postings)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM bm25_docs), (SELECT count(*) FROM chunk_vectors), "
            "(SELECT coalesce(sum(df), 0) FROM bm25_df WHERE term = 'b:nginx'), "
            "(SELECT count(*) FROM bm25_postings WHERE term = 'b:nginx')").fetchone()
    assert row is not None and row[2] == row[3]
    return int(row[0]), int(row[1]), int(row[2])


async def hits(r: Retriever, mode: str = "hybrid", filters: Filters | None = None,
               k: int = 5, candidates: int | None = None) -> list[tuple[str, tuple[str, ...]]]:
    result = await r.search(QUERY, k=k, filters=filters,
                            options=Query(mode=mode, candidates=candidates))
    return [(h.doc_id, h.also_in) for h in result.hits if h.text == TEXT]


async def test_one_entry_and_one_vector_a_text_moving_to_the_next_holder(
        store: tuple[Retriever, Counts]) -> None:
    r, count = store
    await r.upsert("runbooks", "Disk full", TEXT, doc_id="a")
    assert count() == (1, 1, 1)
    await r.upsert("wiki", "Copied note", TEXT, doc_id="b", tags=("copied",))
    await r.upsert("wiki", "Vpn", OTHER, doc_id="other")
    # Two texts: two entries, two vectors; "nginx" is in two texts (not three chunks).
    assert count() == (2, 2, 2)
    assert (await r.status()).chunks == 3  # each document keeps its own chunk row
    for mode in ("hybrid", "text", "vector"):
        assert await hits(r, mode) == [("a", ("b",))], mode
    # The indexed holder goes: the text stays, under the other one, still once.
    assert await r.delete("a")
    assert count() == (2, 2, 2)
    for mode in ("hybrid", "text", "vector"):
        assert await hits(r, mode) == [("b", ())], mode
    # The last holder goes: no entry, no vector, no posting of the text left.
    assert await r.delete("b")
    assert count() == (1, 1, 1)
    for mode in ("hybrid", "text", "vector"):
        assert await hits(r, mode) == [], mode


async def test_replacing_the_indexed_holder_promotes_the_other(
        store: tuple[Retriever, Counts]) -> None:
    r, count = store
    await r.upsert("runbooks", "Disk full", TEXT, doc_id="a")
    await r.upsert("wiki", "Copied note", TEXT, doc_id="b")
    await r.upsert("runbooks", "Disk full", OTHER, doc_id="a")  # a now holds the other text
    assert count()[:2] == (2, 2)
    assert await hits(r) == [("b", ())]
    result = await r.search("vpn tunnel dead peer", k=5, options=Query(mode="text"))
    assert [(h.doc_id, h.text) for h in result.hits] == [("a", OTHER)]


async def test_filters_apply_to_every_holder(store: tuple[Retriever, Counts]) -> None:
    """The entry is a's (runbooks, ops); a filter admitting only b still finds the text,
    shown under b; a filter no single holder passes (b's source with a's category) finds
    nothing, in either list."""
    r, _ = store
    await r.upsert("runbooks", "Disk full", TEXT, doc_id="a", tags=("web",))
    await r.upsert("wiki", "Copied note", TEXT, doc_id="b", category="howto",
                   tags=("copied",), kind="markdown", document_date=DATED)
    for mode in ("hybrid", "text", "vector"):
        for filters in (Filters(sources=("wiki",)), Filters(categories=("howto",)),
                        Filters(tags=("copied",)), Filters(kinds=("markdown",)),
                        Filters(dated_since=DATED - 1, dated_until=DATED + 1)):
            assert await hits(r, mode, filters) == [("b", ())], (mode, filters)
        assert await hits(r, mode, Filters(tags=("web",))) == [("a", ())], mode
        assert await hits(r, mode, Filters(sources=("wiki",), categories=("ops",))) == []
        assert await hits(r, mode, Filters(since=2**40)) == []
    # A disabled source's holder is left out, the text still found under the other.
    await r.set_source_disabled("runbooks", True)
    for mode in ("hybrid", "text", "vector"):
        assert await hits(r, mode) == [("b", ())], mode


async def test_copies_take_no_candidate_slot(store: tuple[Retriever, Counts]) -> None:
    """k = 2 with two candidates a list over three copies of one text and another text:
    both texts (a list of chunks would have given two copies)."""
    r, _ = store
    for i in range(3):
        await r.upsert("wiki", f"copy {i}", TEXT, doc_id=f"copy{i}")
    await r.upsert("wiki", "Vpn", OTHER, doc_id="other")
    for mode in ("hybrid", "text", "vector"):
        result = await r.search(QUERY, k=2, options=Query(mode=mode, candidates=2))
        assert sorted(h.text for h in result.hits) == sorted([TEXT, OTHER]), mode


async def test_concurrent_writers_of_one_text_leave_one_entry(
        store: tuple[Retriever, Counts]) -> None:
    r, count = store
    await asyncio.gather(*(r.upsert("wiki", f"copy {i}", TEXT, doc_id=f"copy{i}")
                           for i in range(8)))
    assert count() == (1, 1, 1)
    assert [sorted([d, *also]) for d, also in await hits(r, k=3)] == [
        sorted(f"copy{i}" for i in range(8))]


async def test_a_failed_index_write_is_caught_up(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded: SQLite took the second holder and tantivy did not (a full disk, say):
    the next write brings the entry in line, and a filter admitting only that holder
    finds it."""
    r = Retriever(tmp_path / "node", lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("runbooks")
    await r.add_source("wiki")
    await r.upsert("runbooks", "Disk full", TEXT, doc_id="a")
    indexes = _indexes(r)
    real = TextIndex.commit

    def failing(self: TextIndex) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(TextIndex, "commit", failing)
    with pytest.raises(Exception, match="no space left"):
        await r.upsert("wiki", "Copied note", TEXT, doc_id="b")
    assert indexes.behind
    monkeypatch.setattr(TextIndex, "commit", real)
    await r.upsert("wiki", "Vpn", OTHER, doc_id="other")
    assert await hits(r, "text", Filters(sources=("wiki",))) == [("b", ())]
    assert counts(r)[:2] == (2, 2)
    await r.close()


async def test_a_store_made_before_upgrades_in_place(tmp_path: Path) -> None:
    """A store whose text and vector indexes hold a document per chunk (before entries)
    is rebuilt at open: one entry and one vector a text, the copies' gone, search as
    before."""
    root = tmp_path / "node"
    r = Retriever(root, lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("wiki")
    for i in range(3):
        await r.upsert("wiki", f"copy {i}", TEXT, doc_id=f"copy{i}")
    await r.upsert("wiki", "Vpn", OTHER, doc_id="other")
    await r.close()
    _age(root)
    r = Retriever(root, lambda: HashEmbedder("m"))
    await r.open()
    try:
        assert counts(r) == (2, 2, 2)
        assert (await r.status()).repaired.get("vectors_removed") == 2
        assert [sorted([d, *also]) for d, also in await hits(r)] == [
            ["copy0", "copy1", "copy2"]]
        assert await hits(r, "text", Filters(doc_ids=frozenset({"copy2"}))) == [
            ("copy2", ())]
        assert await r.delete("copy0") and counts(r) == (2, 2, 2)
    finally:
        await r.close()


def _age(root: Path) -> None:
    """Make ``root`` as a store before entries: no ``chunks.entry`` nor its triggers, a
    text index and a vector index holding every chunk."""
    db = sqlite3.connect(root / "meta.sqlite3", isolation_level=None)
    for trigger in ("chunks_entry_insert", "chunks_entry_delete"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute("DROP INDEX chunks_entry")
    db.execute("ALTER TABLE chunks DROP COLUMN entry")
    db.execute("DROP TABLE entry_dirty")
    db.execute("DELETE FROM meta WHERE key = 'text_format'")
    rows = db.execute(
        "SELECT c.key, c.doc_id, d.source_id, d.kind, d.category, d.tags, d.indexed_at, "
        "d.title, c.heading, c.text, e.vector FROM chunks c JOIN documents d ON "
        "d.id = c.doc_id JOIN embeddings e ON e.content_hash = c.content_hash").fetchall()
    dim = int(db.execute("SELECT value FROM meta WHERE key = 'vector_dim'").fetchone()[0])
    db.close()
    text = TextIndex(root / "bm25")
    text.add([IndexedChunk(k, d, s, kind, cat, tuple(json.loads(tags)), at, title, h, t)
              for k, d, s, kind, cat, tags, at, title, h, t, _ in rows])
    text.commit()
    text.close()
    vectors = VectorIndex(root / "vectors.hnsw", dim)
    vectors.add([r[0] for r in rows], np.stack([np.frombuffer(r[10], dtype=np.float32)
                                                for r in rows]))
    vectors.save()
    assert vectors.count() == 4


async def test_two_nodes_writing_one_text_leave_one_entry(tmp_path: Path, pg_dsn: str) -> None:
    """PostgreSQL: two nodes (two connections) write the same text under two ids at once,
    many times over: one entry, one vector, one document frequency each time."""
    async with two_nodes(tmp_path, pg_dsn) as (a, b):
        for node in (a, b):
            await node.add_source("wiki")
        for i in range(6):
            text = f"{TEXT} Round {i}."
            await asyncio.gather(a.upsert("wiki", "on a", text, doc_id=f"a{i}"),
                                 b.upsert("wiki", "on b", text, doc_id=f"b{i}"))
        assert pg_counts(pg_dsn) == (6, 6, 6)
        for node in (a, b):
            result = await node.search(f"{QUERY} Round 3", k=1, options=Query(mode="text"))
            assert [sorted([h.doc_id, *h.also_in]) for h in result.hits] == [["a3", "b3"]]
        await a.delete("a3")
        await b.delete("b3")
        assert pg_counts(pg_dsn) == (5, 5, 5)


async def test_a_postgres_store_made_before_upgrades_in_place(tmp_path: Path,
                                                              pg_dsn: str) -> None:
    """A schema 7 database, every chunk with its own BM25 rows and vector (three copies of
    one text and another text), migrated at open: one entry and one vector a text, the
    document frequency counting the text once, search as before."""
    vectors = await HashEmbedder("m").embed([TEXT, OTHER])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        migrate(conn, "test", upto=7)
        space = ensure_vector_space(conn, "m", len(vectors[0]))
        conn.execute("INSERT INTO corpus_model(space_id) VALUES (%s)", (space,))
        conn.execute("INSERT INTO sources(id, kind, created_at) VALUES ('wiki', 'push', 1)")
        docs = [(f"copy{i}", TEXT, vectors[0]) for i in range(3)] + [("other", OTHER,
                                                                      vectors[1])]
        with conn.transaction():
            for doc_id, text, vector in docs:
                conn.execute("INSERT INTO documents(id, source_id, title, state, indexed_at) "
                             "VALUES (%s, 'wiki', %s, 'indexed', 1)", (doc_id, doc_id))
                row = conn.execute(
                    "INSERT INTO chunks(chunk_id, doc_id, ordinal, title, text, content_hash) "
                    "VALUES (%s, %s, 1, %s, %s, md5(%s)) RETURNING key",
                    (f"{doc_id}#1", doc_id, doc_id, text, text)).fetchone()
                assert row is not None
                write_terms(conn, [(int(row[0]), doc_id, "", text)])
                conn.execute("INSERT INTO chunk_vectors(chunk_key, space_id, dim, embedding) "
                             "VALUES (%s, %s, %s, %s::float4[]::vector)",
                             (row[0], space, len(vector), vector))
    assert pg_counts(pg_dsn) == (4, 4, 4)
    r = Retriever(tmp_path / "node", lambda: HashEmbedder("m"), postgres=PgOptions(pg_dsn))
    await r.open()
    try:
        assert pg_counts(pg_dsn) == (2, 2, 2)
        for mode in ("hybrid", "text", "vector"):
            assert [sorted([d, *also]) for d, also in await hits(r, mode)] == [
                ["copy0", "copy1", "copy2"]], mode
        assert await r.delete("copy0") and pg_counts(pg_dsn) == (2, 2, 2)
        assert await hits(r, "vector", Filters(sources=("wiki",))) == [("copy1", ("copy2",))]
    finally:
        await r.close()
