"""The store interface's contract (retrieval/_interface.py), run against both backends: the
embedded store (SQLite + tantivy + hnswlib in a temporary directory) and the PostgreSQL
store (a real PostgreSQL 18 + pgvector server, tests/support/postgres.py). Each test is
run once per backend, through the factory (retrieval/_backend.py), and asserts the same
behaviour of the members it names on both; together they cover every member of
:class:`StoreBackend` and of the rows it gives, :class:`DocumentStore`."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from retrieval._backend import backend
from retrieval._embedder import Embedder
from retrieval._interface import DocumentStore, StoreBackend
from retrieval._limits import RetrievalLimits
from retrieval.errors import EmbeddingModelMismatch, NotFound, RetrievalError, StorageFull
from retrieval.postgres._connect import PgOptions
from retrieval.store._bm25 import Filters
from retrieval.store._rows import ChunkRow, DocumentRow, PendingWrite, SourceRow

MODEL = "m"
DATED = 1_700_000_000
DAY = 86_400
BACKENDS = ("embedded", "postgres")
NONE = Filters()


def unit(*values: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


# Each document: its text and its vector (None: ingested without one, BM25-only).
CORPUS: dict[str, tuple[str, str, np.ndarray | None, dict[str, object]]] = {
    "docs/disk": ("docs", "web01 disk full rotate nginx logs", unit(1, 0, 0, 0),
                  {"kind": "markdown", "category": "ops", "tags": ("disk", "web"),
                   "document_date": DATED}),
    "docs/db": ("docs", "db02 replication lag check replay timestamp", unit(0, 1, 0, 0),
                {"category": "db", "tags": ("db",)}),
    "logs/vpn": ("logs", "vpn tunnel flapping dead peer detection disk", unit(1, 0.2, 0, 0),
                 {"document_date": DATED + 10 * DAY}),
    "logs/plain": ("logs", "printer queue stuck on floor two", None, {}),
}


def rows_of(doc_id: str, text: str) -> list[ChunkRow]:
    return [ChunkRow(f"{doc_id}#1", 1, "", text, f"hash:{text}")]


def pending(doc_id: str, source: str, text: str, vector: np.ndarray | None,
            **fields: object) -> PendingWrite:
    doc = dataclasses.replace(DocumentRow(doc_id, source, title=f"title {doc_id}",
                                          content_hash=f"doc:{text}"), **fields)  # type: ignore[arg-type]
    rows = rows_of(doc_id, text)
    fresh = {rows[0].content_hash: vector} if vector is not None else {}
    return PendingWrite(doc, rows, MODEL if vector is not None else "", {}, fresh)


async def commit(store: StoreBackend, *writes: PendingWrite) -> list[DocumentRow]:
    async with store.write:
        return await store.commit(list(writes))


async def fill(store: StoreBackend) -> list[DocumentRow]:
    rows = store.require()
    rows.upsert_source(SourceRow("docs", "push", category="ops", tags=("t",)))
    rows.upsert_source(SourceRow("logs", "push"))
    return await commit(store, *(pending(doc_id, source, text, vector, **fields)
                                 for doc_id, (source, text, vector, fields) in CORPUS.items()))


def no_embedder() -> Embedder | None:
    return None


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    """An open store of each backend, empty, built by the factory."""
    options = PgOptions(request.getfixturevalue("pg_dsn")) \
        if request.param == "postgres" else None
    built = backend(tmp_path / "node", options, no_embedder, RetrievalLimits())
    assert built.store.kind == request.param
    await asyncio.to_thread(built.store.open_sync)
    try:
        yield built.store
    finally:
        await asyncio.to_thread(built.store.close_sync)


@pytest.fixture
async def filled(store: StoreBackend) -> StoreBackend:
    await fill(store)
    return store


def doc_ids(store: StoreBackend, ranked: list[tuple[int, float]]) -> list[str]:
    found = store.require().chunks_by_keys([k for k, _ in ranked])
    return [found[k].doc_id for k, _ in ranked]


def text(store: StoreBackend, query: str, filters: Filters = NONE) -> set[str]:
    return set(doc_ids(store, store.text_ranked(query, store.narrow(filters), 10)))


def near(store: StoreBackend, vector: np.ndarray, filters: Filters = NONE,
         model: str = MODEL) -> list[str]:
    return doc_ids(store, store.vector_ranked(model, vector, store.narrow(filters), 10))


def test_the_suite_covers_every_member_of_the_interface() -> None:
    """Every member the two protocols declare is used by a test of this module (a member
    added to the interface without a contract test fails here)."""
    source = Path(__file__).read_text(encoding="utf-8")
    declared = {name for proto in (StoreBackend, DocumentStore) for name in proto.__dict__
                if not name.startswith("_")}
    assert len(declared) > 40
    assert sorted(n for n in declared if f".{n}" not in source) == []


@pytest.mark.parametrize("kind", BACKENDS)
async def test_life_cycle(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Closed: not open, require refuses; open: empty, nothing repaired; what was committed
    is there after a close and an open again; flush and catch_up keep it all."""
    options = PgOptions(request.getfixturevalue("pg_dsn")) if kind == "postgres" else None
    store = backend(tmp_path / "node", options, no_embedder, RetrievalLimits()).store
    assert not store.is_open
    with pytest.raises(RetrievalError, match="not open"):
        store.require()
    store.open_sync()
    assert store.is_open and store.repaired == {} and store.require().sources() == []
    assert isinstance(store.write, asyncio.Lock)
    # The embedded store writes one batch at a time under the lock; PostgreSQL orders
    # concurrent transactions itself and takes its option's count (2 by default).
    assert store.commits_in_flight == (2 if kind == "postgres" else 1)
    await fill(store)
    await store.flush()
    await store.catch_up()
    store.close_sync()
    assert not store.is_open
    with pytest.raises(RetrievalError, match="not open"):
        store.require()
    store.open_sync()
    try:
        assert [d.id for d in store.require().documents()] == sorted(CORPUS)
        assert text(store, "replication") == {"docs/db"}
        assert store.serving_model() == MODEL == store.vector_model
    finally:
        store.close_sync()


async def test_commit_returns_the_documents_indexed_and_stores_their_rows(
        store: StoreBackend) -> None:
    """commit: every document indexed with its chunks; the rows read back the same."""
    committed = await fill(store)
    assert [d.state for d in committed] == ["indexed"] * len(CORPUS)
    assert all(d.indexed_at > 0 for d in committed)
    rows = store.require()
    disk = rows.document("docs/disk")
    assert disk is not None and (disk.state, disk.kind, disk.category, disk.tags,
                                 disk.document_date, disk.title) == \
        ("indexed", "markdown", "ops", ("disk", "web"), DATED, "title docs/disk")
    assert rows.document("docs/none") is None
    assert [d.id for d in rows.documents()] == sorted(CORPUS)
    assert [d.id for d in rows.documents("logs")] == ["logs/plain", "logs/vpn"]
    keys = rows.chunk_keys()
    assert len(keys) == len(CORPUS)
    disk_keys = rows.document_chunk_keys("docs/disk")
    assert len(disk_keys) == 1 and disk_keys <= keys
    chunk = rows.chunks_by_keys(disk_keys)[next(iter(disk_keys))]
    assert (chunk.chunk_id, chunk.doc_id, chunk.source_id, chunk.text, chunk.kind,
            chunk.tags, chunk.document_date) == \
        ("docs/disk#1", "docs/disk", "docs", CORPUS["docs/disk"][1], "markdown",
         ("disk", "web"), DATED)
    assert rows.chunk_ids(disk_keys | {999_999}) == {next(iter(disk_keys)): "docs/disk#1"}
    assert rows.keys_matching(sources=["logs"]) == \
        rows.document_chunk_keys("logs/vpn") | rows.document_chunk_keys("logs/plain")
    assert rows.keys_matching() == keys


async def test_document_counts(filled: StoreBackend) -> None:
    """document_counts: per source, as documents() holds them, held ones included, an
    empty source left out; leaving_out takes those ids out of the count (unknown ones,
    and a thousand and more, change nothing else)."""
    rows = filled.require()
    rows.upsert_source(SourceRow("empty", "push"))
    assert rows.document_counts() == {"docs": 2, "logs": 2}
    rows.hold_document(DocumentRow("logs/new", "logs", title="held"), "a held text")
    assert rows.document_counts() == {"docs": 2, "logs": 3} == {
        s: sum(d.source_id == s for d in rows.documents()) for s in ("docs", "logs")}
    assert rows.document_counts(["docs/db", "logs/new", "logs/none"]) == \
        {"docs": 1, "logs": 2}
    assert rows.document_counts(["docs/db", "docs/disk"]) == {"logs": 3}
    many = [f"docs/x{i}" for i in range(1200)] + ["logs/vpn", "it's \"quoted\""]
    assert rows.document_counts(many) == {"docs": 2, "logs": 2}


async def test_a_commit_replaces_a_document_whole(filled: StoreBackend) -> None:
    """A document committed again: its old chunks leave both lists, the new ones enter."""
    before = filled.require().document_chunk_keys("docs/db")
    await commit(filled, pending("docs/db", "docs", "kafka consumer group rebalancing",
                                 unit(0, 0, 1, 0)))
    after = filled.require().document_chunk_keys("docs/db")
    assert before.isdisjoint(after) and not before & filled.require().chunk_keys()
    assert text(filled, "replication") == set()
    assert text(filled, "kafka rebalancing") == {"docs/db"}
    assert near(filled, unit(0, 0, 1, 0))[0] == "docs/db"


async def test_copies_of_names_every_chunk_holding_a_text(filled: StoreBackend) -> None:
    text = CORPUS["docs/disk"][1]
    await commit(filled, pending("logs/copy", "logs", text, None, category="copied"))
    rows = filled.require()
    found = rows.copies_of([f"hash:{text}", "hash:nothing"], 10)
    assert [c.doc_id for c in found[f"hash:{text}"]] == ["docs/disk", "logs/copy"]
    assert [c.category for c in found[f"hash:{text}"]] == ["ops", "copied"]  # each its own
    assert found["hash:nothing"] == []
    assert [c.doc_id for c in rows.copies_of([f"hash:{text}"], 1)[f"hash:{text}"]] == \
        ["docs/disk"]


async def test_the_embedding_cache_keeps_committed_vectors(filled: StoreBackend) -> None:
    """cached_vectors: the vectors committed, by content hash and model; none of others."""
    rows = filled.require()
    disk_hash = rows_of("docs/disk", CORPUS["docs/disk"][1])[0].content_hash
    plain_hash = rows_of("logs/plain", CORPUS["logs/plain"][1])[0].content_hash
    cached = rows.cached_vectors(MODEL, [disk_hash, plain_hash, "hash:none"])
    assert list(cached) == [disk_hash]
    assert np.allclose(cached[disk_hash], unit(1, 0, 0, 0))
    assert rows.cached_vectors("other", [disk_hash]) == {}


async def test_text_ranked_applies_every_filter_inside(filled: StoreBackend) -> None:
    """text_ranked: the documents holding the words, best first, within the filters."""
    assert text(filled, "disk") == {"docs/disk", "logs/vpn"}
    assert text(filled, "disk", Filters(sources=("docs",))) == {"docs/disk"}
    assert text(filled, "disk", Filters(kinds=("text",))) == {"logs/vpn"}
    assert text(filled, "disk replication", Filters(categories=("db",))) == {"docs/db"}
    assert text(filled, "disk replication", Filters(tags=("web", "db"))) == \
        {"docs/disk", "docs/db"}
    assert text(filled, "disk", Filters(since=2**40)) == set()
    assert text(filled, "zebra") == set()
    ranked = filled.text_ranked("disk", Filters(), 1)
    assert len(ranked) == 1 and ranked[0][1] > 0


async def test_narrow_keeps_both_lists_to_the_documents_own_dates(
        filled: StoreBackend) -> None:
    """narrow: bounds on the documents' own dates hold in both lists (an undated document
    never passes them); filters without dates come back as they were."""
    assert filled.narrow(Filters(sources=("docs",))) == Filters(sources=("docs",))
    first = Filters(dated_until=DATED + DAY)
    assert text(filled, "disk", first) == {"docs/disk"}
    assert text(filled, "disk", Filters(dated_since=DATED + DAY)) == {"logs/vpn"}
    assert set(near(filled, unit(1, 0, 0, 0), first)) == {"docs/disk"}
    assert text(filled, "replication", Filters(dated_since=0)) == set()


async def test_vector_ranked_searches_the_serving_models_vectors(store: StoreBackend) -> None:
    """serving_model: "" before any vector, then the model of the committed vectors;
    vector_ranked: nearest first, filters inside, refusing another model's query."""
    assert store.serving_model() == ""
    await fill(store)
    assert store.serving_model() == MODEL == store.vector_model
    assert near(store, unit(1, 0, 0, 0)) == ["docs/disk", "logs/vpn", "docs/db"]
    ranked = store.vector_ranked(MODEL, unit(1, 0, 0, 0), Filters(), 10)
    assert ranked[0][1] == pytest.approx(0.0, abs=1e-4)  # cosine distance
    assert near(store, unit(1, 0, 0, 0), Filters(sources=("logs",))) == ["logs/vpn"]
    assert near(store, unit(1, 0, 0, 0), Filters(categories=("db",))) == ["docs/db"]
    with pytest.raises(EmbeddingModelMismatch):
        store.vector_ranked("other", unit(1, 0, 0, 0), Filters(), 10)


async def test_delete_document_leaves_every_index(filled: StoreBackend) -> None:
    """delete_document: True, and the document is gone from the rows and both lists;
    False for a document that does not exist."""
    keys = filled.require().document_chunk_keys("docs/disk")
    assert await filled.delete_document("docs/disk") is True
    assert await filled.delete_document("docs/disk") is False
    assert filled.require().document("docs/disk") is None
    assert not keys & filled.require().chunk_keys()
    assert text(filled, "disk") == {"logs/vpn"}
    assert "docs/disk" not in near(filled, unit(1, 0, 0, 0))


async def test_delete_source_removes_its_documents(filled: StoreBackend) -> None:
    """delete_source: the source's chunk keys, its documents gone; NotFound if unknown."""
    keys = filled.require().keys_matching(sources=["logs"])
    assert set(await filled.delete_source("logs")) == keys
    rows = filled.require()
    assert rows.source("logs") is None and [s.id for s in rows.sources()] == ["docs"]
    assert [d.id for d in rows.documents()] == ["docs/db", "docs/disk"]
    assert text(filled, "disk") == {"docs/disk"}
    assert near(filled, unit(1, 0, 0, 0)) == ["docs/disk", "docs/db"]
    with pytest.raises(NotFound):
        await filled.delete_source("logs")


async def test_sources_rows(store: StoreBackend) -> None:
    """upsert_source adds, then updates settings keeping documents; source, sources;
    mark_scanned records when and the error."""
    await fill(store)
    rows = store.require()
    assert [s.id for s in rows.sources()] == ["docs", "logs"]
    docs = rows.source("docs")
    assert docs is not None and (docs.kind, docs.category, docs.tags) == \
        ("push", "ops", ("t",))
    rows.upsert_source(SourceRow("docs", "push", category="infra", review_required=True))
    docs = rows.source("docs")
    assert docs is not None and (docs.category, docs.review_required) == ("infra", True)
    assert len(rows.documents("docs")) == 2
    rows.mark_scanned("logs", "permission denied")
    logs = rows.source("logs")
    assert logs is not None and logs.last_scan and logs.last_error == "permission denied"
    assert rows.source("none") is None
    # A directory source's exclude patterns, and what its last full scan left out (a
    # scan that stopped early records no count: the last one stays).
    rows.upsert_source(SourceRow("tree", "directory", "/srv/kb",
                                 exclude=("private/", "!keep.pem")))
    rows.mark_scanned("tree", "", 7)
    rows.mark_scanned("tree", "root changed")
    tree = rows.source("tree")
    assert tree is not None and (tree.exclude, tree.excluded) == (("private/", "!keep.pem"), 7)
    rows.upsert_source(SourceRow("tree", "directory", "/srv/kb"))
    tree = rows.source("tree")
    assert tree is not None and (tree.exclude, tree.excluded) == ((), 7)


async def test_set_source_disabled_and_disabled(filled: StoreBackend) -> None:
    """set_source_disabled: True for a source (False for none); disabled() names a
    disabled source asked for, never an enabled one; enabling it again clears it."""
    assert await filled.set_source_disabled("logs", True) is True
    logs = filled.require().source("logs")
    assert logs is not None and logs.disabled
    assert "logs" in await filled.disabled(["logs"])
    assert "docs" not in await filled.disabled(["docs", "logs"])
    assert await filled.set_source_disabled("logs", False) is True
    assert "logs" not in await filled.disabled(["logs"])
    assert await filled.set_source_disabled("none", True) is False


async def test_set_state_records_a_state_keeping_chunks(filled: StoreBackend) -> None:
    """set_state: the document shows the state and error; its indexed chunks stay; a
    document without a row gets one."""
    rows = filled.require()
    disk = rows.document("docs/disk")
    assert disk is not None
    rows.set_state(disk, "failed", "extraction failed")
    after = rows.document("docs/disk")
    assert after is not None and (after.state, after.error) == ("failed", "extraction failed")
    assert text(filled, "nginx") == {"docs/disk"}
    rows.set_state(DocumentRow("docs/new", "docs", title="new"), "processing")
    new = rows.document("docs/new")
    assert new is not None and new.state == "processing"


async def test_review_rows_and_withdraw(filled: StoreBackend) -> None:
    """hold_document, held_document, held_version, held_documents, release_held; a
    rejection through withdraw takes the document out of both lists and returns its keys;
    one review turn at a time, each released after its block."""
    rows = filled.require()
    indexed = rows.document("docs/db")
    assert indexed is not None
    version = dataclasses.replace(indexed, title="new title", content_hash="doc:new")
    async with filled.review_turn("docs/db"):
        rows.hold_document(version, "db02 replication healthy again")
    held = rows.held_document("docs/db")
    assert held is not None and held[1] == "db02 replication healthy again"
    assert held[0].content_hash == "doc:new"
    shown = rows.held_version("docs/db")
    assert shown is not None and (shown.state, shown.title) == ("review_required", "new title")
    assert list(rows.held_documents()) == ["docs/db"] == list(rows.held_documents("docs"))
    assert rows.held_documents("logs") == {}
    assert text(filled, "replication lag") == {"docs/db"}  # the indexed version stays
    rows.release_held("docs/db")
    assert rows.held_document("docs/db") is None
    released = rows.document("docs/db")
    assert released is not None and released.state == "indexed"

    keys = rows.document_chunk_keys("docs/db")
    async with filled.review_turn("docs/db"):
        rows.hold_document(version, "db02 replication healthy again")
        removed = await filled.withdraw(
            functools.partial(rows.reject_document, "docs/db", "not ours"))
    assert set(removed) == keys
    rejected = rows.document("docs/db")
    assert rejected is not None and (rejected.state, rejected.review_note) == \
        ("rejected", "not ours")
    assert rows.held_document("docs/db") is None
    assert text(filled, "replication") == set()
    assert "docs/db" not in near(filled, unit(0, 1, 0, 0))


async def test_history_records_expire_and_are_pruned(store: StoreBackend) -> None:
    """expired_records: the oldest records past the age or beyond the newest ``keep``,
    at most ``limit``; prune_records through withdraw deletes and counts them."""
    rows = store.require()
    rows.upsert_source(SourceRow("h", "history", max_items=2))
    await commit(store, *(pending(f"h/{i}", "h", f"record {i} alarm", None,
                                  document_date=DATED + i * DAY) for i in range(4)))
    assert rows.expired_records("h", before=None, keep=2, limit=10) == ["h/0", "h/1"]
    assert rows.expired_records("h", before=DATED + DAY, keep=0, limit=10) == ["h/0"]
    assert rows.expired_records("h", before=DATED + 3 * DAY, keep=0, limit=2) == \
        ["h/0", "h/1"]
    assert rows.expired_records("h", before=None, keep=0, limit=10) == []
    counted: list[int] = []

    def prune() -> list[int]:
        deleted, keys = rows.prune_records("h", ["h/0", "h/1", "h/gone"])
        counted.append(deleted)
        return keys

    removed = await store.withdraw(prune)
    assert counted == [2] and len(removed) == 2
    assert [d.id for d in rows.documents("h")] == ["h/2", "h/3"]
    source = rows.source("h")
    assert source is not None and source.pruned == 2
    assert text(store, "alarm") == {"h/2", "h/3"}


async def test_scan_turn_is_taken_and_given_back(filled: StoreBackend) -> None:
    """try_scan_lock_sync takes a source's turn; release_scan_lock_sync gives it back, so
    it can be taken again."""
    assert filled.try_scan_lock_sync("docs") is True
    filled.release_scan_lock_sync("docs")
    assert filled.try_scan_lock_sync("docs") is True
    filled.release_scan_lock_sync("docs")


async def test_status_counts(filled: StoreBackend) -> None:
    """status: sources, chunks, documents by state (with those processing and pending),
    the vectors' model, the chunks embedded for a model, the vectors, the backend."""
    status = await filled.status(MODEL, processing=1, pending=2)
    assert (status.sources, status.chunks, status.embedding_model, status.embedded_chunks,
            status.vectors, status.store, status.repaired) == \
        (2, 4, MODEL, 3, 3, filled.kind, {})
    assert status.documents_by_state == {"indexed": 4, "processing": 1, "pending": 2}
    assert (await filled.status("other", processing=0)).embedded_chunks == 0


async def test_sizes_are_what_the_lists_search(filled: StoreBackend) -> None:
    """sizes: the chunks the lexical list ranks and the vectors the vector list searches
    (three of the four documents have one), as status counts them; a deleted document
    leaves both (a small store is counted exactly, at once)."""
    assert await filled.sizes() == (4, 3)
    status = await filled.status(MODEL, processing=0)
    assert await filled.sizes() == (status.chunks, status.vectors)
    assert await filled.delete_document("docs/disk") is True
    assert await filled.sizes() == (3, 2)
    assert await filled.delete_document("logs/plain") is True
    assert await filled.sizes() == (2, 2)


async def test_storage_full_says_what_to_do(store: StoreBackend) -> None:
    """storage_full: the error for a full disk, saying to free space and that what was
    indexed before is intact."""
    error = store.storage_full()
    assert isinstance(error, StorageFull)
    assert "free space" in str(error) and "intact" in str(error)
