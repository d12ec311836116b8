"""RetrievalService: the gRPC face of :mod:`retrieval` (its messages in
:mod:`daemon.grpcapi.retrieval_wire`, its links to the embedding role and its schedules in
:mod:`daemon.services.retrieval_bridge`). Search is an adapter over
:class:`daemon.services.search.SearchService` (refresh, audit, field-naming refusals)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import (
    Retriever,
    ScanReport,
    check_root,
    extract_bytes,
    scan_source,
    validate_document_id,
)

from ..errors import InvalidArgument
from ..services.retrieval_bridge import _no_roots
from ..services.search import SearchService
from ..telemetry.audit import AuditLog
from ..telemetry.metrics import Metrics
from . import rpc
from .retrieval_wire import (
    CONTENT_TYPES,
    MODES,
    _document,
    _progress,
    _source,
    document_date_from,
    filters_from,
    query_from,
    search_hit,
    states_from,
    vector_rebuild,
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
        if request.id:
            validate_document_id(request.id)  # before the work, not after
        date = document_date_from(request)  # the caller's wins over what is extracted
        title, text, kind, extracted_date = await self._document_text(request)
        wait = request.wait if request.HasField("wait") else True
        upsert = self._r.upsert if wait else self._r.upsert_later
        doc = await upsert(request.source_id, title, text, doc_id=request.id or None,
                           kind=kind, category=request.category, tags=tuple(request.tags),
                           review=request.review,
                           document_date=extracted_date if date is None else date)
        call.note(document=doc.id, state=doc.state)
        return rpb.UpsertDocumentResponse(document=_document(doc))

    async def _document_text(self, request: rpb.UpsertDocumentRequest
                             ) -> tuple[str, str, str, int | None]:
        """The title, text, kind and date found to index: pushed text as it is (NULs
        dropped, as from files; a Markdown text's front matter date is found by the
        ingest); HTML and a file's bytes extracted as such a file would be (with the date
        their metadata carries, if any)."""
        if request.content:
            if request.text:
                raise InvalidArgument("give text or content, not both")
            media = request.content_type.split(";")[0].strip().lower()
            if media and media not in CONTENT_TYPES:
                raise InvalidArgument(
                    f"content_type {request.content_type!r} is not one of "
                    f"{', '.join(sorted(CONTENT_TYPES))}")
            kind, data = CONTENT_TYPES[media] if media else (request.kind or "text"), \
                bytes(request.content)
        else:
            kind, data = request.kind or "text", b""
        # NULs go, as they do from files: no store, index or prompt should carry them.
        title, text = request.title.replace("\x00", ""), request.text.replace("\x00", "")
        date = None
        if request.content or kind == "html":
            # Pushed markup and files are extracted like files of their kind: HTML
            # without tags, scripts and styles, its nesting bounded; PDF by the worker.
            extracted = await asyncio.to_thread(
                extract_bytes, data or text.encode("utf-8"),
                request.id or title or "document", kind, self._r.limits.extract)
            title, text, kind = title or extracted.title, extracted.text, extracted.kind
            date = extracted.date
        return title, text, kind, date

    @rpc.unary("DeleteDocument")
    async def DeleteDocument(
        self, request: rpb.DeleteDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.DeleteDocumentResponse:
        validate_document_id(request.id)  # an id no document can have says why
        return rpb.DeleteDocumentResponse(deleted=await self._r.delete(request.id))

    @rpc.unary("GetDocument")
    async def GetDocument(
        self, request: rpb.GetDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Document:
        from retrieval import NotFound  # noqa: PLC0415

        validate_document_id(request.id)  # an id no document can have says why
        doc = await self._r.document(request.id)
        if doc is None:
            raise NotFound(f"no document {request.id!r}")
        return _document(doc)

    @rpc.unary("ListDocuments")
    async def ListDocuments(
        self, request: rpb.ListDocumentsRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.ListDocumentsResponse:
        docs = await self._r.documents(request.source_id or None,
                                       states_from(request.states))
        return rpb.ListDocumentsResponse(documents=[_document(d) for d in docs])

    @rpc.unary("ApproveDocument")
    async def ApproveDocument(
        self, request: rpb.ReviewDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Document:
        call.note(document=request.id)
        doc = await self._r.approve(request.id, request.note)
        call.note(state=doc.state)
        return _document(doc)

    @rpc.unary("RejectDocument")
    async def RejectDocument(
        self, request: rpb.ReviewDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Document:
        call.note(document=request.id)
        return _document(await self._r.reject(request.id, request.note))

    @rpc.unary("AddSource")
    async def AddSource(
        self, request: rpb.AddSourceRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> rpb.Source:
        root = None
        if request.history and request.path:
            raise InvalidArgument("a history source holds pushed records: give no path")
        if not request.history and (request.max_age_days or request.max_items):
            raise InvalidArgument("max_age_days and max_items apply to history sources "
                                  "only (set history)")
        if "\x00" in request.path:
            raise InvalidArgument("path contains a NUL character")
        if request.path:
            root = Path(request.path)
            if not root.is_absolute():
                raise InvalidArgument("path must be absolute")
            # Confinement first: a caller learns nothing about paths outside the roots.
            await asyncio.to_thread(check_root, root, self._allowed_roots())
            if not root.is_dir():
                raise InvalidArgument(f"{root} is not a directory")
        row = await self._r.add_source(request.id, root=root, category=request.category,
                                       tags=tuple(request.tags),
                                       review_required=request.review_required,
                                       history=request.history,
                                       max_age_days=request.max_age_days,
                                       max_items=request.max_items)
        call.note(source=row.id, kind=row.kind)
        return _source(row)

    @rpc.unary("RemoveSource")
    async def RemoveSource(
        self, request: rpb.RemoveSourceRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.RemoveSourceResponse:
        return rpb.RemoveSourceResponse(chunks_removed=await self._r.remove_source(request.id))

    @rpc.unary("SetSourceDisabled")
    async def SetSourceDisabled(
        self, request: rpb.SetSourceDisabledRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.Source:
        call.note(source=request.id, disabled=request.disabled)
        row = await self._r.set_source_disabled(request.id, request.disabled)
        documents = len(await self._r.documents(request.id))
        return _source(row, documents)

    @rpc.unary("ListSources")
    async def ListSources(
        self, request: rpb.ListSourcesRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.ListSourcesResponse:
        return rpb.ListSourcesResponse(sources=await self._sources())

    async def _sources(self) -> list[rpb.Source]:
        docs = await self._r.documents()
        counts: dict[str, int] = {}
        for d in docs:
            counts[d.source_id] = counts.get(d.source_id, 0) + 1
        return [_source(s, counts.get(s.id, 0)) for s in await self._r.sources()]

    @rpc.stream("Reindex")
    async def Reindex(
        self, request: rpb.ReindexRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> AsyncIterator[rpb.ReindexProgress]:
        sources = [s for s in await self._r.sources() if s.kind == "directory"]
        if request.source_id:
            sources = [s for s in sources if s.id == request.source_id]
            if not sources:
                raise InvalidArgument(f"no directory source {request.source_id!r}")
        else:  # all: the disabled ones are not rescanned (one named is refused, saying so)
            sources = [s for s in sources if not s.disabled]
        for source in sources:
            queue: asyncio.Queue[ScanReport] = asyncio.Queue()
            last = 0.0

            def progress(report: ScanReport, q: asyncio.Queue[ScanReport] = queue) -> None:
                nonlocal last
                now = time.monotonic()
                if now - last >= 0.5:  # at most two progress messages a second
                    last = now
                    q.put_nowait(report)

            since = request.since.ToNanoseconds() if request.HasField("since") else None
            task = asyncio.create_task(scan_source(self._r, source.id, progress,
                                                   allowed_roots=self._allowed_roots(),
                                                   since_ns=since))
            try:
                while not task.done():
                    getter = asyncio.ensure_future(queue.get())
                    try:
                        await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        getter.cancel()
                    if getter.done() and not getter.cancelled():
                        yield _progress(getter.result(), done=False)
            finally:
                if not task.done():
                    # The call ended first (its client cancelled, its deadline passed, or
                    # the shutdown drain cut it): the scan stops with it, rather than run
                    # on unobserved into an index the shutdown is closing.
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            report = task.result()
            call.note(source=source.id, added=report.added, changed=report.changed,
                      deleted=report.deleted, failed=report.failed_total,
                      limit_reached=bool(report.limit_reached))
            yield _progress(report, done=True)

    @rpc.unary("Search")
    async def Search(
        self, request: rpb.SearchRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> rpb.SearchResponse:
        result = await self.search_service.search(
            request.query, top_k=request.top_k, filters=filters_from(request.filters),
            options=query_from(request), note=call.note)
        return rpb.SearchResponse(hits=[search_hit(h) for h in result.hits],
                                  mode=MODES[result.mode], warnings=result.warnings,
                                  vector_model=result.vector_model)

    async def close(self) -> None:
        """Cancel the refreshes searches started (:meth:`SearchService.close`)."""
        await self.search_service.close()

    @rpc.unary("Status")
    async def Status(
        self, request: rpb.RetrievalStatusRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.RetrievalStatusResponse:
        s = await self._r.status()
        return rpb.RetrievalStatusResponse(
            sources=s.sources,
            chunks=s.chunks,
            documents_by_state=s.documents_by_state,
            embedded_chunks=s.embedded_chunks,
            vectors=s.vectors,
            embedding_model=s.embedding_model,
            disk_bytes=s.disk_bytes,
            repaired=s.repaired,
            source_list=await self._sources(),
            backfill=rpb.VectorBackfill(
                running=s.backfill.running, model=s.backfill.model,
                pending=s.backfill.pending, done=s.backfill.done,
                failed=s.backfill.failed, last_error=s.backfill.last_error),
            rebuild=vector_rebuild(s.rebuild),
            pruned=self._r.pruned,
            store=s.store,
            lexical_ranking=s.lexical_ranking,
            store_target=s.store_target,
        )

    @rpc.unary("Reprocess")
    async def Reprocess(
        self, request: rpb.ReprocessRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.ReprocessResponse:
        if request.document_id and request.source_id:
            raise InvalidArgument("give document_id or source_id, not both")
        chunks, reason = await self._r.reprocess(document_id=request.document_id,
                                                 source_id=request.source_id)
        call.note(document=request.document_id or None, source=request.source_id or None,
                  chunks=chunks)
        return rpb.ReprocessResponse(chunks=chunks, reason=reason)
