"""RetrievalService: the gRPC face of :mod:`retrieval` (its messages in
:mod:`daemon.grpcapi.retrieval_wire`, its links to the embedding role and its schedules in
:mod:`daemon.services.retrieval_bridge`). An adapter over the wire-free services the HTTP
API adapts too: :class:`daemon.services.search.SearchService` (refresh, audit,
field-naming refusals), :mod:`daemon.services.documents` (push, get, delete, review,
reprocess) and :mod:`daemon.services.sources` (add, disable, remove, reindex)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import grpc

from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import Retriever

from ..services import documents, sources
from ..services.retrieval_bridge import _no_roots
from ..services.search import SearchService
from ..telemetry.audit import AuditLog
from ..telemetry.metrics import Metrics
from . import rpc
from .retrieval_wire import (
    _document,
    _progress,
    _source,
    document_date_from,
    filters_from,
    query_from,
    retrieval_status,
    search_response,
    states_from,
)


class RetrievalServicer(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Documents, sources, reindex, search, status."""

    def __init__(self, retriever: Retriever, metrics: Metrics | None = None,
                 allowed_roots: Callable[[], tuple[str, ...]] = _no_roots, *,
                 audit: AuditLog | None = None,
                 refresh_interval: Callable[[], float] = lambda: 0.0,
                 wall: Callable[[], float] = time.time) -> None:
        """Args:
            allowed_roots: where directory sources may live (retrieval.allowed_roots; read
                at every AddSource and scan, so a reload applies at once).
            audit: where Search calls are recorded (retrieval.search_audit_log), or None
                (these three and ``wall`` are the :class:`SearchService`'s).
            refresh_interval: retrieval.refresh_min_interval (0: no refresh on search).
            wall: the clock last scans are compared with (injected in tests).
        """
        self._r = retriever
        self.metrics = metrics
        self._allowed_roots = allowed_roots
        self.search_service = SearchService(retriever, allowed_roots, audit=audit,
                                            refresh_interval=refresh_interval, wall=wall)

    @rpc.unary("UpsertDocument")
    async def UpsertDocument(
        self, request: rpb.UpsertDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.UpsertDocumentResponse:
        call.note(source=request.source_id, chars=len(request.text),
                  content_bytes=len(request.content) or None)
        doc = await documents.push(self._r, documents.Push(
            source_id=request.source_id, id=request.id, title=request.title,
            text=request.text, content=bytes(request.content),
            content_type=request.content_type, kind=request.kind,
            category=request.category, tags=tuple(request.tags), review=request.review,
            document_date=document_date_from(request),
            wait=request.wait if request.HasField("wait") else True))
        call.note(document=doc.id, state=doc.state)
        return rpb.UpsertDocumentResponse(document=_document(doc))

    @rpc.unary("DeleteDocument")
    async def DeleteDocument(
        self, request: rpb.DeleteDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.DeleteDocumentResponse:
        return rpb.DeleteDocumentResponse(deleted=await documents.delete(self._r, request.id))

    @rpc.unary("GetDocument")
    async def GetDocument(
        self, request: rpb.GetDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Document:
        return _document(await documents.get(self._r, request.id))

    @rpc.unary("ListDocuments")
    async def ListDocuments(
        self, request: rpb.ListDocumentsRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.ListDocumentsResponse:
        docs = await documents.listed(self._r, request.source_id,
                                      states_from(request.states))
        return rpb.ListDocumentsResponse(documents=[_document(d) for d in docs])

    @rpc.unary("ApproveDocument")
    async def ApproveDocument(
        self, request: rpb.ReviewDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Document:
        call.note(document=request.id)
        doc = await documents.review(self._r, request.id, request.note, approve=True)
        call.note(state=doc.state)
        return _document(doc)

    @rpc.unary("RejectDocument")
    async def RejectDocument(
        self, request: rpb.ReviewDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Document:
        call.note(document=request.id)
        return _document(await documents.review(self._r, request.id, request.note,
                                                approve=False))

    @rpc.unary("AddSource")
    async def AddSource(
        self, request: rpb.AddSourceRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> rpb.Source:
        row = await sources.add(self._r, sources.NewSource(
            id=request.id, path=request.path, category=request.category,
            tags=tuple(request.tags), review_required=request.review_required,
            history=request.history, max_age_days=request.max_age_days,
            max_items=request.max_items, exclude=tuple(request.exclude)),
            self._allowed_roots())
        call.note(source=row.id, kind=row.kind)
        return _source(row)

    @rpc.unary("RemoveSource")
    async def RemoveSource(
        self, request: rpb.RemoveSourceRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.RemoveSourceResponse:
        return rpb.RemoveSourceResponse(chunks_removed=await sources.remove(self._r,
                                                                           request.id))

    @rpc.unary("SetSourceDisabled")
    async def SetSourceDisabled(
        self, request: rpb.SetSourceDisabledRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Source:
        call.note(source=request.id, disabled=request.disabled)
        row, count = await sources.set_disabled(self._r, request.id, request.disabled)
        return _source(row, count)

    @rpc.unary("ListSources")
    async def ListSources(
        self, request: rpb.ListSourcesRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.ListSourcesResponse:
        return rpb.ListSourcesResponse(sources=await self._sources())

    async def _sources(self) -> list[rpb.Source]:
        return [_source(s, n) for s, n in await sources.listed(self._r)]

    @rpc.stream("Reindex")
    async def Reindex(
        self, request: rpb.ReindexRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> AsyncIterator[rpb.ReindexProgress]:
        since = request.since.ToNanoseconds() if request.HasField("since") else None
        reports = sources.reindex(self._r, self._allowed_roots, source_id=request.source_id,
                                  since_ns=since)
        try:
            async for report, done in reports:
                if done:
                    call.note(source=report.source_id, added=report.added,
                              changed=report.changed, deleted=report.deleted,
                              failed=report.failed_total,
                              limit_reached=bool(report.limit_reached))
                yield _progress(report, done=done)
        finally:
            # The call ended first (its client cancelled, its deadline passed, or the
            # shutdown drain cut it): the scan stops with it (sources.reindex).
            await reports.aclose()  # type: ignore[attr-defined]

    @rpc.unary("Search")
    async def Search(
        self, request: rpb.SearchRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> rpb.SearchResponse:
        result = await self.search_service.search(
            request.query, top_k=request.top_k, filters=filters_from(request.filters),
            options=query_from(request), note=call.note)
        return search_response(result)

    async def close(self) -> None:
        """Cancel the refreshes searches started (:meth:`SearchService.close`)."""
        await self.search_service.close()

    @rpc.unary("Status")
    async def Status(
        self, request: rpb.RetrievalStatusRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.RetrievalStatusResponse:
        return retrieval_status(await self._r.status(), await self._sources(),
                                self._r.pruned)

    @rpc.unary("Reprocess")
    async def Reprocess(
        self, request: rpb.ReprocessRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.ReprocessResponse:
        chunks, reason = await documents.reprocess(self._r, document_id=request.document_id,
                                                   source_id=request.source_id)
        call.note(document=request.document_id or None, source=request.source_id or None,
                  chunks=chunks)
        return rpb.ReprocessResponse(chunks=chunks, reason=reason)
