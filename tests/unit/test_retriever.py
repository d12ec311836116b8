"""The Retriever facade with the deterministic hash embedder: it degrades to BM25 instead of
failing, validates its inputs naming the option, deletes from every index, and catches the
derived indexes up after a write that SQLite took and tantivy or hnswlib did not."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from retrieval import (
    Hit,
    InvalidDocument,
    NotFound,
    RetrievalError,
    RetrievalLimits,
    RetrievalStatus,
    Retriever,
)
from retrieval.store._bm25 import TextIndex
from retrieval.store._vectors import VectorIndex
from tests.support.embedder import DOCS, HashEmbedder, filled
from tests.support.load import patience


class FlakyEmbedder(HashEmbedder):
    """A hash embedder that raises (or hangs) while ``failing`` (or ``hanging``) is set."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.failing = False
        self.hanging = False

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.failing:
            raise ConnectionError("embedding child went away")
        if self.hanging:
            await asyncio.Event().wait()
        return await super().embed(texts)


@pytest.fixture
async def hashed(tmp_path: Path) -> AsyncIterator[Retriever]:
    r = await filled(tmp_path, HashEmbedder("m"))
    yield r
    await r.close()


def doc_ids(hits: Sequence[Hit]) -> set[str]:
    return {h.doc_id for h in hits}


# -- status --------------------------------------------------------------------------------


class GatedEmbedder(HashEmbedder):
    """A hash embedder whose requests wait while ``gate`` is set and closed; ``arrived``
    is set once ``expected`` texts wait there."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.gate: asyncio.Event | None = None
        self.expected = 0
        self.waiting = 0
        self.arrived = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.gate is not None and not self.gate.is_set():
            self.waiting += len(texts)
            if self.waiting >= self.expected:
                self.arrived.set()
            await self.gate.wait()
        return await super().embed(texts)


async def test_document_counts_are_the_listing_counted_with_documents_under_way(
        tmp_path: Path) -> None:
    """document_counts (Status's and ListSources' numbers) equals documents() counted per
    source while documents are in flight: a new one and a replaced one (their embedding
    waits), one moved to another source by its id, and one journalled (wait=false). A
    source with none is left out."""
    embedder = GatedEmbedder("m")
    # Room for each of the three texts' requests at the gate at once (with the default 2 in
    # flight, a third text waits in the batcher, before the gate, whenever the first two
    # went out in separate requests).
    r = await filled(tmp_path, embedder, RetrievalLimits(embed_concurrency=4))
    stuck: list[asyncio.Task[object]] = []
    gate = embedder.gate = asyncio.Event()
    gate.set()
    try:
        await r.add_source("logs")
        await r.add_source("empty")
        await r.upsert("logs", "vpn", "vpn tunnel up again", doc_id="logs/vpn")

        async def listed() -> dict[str, int]:
            counts: dict[str, int] = {}
            for d in await r.documents():
                counts[d.source_id] = counts.get(d.source_id, 0) + 1
            return counts

        assert await r.document_counts() == await listed() == {"docs": 3, "logs": 1}
        gate.clear()
        embedder.expected = 3
        stuck += [asyncio.create_task(r.upsert(source, "t", text, doc_id=doc_id))
                  for source, text, doc_id in (
                      ("docs", "a new runbook on printers", "docs/new"),
                      ("docs", "db02 lag: replay again", "docs/db"),
                      ("logs", "disk full moved to the logs", "docs/disk"))]
        async with asyncio.timeout(patience(10)):
            await embedder.arrived.wait()  # all three are being processed
        await r.upsert_later("logs", "later", "a journalled log line", doc_id="logs/later")
        docs = await r.documents()
        assert {d.id for d in docs if d.state in ("processing", "pending")} >= \
            {"docs/new", "docs/db", "docs/disk"}
        assert await r.document_counts() == await listed() == {"docs": 3, "logs": 3}
    finally:
        gate.set()
        await asyncio.gather(*stuck, return_exceptions=True)
        await r.close()


async def test_status_counts_every_store(hashed: Retriever) -> None:
    """status() is a RetrievalStatus counting sources, documents by state, chunks, vectors."""
    status = await hashed.status()
    assert status.disk_bytes > 0
    assert dataclasses.replace(status, disk_bytes=0) == RetrievalStatus(
        sources=1, chunks=3, documents_by_state={"indexed": 3}, embedding_model="m",
        embedded_chunks=3, vectors=3, disk_bytes=0, repaired={})


# -- degradation ---------------------------------------------------------------------------


async def test_without_an_embedder_upsert_indexes_and_search_is_bm25_only(
        tmp_path: Path) -> None:
    """With no embedder, upserts are indexed (BM25 only) and search says why it is text-only."""
    r = await filled(tmp_path, None, unavailable_reason=lambda: "embedding role disabled")
    assert [d.state for d in await r.documents()] == ["indexed"] * 3
    result = await r.search("replication lag")
    assert result.mode == "text"
    assert result.hits[0].doc_id == "docs/db"
    assert result.hits[0].search_source == "text"
    assert result.hits[0].vector_rank is None
    assert result.warnings == ["embedding role disabled: results are BM25-only"]
    status = await r.status()
    assert (status.vectors, status.embedded_chunks, status.chunks) == (0, 0, 3)
    await r.close()


async def test_an_embedder_that_fails_at_ingest_leaves_the_document_bm25_only(
        tmp_path: Path) -> None:
    """An embedding failure during upsert indexes the document for BM25 and acknowledges it."""
    embedder = FlakyEmbedder("m")
    r = await filled(tmp_path, embedder)
    embedder.failing = True
    doc = await r.upsert("docs", "printer", "printer queue stuck on floor two",
                         doc_id="docs/printer")
    assert doc.state == "indexed"
    embedder.failing = False
    result = await r.search("printer queue")
    assert result.mode == "hybrid"
    top = next(h for h in result.hits if h.doc_id == "docs/printer")
    assert top.search_source == "text"  # no vector of it: only BM25 found it
    status = await r.status()
    assert (status.chunks, status.vectors, status.embedded_chunks) == (4, 3, 3)
    await r.close()


async def answered_by_bm25(r: Retriever, query: str, top: str, warning: str) -> None:
    """``query`` is answered by BM25 alone (text mode), ``top`` first, saying ``warning``."""
    result = await r.search(query)
    assert result.mode == "text"
    assert result.hits[0].doc_id == top
    assert result.warnings == [warning]


async def test_an_embedder_failing_from_the_start_never_fails_search(tmp_path: Path) -> None:
    """With every embedding failing, upserts still index and search says no vectors exist."""
    embedder = FlakyEmbedder("m")
    embedder.failing = True
    r = await filled(tmp_path, embedder)
    await answered_by_bm25(r, "dead peer detection", "docs/vpn",
                           "no vectors indexed yet (the backfill embeds what is indexed): "
                           "results are BM25-only")
    await r.close()


async def test_a_failing_query_embedding_falls_back_to_bm25_and_says_so(tmp_path: Path) -> None:
    """A query the embedder cannot embed is answered by BM25, with the error's type named."""
    embedder = FlakyEmbedder("m")
    r = await filled(tmp_path, embedder)
    embedder.failing = True
    await answered_by_bm25(r, "nginx logs", "docs/disk",
                           "query embedding failed (ConnectionError): results are BM25-only")
    await r.close()


async def test_a_hanging_query_embedding_is_cut_at_its_deadline(tmp_path: Path) -> None:
    """A query embedding that never answers is abandoned after query_embed_timeout: its
    0.2 s, not the default 5 s (25 times more, room for a busy machine's late wake-up)."""
    embedder = FlakyEmbedder("m")
    r = await filled(tmp_path, embedder, RetrievalLimits(query_embed_timeout=0.2))
    embedder.hanging = True
    loop = asyncio.get_running_loop()
    began = loop.time()
    result = await asyncio.wait_for(r.search("nginx logs"), patience(5))
    assert 0.2 <= loop.time() - began < RetrievalLimits().query_embed_timeout
    assert result.mode == "text"
    assert result.hits[0].doc_id == "docs/disk"
    assert result.warnings == ["query embedding failed (TimeoutError): results are BM25-only"]
    embedder.hanging = False
    await r.close()


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1])
async def test_k_below_one_is_refused(hashed: Retriever, k: int) -> None:
    """A k below 1 is InvalidDocument."""
    with pytest.raises(InvalidDocument, match=rf"k must be at least 1, got {k}"):
        await hashed.search("disk", k=k)


async def test_k_above_the_maximum_is_clamped_with_a_warning(hashed: Retriever) -> None:
    """A k above max_k is served as max_k, and a warning names retrieval.max_k."""
    hashed.limits = RetrievalLimits(max_k=2)
    result = await hashed.search("check", k=50)
    assert len(result.hits) == 2
    assert "top_k 50 is above the maximum, retrieval.max_k = 2: 2 hits at most" \
        in result.warnings


async def test_a_query_over_the_limit_is_refused_naming_the_option(hashed: Retriever) -> None:
    """A query longer than max_query_chars is InvalidDocument naming the option."""
    with pytest.raises(InvalidDocument, match=r"2001 characters.*retrieval\.max_query_chars"):
        await hashed.search("x" * 2001)
    assert (await hashed.search("x" * 2000)).mode == "hybrid"  # the limit itself is allowed


async def test_new_limits_apply_to_the_calls_after(hashed: Retriever) -> None:
    """Limits assigned to a Retriever govern the searches and upserts that follow."""
    hashed.limits = dataclasses.replace(hashed.limits, max_k=2, max_document_chars=10)
    assert hashed.limits.max_k == 2
    clamped = await hashed.search("nginx replication vpn", k=3)
    assert len(clamped.hits) == 2
    assert any("retrieval.max_k = 2" in w for w in clamped.warnings)
    with pytest.raises(InvalidDocument, match=r"retrieval\.max_document_chars"):
        await hashed.upsert("docs", "t", "x" * 11, doc_id="docs/long")


async def test_an_empty_query_is_refused(hashed: Retriever) -> None:
    """A blank query is InvalidDocument, not an empty result."""
    with pytest.raises(InvalidDocument, match="query is empty"):
        await hashed.search(" \n\t")


@pytest.mark.parametrize(("fields", "reason"), [
    ({"text": ""}, "document text is empty"),
    ({"text": " \n "}, "document text is empty"),
    ({"text": "x" * 101}, r"101 characters.*retrieval\.max_document_chars"),
    ({"kind": "word"}, "kind must be one of markdown, text, html, pdf, config, yaml, json, "
                       "toml, shell, python, session, not 'word'"),
    ({"doc_id": "docs/../etc/passwd"}, r"'\.\.' segment"),
    ({"doc_id": "/abs"}, "starts with '/'"),
    ({"doc_id": "docs//x"}, "empty segment"),
    ({"doc_id": "docs/a\x00b"}, "control character"),
])
async def test_invalid_documents_are_refused_and_leave_nothing(
        tmp_path: Path, fields: dict[str, str], reason: str) -> None:
    """Bad text, kind or document id is InvalidDocument with the reason; nothing is stored."""
    r = Retriever(tmp_path, lambda: HashEmbedder("m"), RetrievalLimits(max_document_chars=100))
    await r.open()
    await r.add_source("docs")
    args = {"text": "some valid text", "kind": "text", "doc_id": "docs/ok"} | fields
    with pytest.raises(InvalidDocument, match=reason):
        await r.upsert("docs", "title", args["text"], doc_id=args["doc_id"], kind=args["kind"])
    assert await r.documents() == []
    assert (await r.status()).chunks == 0
    await r.close()


@pytest.mark.parametrize("source_id", ["", "Docs", "-docs", "do cs", "d" * 65, "docs/x"])
async def test_bad_source_ids_are_refused(tmp_path: Path, source_id: str) -> None:
    """A source id outside [a-z0-9][a-z0-9_-]{0,63} is InvalidDocument and is not added."""
    r = Retriever(tmp_path, lambda: None)
    await r.open()
    with pytest.raises(InvalidDocument, match=r"source id .* must be 1-64 characters"):
        await r.add_source(source_id)
    assert await r.sources() == []
    await r.close()


async def test_an_unknown_source_is_not_found(hashed: Retriever) -> None:
    """Upserting into, or removing, a source never added is NotFound."""
    with pytest.raises(NotFound, match="no source 'nope'; add it first"):
        await hashed.upsert("nope", "t", "text", doc_id="nope/x")
    with pytest.raises(NotFound, match="no source 'nope'"):
        await hashed.remove_source("nope")


async def test_a_closed_retriever_refuses_work(tmp_path: Path) -> None:
    """Calls before open (or after close) raise RetrievalError instead of touching files."""
    r = Retriever(tmp_path, lambda: None)
    with pytest.raises(RetrievalError, match="retrieval is not open"):
        await r.search("disk")
    await r.open()
    await r.close()
    with pytest.raises(RetrievalError, match="retrieval is not open"):
        await r.documents()


# -- delete --------------------------------------------------------------------------------


async def test_a_deleted_document_is_gone_from_every_index_and_listing(tmp_path: Path) -> None:
    """delete() removes the document from BM25, vectors, documents() and status, for good."""
    r = await filled(tmp_path, HashEmbedder("m"))
    before = await r.search("nginx logs disk full", k=3)
    assert "docs/disk" in {h.doc_id for h in before.hits if h.search_source == "hybrid"}
    assert await r.delete("docs/disk") is True
    after = await r.search("nginx logs disk full", k=3)
    assert after.mode == "hybrid"
    assert "docs/disk" not in doc_ids(after.hits)
    # Both remaining documents come back from the vector side: nothing else is left there.
    assert {h.doc_id for h in after.hits if h.vector_rank is not None} == {"docs/db", "docs/vpn"}
    assert await r.document("docs/disk") is None
    assert [d.id for d in await r.documents()] == ["docs/db", "docs/vpn"]
    status = await r.status()
    assert (status.chunks, status.vectors) == (2, 2)
    assert await r.delete("docs/disk") is False
    await r.close()
    again = Retriever(tmp_path, lambda: HashEmbedder("m"))
    await again.open()
    assert again.repaired == {}  # the delete reached every index before close
    assert "docs/disk" not in doc_ids((await again.search("nginx logs disk full")).hits)
    await again.close()


async def test_removing_a_source_removes_its_documents_only(tmp_path: Path) -> None:
    """remove_source() drops that source's documents from every index, others stay."""
    r = await filled(tmp_path, HashEmbedder("m"))
    await r.add_source("other")
    await r.upsert("other", "t", "nginx logs on the other side", doc_id="other/x")
    assert await r.remove_source("docs") == len(DOCS)
    result = await r.search("nginx logs")
    assert doc_ids(result.hits) == {"other/x"}
    assert [s.id for s in await r.sources()] == ["other"]
    status = await r.status()
    assert (status.chunks, status.vectors) == (1, 1)
    await r.close()


# -- catch-up after a failed write ---------------------------------------------------------


def fail_once(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, fail: object) -> list[int]:
    """Make ``cls.name`` call ``fail(self)`` instead, once; returns the failure count."""
    real = getattr(cls, name)
    failures: list[int] = []

    def wrapper(self: object, *args: object, **kwargs: object) -> object:
        if not failures:
            failures.append(1)
            return fail(self)  # type: ignore[operator]
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)
    return failures


def tantivy_commit_fails(index: TextIndex) -> None:
    # What TextIndex does when tantivy's commit fails: roll the writer back, then raise.
    index._fail(index._require_writer(), "commit", OSError(errno.EIO, "injected I/O error"))


def hnswlib_add_fails(index: VectorIndex) -> None:
    raise ValueError("injected hnswlib failure")


async def test_a_failed_text_commit_is_caught_up_by_the_next_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite took a write tantivy failed: the writer is told, and the next write indexes it."""
    r = await filled(tmp_path, HashEmbedder("m"))
    failures = fail_once(monkeypatch, TextIndex, "commit", tantivy_commit_fails)
    with pytest.raises(RetrievalError, match="injected I/O error"):
        await r.upsert("docs", "printer", "printer queue stuck", doc_id="docs/printer")
    assert failures == [1]
    failed = await r.document("docs/printer")
    assert failed is not None and failed.state == "failed"
    assert "injected I/O error" in failed.error
    assert "docs/printer" not in doc_ids((await r.search("printer queue")).hits)
    await r.upsert("docs", "badge", "badge reader offline in lobby", doc_id="docs/badge")
    # The write after the failure first brought tantivy in line with SQLite.
    hits = (await r.search("printer queue")).hits
    assert hits[0].doc_id == "docs/printer"
    assert hits[0].search_source == "hybrid"
    assert (await r.search("badge reader")).hits[0].doc_id == "docs/badge"
    assert r.repaired == {}  # status keeps the start-up's counts
    status = await r.status()
    assert (status.chunks, status.vectors) == (5, 5)
    # Re-sending the failed write acknowledges it.
    again = await r.upsert("docs", "printer", "printer queue stuck", doc_id="docs/printer")
    assert again.state == "indexed"
    await r.close()


async def test_a_failed_vector_write_is_caught_up_by_the_next_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite took a write hnswlib failed: the next write adds its cached vectors."""
    embedder = HashEmbedder("m")
    r = await filled(tmp_path, embedder)
    failures = fail_once(monkeypatch, VectorIndex, "add", hnswlib_add_fails)
    with pytest.raises(ValueError, match="injected hnswlib failure"):
        await r.upsert("docs", "printer", "printer queue stuck", doc_id="docs/printer")
    assert failures == [1]
    status = await r.status()
    assert (status.chunks, status.vectors) == (4, 3)
    calls = embedder.calls
    await r.upsert("docs", "badge", "badge reader offline in lobby", doc_id="docs/badge")
    status = await r.status()
    assert (status.chunks, status.vectors) == (5, 5)
    assert embedder.calls == calls + 1  # the caught-up vector came from SQLite's cache
    printer = next(h for h in (await r.search("printer queue stuck")).hits
                   if h.doc_id == "docs/printer")
    assert printer.vector_rank is not None
    await r.close()


async def test_a_failed_text_commit_is_repaired_by_the_next_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no later write, reopening reconciles tantivy from SQLite and reports the repair."""
    r = await filled(tmp_path, HashEmbedder("m"))
    fail_once(monkeypatch, TextIndex, "commit", tantivy_commit_fails)
    with pytest.raises(RetrievalError, match="injected I/O error"):
        await r.upsert("docs", "printer", "printer queue stuck", doc_id="docs/printer")
    await r.close()
    again = Retriever(tmp_path, lambda: HashEmbedder("m"))
    await again.open()
    # The failed batch reached neither derived index: both get it from SQLite.
    assert again.repaired == {"text_added": 1, "vectors_added": 1}
    assert (await again.status()).repaired == {"text_added": 1, "vectors_added": 1}
    assert (await again.search("printer queue")).hits[0].doc_id == "docs/printer"
    await again.close()


async def test_index_files_left_ahead_of_sqlite_are_trimmed_at_open(tmp_path: Path) -> None:
    """Chunks in tantivy and hnswlib that SQLite does not have are removed at open."""
    r = await filled(tmp_path, HashEmbedder("m"))
    await r.close()
    # A delete SQLite committed whose tantivy and hnswlib halves a crash lost.
    with sqlite3.connect(tmp_path / "meta.sqlite3") as db:
        db.execute("DELETE FROM chunks WHERE doc_id = 'docs/vpn'")
        db.execute("DELETE FROM documents WHERE id = 'docs/vpn'")
    db.close()
    again = Retriever(tmp_path, lambda: HashEmbedder("m"))
    await again.open()
    assert again.repaired == {"text_removed": 1, "vectors_removed": 1}
    assert "docs/vpn" not in doc_ids((await again.search("vpn tunnel flapping")).hits)
    status = await again.status()
    assert (status.chunks, status.vectors) == (2, 2)
    await again.close()


async def test_a_failed_new_version_leaves_the_old_one_searchable_marked_failed(
        tmp_path: Path) -> None:
    """A file whose new version fails extraction in a rescan: the scan reports it, the
    document shows failed with the reason, and the last indexed version is still what
    search finds; once the file is fixed, the next rescan indexes it again."""
    from retrieval import ExtractLimits, RetrievalLimits, scan_source

    root = tmp_path / "docs"
    root.mkdir()
    note = root / "note.txt"
    note.write_text("web01 disk full: rotate the nginx logs\n")
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                  RetrievalLimits(extract=ExtractLimits(max_bytes=1000)))
    await r.open()
    source = await r.add_source("docs", root=root)
    assert (await scan_source(r, source.id)).added == 1
    note.write_text("db02 replication lag " * 100)  # over max_bytes: extraction fails
    report = await scan_source(r, source.id)
    assert [name for name, _ in report.failed] == ["note.txt"]
    doc = await r.document("docs/note.txt")
    assert doc is not None
    assert doc.state == "failed"
    assert "over the 1000-byte limit (retrieval.max_file_mb)" in doc.error
    hits = (await r.search("nginx logs")).hits
    assert [h.doc_id for h in hits] == ["docs/note.txt"]
    note.write_text("db02 replication lag: check the replay timestamp\n")
    assert (await scan_source(r, source.id)).changed == 1
    doc = await r.document("docs/note.txt")
    assert doc is not None and doc.state == "indexed" and doc.error == ""
    assert (await r.search("replication lag")).hits[0].doc_id == "docs/note.txt"
    await r.close()
