"""History sources and the document's own date through RetrievalService (issue 16), on a
real in-process gRPC server: AddSource history and its refusals, a record dated by the
caller or when received, the date on documents and hits, dated_since/until filters, and
retention's counts in ListSources and Status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from daemon.config import Limits
from daemon.grpcapi.answer import AnswerServicer
from daemon.grpcapi.retrieval import RetrievalServicer
from daemon.models.router import InferenceRouter
from daemon.services.ask import AnswerSettings, ResponseCache
from daemon.telemetry.audit import AuditLog
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import retrieval_pb2 as rpb
from retrieval import Retriever
from supervisor import ManualClock
from tests.support.backend import FakeBackend, FakeRole
from tests.support.embedder import HashEmbedder, history_retriever
from tests.support.inprocess import serving

DAY = 86_400
Stub = retrieval_pb2_grpc.RetrievalServiceStub


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Stub, Retriever, ManualClock]]:
    r, clock = await history_retriever(tmp_path)
    servicer = RetrievalServicer(r, allowed_roots=lambda: (str(tmp_path),))
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        yield retrieval_pb2_grpc.RetrievalServiceStub(channel), r, clock
    await r.close()


def at(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"path": "/tmp", "history": True}, "a history source holds pushed records"),
    ({"max_age_days": 7}, "max_age_days and max_items apply to history sources only"),
    ({"max_items": 10}, "max_age_days and max_items apply to history sources only"),
])
async def test_add_source_refuses_a_bad_history_source(
        served: tuple[Stub, Retriever, ManualClock], fields: dict[str, object],
        needle: str) -> None:
    """A path with history, or retention without it: INVALID_ARGUMENT, nothing added."""
    stub, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.AddSource(rpb.AddSourceRequest(id="shell", **fields))  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (info.value.details() or "")
    assert not (await stub.ListSources(rpb.ListSourcesRequest())).sources


async def test_records_are_dated_and_the_date_is_on_documents_and_hits(
        served: tuple[Stub, Retriever, ManualClock]) -> None:
    """A history source is kind history with its limits; a record without a date gets
    the time it was received, one with a date keeps it; documents and hits carry the
    dates; dated_since keeps the newer record only; an out-of-range date is refused."""
    stub, _, clock = served
    source = await stub.AddSource(rpb.AddSourceRequest(id="shell", history=True,
                                                       max_age_days=30, max_items=1000))
    assert (source.kind, source.max_age_days, source.max_items) == ("history", 30, 1000)
    now = int(clock.wall())
    received = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="shell", id="shell/1", kind="session",
        text="$ systemctl restart nginx\nJob for nginx.service failed"))
    assert received.document.document_date.seconds == now
    dated = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="shell", id="shell/0", kind="session", document_date=at(now - 3 * DAY),
        text="$ systemctl restart nginx\nnginx restarted"))
    assert dated.document.document_date.seconds == now - 3 * DAY
    got = await stub.GetDocument(rpb.GetDocumentRequest(id="shell/0"))
    assert got.document_date.seconds == now - 3 * DAY
    hits = (await stub.Search(rpb.SearchRequest(query="restart nginx", top_k=5))).hits
    assert {h.document_id: h.document_date.seconds for h in hits} == \
        {"shell/1": now, "shell/0": now - 3 * DAY}
    newer = await stub.Search(rpb.SearchRequest(query="restart nginx", filters=rpb.SearchFilters(
        dated_since=at(now - DAY))))
    assert [h.document_id for h in newer.hits] == ["shell/1"]
    older = await stub.Search(rpb.SearchRequest(query="restart nginx", filters=rpb.SearchFilters(
        dated_until=at(now - DAY))))
    assert [h.document_id for h in older.hits] == ["shell/0"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="shell", id="shell/2", text="$ ls", document_date=at(10**12)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "document_date is out of range" in (info.value.details() or "")


async def test_a_pushed_html_page_is_dated_by_its_meta_unless_the_caller_says(
        served: tuple[Stub, Retriever, ManualClock]) -> None:
    """Bytes of a page: its <meta> date; the same page with document_date: the caller's;
    a document without any date has no document_date on the wire."""
    stub, _, _ = served
    await stub.AddSource(rpb.AddSourceRequest(id="kb"))
    page = (b'<html><head><meta name="dcterms.date" content="2021-04-05T00:00:00Z">'
            b"</head><body><p>tunnel flapping on vpn01</p></body></html>")
    meta = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="kb", id="kb/page", content=page, content_type="text/html"))
    assert meta.document.document_date.seconds == 1_617_580_800
    caller = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="kb", id="kb/page2", content=page, content_type="text/html",
        document_date=at(1_700_000_000)))
    assert caller.document.document_date.seconds == 1_700_000_000
    plain = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="kb", id="kb/plain", text="tunnel flapping, undated"))
    assert not plain.document.HasField("document_date")


async def test_retention_counts_show_in_list_sources_and_status(
        served: tuple[Stub, Retriever, ManualClock]) -> None:
    """After a pass over a history source kept to two records: ListSources shows the
    source's pruned count, Status the count since start-up, and the pruned records are
    gone from ListDocuments and Search."""
    stub, r, clock = served
    await stub.AddSource(rpb.AddSourceRequest(id="shell", history=True, max_items=2))
    now = int(clock.wall())
    for i in range(5):
        await stub.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="shell", id=f"shell/{i}", kind="session",
            text=f"$ journalctl -u nginx\nrecord {i} nginx errors",
            document_date=at(now - (5 - i) * DAY)))
    assert (await stub.Status(rpb.RetrievalStatusRequest())).pruned == 0
    assert await r.prune() == 3
    sources = (await stub.ListSources(rpb.ListSourcesRequest())).sources
    assert [(s.id, s.pruned, s.documents) for s in sources] == [("shell", 3, 2)]
    status = await stub.Status(rpb.RetrievalStatusRequest())
    assert status.pruned == 3
    assert [s.pruned for s in status.source_list] == [3]
    listed = await stub.ListDocuments(rpb.ListDocumentsRequest(source_id="shell"))
    assert [d.id for d in listed.documents] == ["shell/3", "shell/4"]
    hits = (await stub.Search(rpb.SearchRequest(query="nginx errors", top_k=10))).hits
    assert {h.document_id for h in hits} == {"shell/3", "shell/4"}


async def test_ask_citations_carry_the_date_kind_and_source(tmp_path: Path) -> None:
    """Ask's citations name each source's document date (unset for an undated one), its
    kind and its source id, as the hits they come from."""
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"), clock=ManualClock())
    await r.open()
    await r.add_source("shell", history=True)
    await r.add_source("kb")
    await r.upsert("shell", "restart", "$ systemctl restart nginx\nnginx failed: port 80 "
                   "in use", doc_id="shell/1", kind="session", document_date=1_700_000_000)
    await r.upsert("kb", "runbook", "nginx failed because port 80 is in use: stop apache",
                   doc_id="kb/nginx")
    backend = FakeBackend(pieces=["Stop apache [S1]."], finish="stop")
    servicer = AnswerServicer(
        InferenceRouter({"generation": FakeRole(backend)}), r, Limits(),
        settings=AnswerSettings(), cache=ResponseCache(ttl=60, max_entries=8),
        audit=AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1))
    try:
        async with serving(lambda s: answer_pb2_grpc.add_AnswerServiceServicer_to_server(
                servicer, s)) as channel:
            stub = answer_pb2_grpc.AnswerServiceStub(channel)
            messages = [m async for m in stub.Ask(apb.AskRequest(
                question="nginx failed port 80 in use"))]
            dated = [m async for m in stub.Ask(apb.AskRequest(
                question="nginx failed port 80 in use", no_cache=True,
                filters=rpb.SearchFilters(dated_since=at(1_600_000_000))))]
    finally:
        await r.close()
    sources = next(m.sources for m in messages if m.HasField("sources"))
    cited = {c.document_id: (c.HasField("document_date") and c.document_date.seconds,
                             c.kind, c.source_id) for c in sources.citations}
    assert cited == {"shell/1": (1_700_000_000, "session", "shell"),
                     "kb/nginx": (False, "text", "kb")}
    only = next(m.sources for m in dated if m.HasField("sources"))
    assert [c.document_id for c in only.citations] == ["shell/1"]
