"""Two retrievers (two nodes) on one PostgreSQL store (``retrieval.store = postgres``,
issue 17), against a real PostgreSQL 18 + pgvector (tests/support/postgres.py): a document
ingested through one is found by the other's search at once, a delete through one is gone
for the other, two nodes scanning one directory source index each file once, and a node
embedding with another model than the corpus's says so instead of mixing vectors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog.testing

from clients._convert import retrieval_status
from clients.cli._verbs import _retrieval_line
from daemon.grpcapi.retrieval import RetrievalServicer
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import (
    Embedder,
    Query,
    Retriever,
    VectorUnavailable,
    scan_source,
)
from retrieval.errors import EmbeddingModelMismatch, NotSupported
from retrieval.postgres._connect import PgOptions
from retrieval.store._metadata import DocumentRow
from retrieval.store._rows import PendingWrite
from tests.support.embedder import HashEmbedder
from tests.support.inprocess import serving
from tests.support.postgres import two_nodes

Nodes = tuple[Retriever, Retriever]


def node(tmp_path: Path, name: str, dsn: str, embedder: Embedder | None = None
         ) -> Retriever:
    return Retriever(tmp_path / name, lambda: embedder, postgres=PgOptions(dsn))


@pytest.fixture
async def nodes(tmp_path: Path, pg_dsn: str) -> AsyncIterator[Nodes]:
    async with two_nodes(tmp_path, pg_dsn, provider=lambda: None) as pair:  # BM25 only
        yield pair


def ids(result: object) -> set[str]:
    return {h.doc_id for h in getattr(result, "hits", [])}


async def test_a_document_upserted_on_one_node_is_found_by_the_other_at_once(
        nodes: Nodes) -> None:
    a, b = nodes
    await a.add_source("docs")
    await a.upsert("docs", "disk", "web01 disk full: rotate nginx logs", doc_id="docs/disk")
    found = await b.search("nginx logs")
    assert ids(found) == {"docs/disk"}
    assert found.mode == "text"           # no embedder: BM25-only, and it says so
    assert found.warnings
    assert (await b.document("docs/disk")) is not None
    assert [s.id for s in await b.sources()] == ["docs"]


async def test_a_delete_on_one_node_is_gone_on_the_other(nodes: Nodes) -> None:
    a, b = nodes
    await a.add_source("docs")
    await a.upsert("docs", "disk", "web01 disk full: rotate nginx logs", doc_id="docs/disk")
    await a.upsert("docs", "vpn", "vpn tunnel flapping: dead peer detection",
                   doc_id="docs/vpn")
    assert await b.delete("docs/disk")
    assert ids(await a.search("nginx logs")) == set()
    assert (await a.document("docs/disk")) is None
    assert ids(await a.search("vpn tunnel")) == {"docs/vpn"}
    status = await a.status()
    assert (status.store, status.lexical_ranking) == ("postgres", "bm25-sql")
    assert status.documents_by_state == {"indexed": 1}


async def test_two_nodes_scanning_one_source_index_each_file_once(
        nodes: Nodes, tmp_path: Path) -> None:
    a, b = nodes
    folder = tmp_path / "share"
    folder.mkdir()
    for name, text in (("disk.md", "# Disk\nweb01 disk full"),
                       ("db.md", "# DB\ndb02 replication lag"),
                       ("vpn.txt", "vpn tunnel flapping")):
        (folder / name).write_text(text)
    await a.add_source("share", root=folder)
    # While A holds the source's scan lock, B skips the source this round.
    async with a.scan_turn("share") as mine:
        assert mine
        skipped = await scan_source(b, "share")
    assert skipped.elsewhere and (skipped.seen, skipped.added) == (0, 0)
    assert "another node" in skipped.skipped[0][1]
    assert await b.documents("share") == []
    # Both scan at once: each file is indexed once, by whichever node had the turn.
    reports = await asyncio.gather(scan_source(a, "share"), scan_source(b, "share"))
    assert sum(r.added for r in reports) == 3
    assert sum(r.changed for r in reports) == 0
    docs = await a.documents("share")
    assert sorted(d.id for d in docs) == ["share/db.md", "share/disk.md", "share/vpn.txt"]
    assert all(d.state == "indexed" for d in docs)
    assert (await a.status()).chunks == 3
    # And afterwards the other node finds them unchanged.
    again = await scan_source(b, "share")
    assert (again.elsewhere, again.added, again.unchanged) == (False, 0, 3)


async def test_a_node_with_another_embedding_model_says_so(
        tmp_path: Path, pg_dsn: str) -> None:
    a = node(tmp_path, "a", pg_dsn, HashEmbedder("model-a"))
    b = node(tmp_path, "b", pg_dsn, HashEmbedder("model-b"))
    await a.open()
    await b.open()
    try:
        await a.add_source("docs")
        await a.upsert("docs", "disk", "web01 disk full: rotate nginx logs",
                       doc_id="docs/disk")
        hybrid = await a.search("nginx logs")
        assert hybrid.mode == "hybrid" and hybrid.vector_model == "model-a"
        with structlog.testing.capture_logs() as logs, \
                pytest.raises(EmbeddingModelMismatch, match=r"model-a.*model-b|model-b.*model-a"):
            await b.upsert("docs", "db", "db02 replication lag", doc_id="docs/db")
        said = [e for e in logs if e.get("node_model") == "model-b"]
        assert len(said) == 1 and said[0]["corpus_model"] == "model-a"
        assert said[0]["log_level"] == "warning"
        failed = await a.document("docs/db")  # no chunk or vector written; says why
        assert failed is not None and failed.state == "failed" and "model-b" in failed.error
        assert ids(await a.search("replication lag", options=Query(mode="text"))) == set()
        with structlog.testing.capture_logs() as logs:
            degraded = await b.search("nginx logs")
        assert not [e for e in logs if "node_model" in e]  # said once, not per search
        assert degraded.mode == "text" and ids(degraded) == {"docs/disk"}
        assert any("model-a" in w and "model-b" in w for w in degraded.warnings)
        with pytest.raises(VectorUnavailable, match="model-a"):
            await b.search("nginx logs", options=Query(mode="vector"))
        assert (await b.status()).embedding_model == "model-a"
    finally:
        await a.close()
        await b.close()


async def test_looking_inside_the_embedded_indexes_is_refused(nodes: Nodes) -> None:
    """What remains the embedded store's own (its tantivy and hnswlib, for tests and
    benches) is refused on Postgres, naming the backend."""
    a, _ = nodes
    with pytest.raises(NotSupported, match=r"embedded indexes.*postgres"):
        a._indexes  # noqa: B018 - the property raises


async def test_two_daemons_services_share_the_store_over_grpc(nodes: Nodes) -> None:
    """Each node's RetrievalService over real gRPC: a push through A is found by B's
    Search, Status says postgres and bm25-sql, a history source added through B is
    A's too."""
    a, b = nodes
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            RetrievalServicer(a), s)) as on_a, serving(
            lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
                RetrievalServicer(b), s)) as on_b:
        stub_a = retrieval_pb2_grpc.RetrievalServiceStub(on_a)
        stub_b = retrieval_pb2_grpc.RetrievalServiceStub(on_b)
        await stub_a.AddSource(rpb.AddSourceRequest(id="docs"))
        await stub_a.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="docs", id="docs/vpn", title="vpn",
            text="vpn tunnel flapping: tune dead peer detection"))
        found = await stub_b.Search(rpb.SearchRequest(query="dead peer detection"))
        assert [h.document_id for h in found.hits] == ["docs/vpn"]
        status = await stub_b.Status(rpb.RetrievalStatusRequest())
        assert (status.store, status.lexical_ranking) == ("postgres", "bm25-sql")
        assert status.store_target.startswith("postgres@") and "password" not in str(status)
        assert status.chunks == 1
        line = _retrieval_line(retrieval_status(status))
        assert f"postgres store {status.store_target} (lexical ranking bm25-sql)" in line
        await stub_b.AddSource(rpb.AddSourceRequest(id="notes", history=True, max_items=5))
        assert [(x.id, x.kind) for x in await a.sources()] == [("docs", "push"),
                                                              ("notes", "history")]
        assert (await stub_b.DeleteDocument(rpb.DeleteDocumentRequest(id="docs/vpn"))).deleted
        gone = await stub_a.Search(rpb.SearchRequest(query="dead peer detection"))
        assert list(gone.hits) == []


async def test_one_node_writes_two_batches_at_once_and_keeps_a_documents_versions_in_order(
        tmp_path: Path, pg_dsn: str) -> None:
    """retrieval.postgres_commits_in_flight (2): while one group commit waits on the
    server, the next is written on another connection; a document's newer version waits
    for the batch holding its older one, so the newer is what stays."""
    r = Retriever(tmp_path / "n", lambda: HashEmbedder("m"), postgres=PgOptions(pg_dsn))
    await r.open()
    await r.add_source("docs")
    backend = r._backend
    real = backend.commit
    active, most = 0, 0
    first_in, release_first = asyncio.Event(), asyncio.Event()

    async def commit(batch: list[PendingWrite]) -> list[DocumentRow]:
        nonlocal active, most
        active += 1
        most = max(most, active)
        try:
            if any(p.doc.id == "docs/ver" and "first" in p.rows[0].text for p in batch):
                first_in.set()
                await release_first.wait()  # the server is slow on this batch
            return await real(batch)
        finally:
            active -= 1

    backend.commit = commit  # type: ignore[method-assign]
    try:
        first = asyncio.create_task(
            r.upsert("docs", "v", "first version of the page " * 10, doc_id="docs/ver"))
        await first_in.wait()
        second = asyncio.create_task(
            r.upsert("docs", "v", "second version of the page " * 10, doc_id="docs/ver"))
        # Within a minute, or the others waited for the held batch (one at a time).
        await asyncio.wait_for(asyncio.gather(*(
            r.upsert("docs", f"d{i}", f"token{i} runbook for service {i}", doc_id=f"docs/d{i}")
            for i in range(20))), 60)
        assert most == 2  # the others were written beside the held batch
        assert not second.done()  # its document is in the held batch
        release_first.set()
        await first
        await second
        hits = (await r.search("second version", k=5)).hits
        assert "docs/ver" in {h.doc_id for h in hits}
        stale = [h for h in (await r.search("first", k=20)).hits if h.doc_id == "docs/ver"]
        assert stale == []
        assert (await r.status()).documents_by_state["indexed"] == 21
    finally:
        release_first.set()
        await r.close()
