"""RetrievalService: the gRPC face of :mod:`retrieval`, and its link to the embedding child.

:class:`ChildEmbedder` adapts the embedding role — a supervised child or an external
endpoint — to the retriever's ``Embedder`` protocol. The retriever asks for it on every
use, so it follows the role: when the role is down, disabled, or its endpoint has no
embeddings API, the provider returns None and search is BM25-only, saying why. Vectors
are tagged with the embedding model's identity (file name and SHA-256 for a child, model
id and URL for an endpoint), so a swap or a switch never mixes vector spaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Final

import grpc
import structlog
from google.protobuf import timestamp_pb2

from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import (
    DocumentRow,
    ExtractLimits,
    Filters,
    Hit,
    InvalidDocument,
    Query,
    RetrievalLimits,
    Retriever,
    ScanReport,
    SearchResult,
    SourceRow,
    Vector,
    check_root,
    extract_bytes,
    scan_source,
    validate_document_id,
)
from supervisor import (
    ChildRequestError,
    State,
    SupervisorError,
    TokenizeUnavailableError,
)

from . import rpc
from .audit import AuditLog
from .backend import InferenceBackend
from .children import ManagedChild
from .config import Config
from .errors import InvalidArgument, RequestError
from .metrics import Metrics
from .router import InferenceRouter

_STATES = {
    "pending": rpb.DOCUMENT_STATE_PENDING,
    "processing": rpb.DOCUMENT_STATE_PROCESSING,
    "indexed": rpb.DOCUMENT_STATE_INDEXED,
    "failed": rpb.DOCUMENT_STATE_FAILED,
}
SOURCES = {"text": rpb.SEARCH_SOURCE_TEXT, "vector": rpb.SEARCH_SOURCE_VECTOR,
            "hybrid": rpb.SEARCH_SOURCE_HYBRID}


def limits_from(config: Config) -> RetrievalLimits:
    r = config.retrieval
    return RetrievalLimits(
        chunk_size=r.chunk_size, chunk_overlap=r.chunk_overlap,
        max_chunk_chars=r.max_chunk_chars, embed_batch=r.embed_batch,
        embed_concurrency=r.embed_concurrency, ingest_workers=r.ingest_workers,
        ingest_inflight_bytes=r.ingest_inflight_mb * 1024 * 1024,
        max_commit_batch=r.max_commit_batch, query_embed_timeout=r.query_embed_timeout,
        text_candidates=r.text_candidates, vector_candidates=r.vector_candidates,
        rrf_k=r.rrf_k, default_k=r.default_k, max_k=r.max_k,
        max_query_chars=r.max_query_chars, max_document_chars=r.max_document_chars,
        max_candidates=r.max_candidates, text_weight=r.text_weight,
        vector_weight=r.vector_weight,
        max_files_per_source=r.max_files_per_source,
        max_bytes_per_source=r.max_source_mb * 1024 * 1024,
        redact_hostnames=r.redact_hostnames, redact_ips=r.redact_ips,
        refuse_hard_links=r.refuse_hard_links,
        extract=ExtractLimits(max_bytes=r.max_file_mb * 1024 * 1024,
                              pdf_timeout=r.pdf_timeout,
                              pdf_max_pages=r.pdf_max_pages,
                              html_max_depth=r.html_max_depth,
                              pdf_max_memory=r.pdf_max_memory_mb * 1024 * 1024,
                              pdf_max_output=r.pdf_max_output_mb * 1024 * 1024),
    )


class ChildEmbedder:
    """The embedding role's current backend (a child or an endpoint) as a
    ``retrieval.Embedder``; made afresh by the provider for each use, so its identity and
    context are those of what serves the role at that moment."""

    def __init__(self, router: InferenceRouter, backend: InferenceBackend) -> None:
        self._router = router
        self._backend = backend
        self.model_id: Final = backend.identity
        self.context: Final = backend.context_tokens or 512

    async def embed(self, texts: Sequence[str]) -> Sequence[Vector]:
        # in_flight: an ingest or search already running when a shutdown begins is let
        # finish by the drain; refused embeddings would leave its documents without
        # vectors for good (nothing embeds them later), its search BM25-only.
        async with self._router.admit("embedding", None, in_flight=True) as backend:
            if backend.identity != self.model_id:
                # Swapped or switched since: these vectors would carry the wrong identity.
                raise ChildRequestError("the embedding model changed; retry")
            result = await backend.embed(list(texts))
        return list(result.matrix)  # float32 rows, as the index stores them

    async def count_tokens(self, text: str) -> int:
        try:
            return len(await self._backend.tokenize(text, add_special=True))
        except TokenizeUnavailableError:
            # Only an endpoint lacks a tokenizer: a conservative estimate (an English
            # BPE/WordPiece token averages about 4 characters) splits chunks a little
            # more often than needed, never less.
            return estimate_tokens(text)


def estimate_tokens(text: str) -> int:
    """A conservative token count for endpoints without a tokenizer (never for a child)."""
    return len(text) // 3 + 1


def make_provider(router: InferenceRouter, children: dict[str, ManagedChild]
                  ) -> Callable[[], ChildEmbedder | None]:
    """The embedder provider the retriever calls: None unless the embedding role is ready
    and what serves it has a known identity (a child's model SHA-256, an endpoint's model
    id and URL)."""
    child = children.get("embedding")

    def provider() -> ChildEmbedder | None:
        if child is None or child.supervisor.state is not State.RUNNING:
            return None
        try:
            backend = router.backend("embedding", in_flight=True)
        except (RequestError, SupervisorError):
            return None
        return ChildEmbedder(router, backend) if backend.identity else None

    return provider


def unavailable_reason(children: dict[str, ManagedChild]) -> Callable[[], str]:
    """Why the embedder provider has nothing (for search warnings)."""
    def reason() -> str:
        child = children.get("embedding")
        if child is None or child.mode.kind == "disabled":
            return "embedding is disabled"
        where = ("the embedding endpoint" if child.mode.kind == "endpoint"
                 else "the embedding child")
        error = child.last_error or (child.supervisor.last_exit.message
                                     if child.supervisor.last_exit else "")
        state = child.supervisor.state.value
        return f"{where} is unavailable ({state}{': ' + error[:200] if error else ''})"

    return reason


def _no_roots() -> tuple[str, ...]:
    return ()


async def rescan_loop(retriever: Retriever, interval: float,
                      allowed_roots: Callable[[], tuple[str, ...]] = _no_roots) -> None:
    """Rescan every directory source each ``interval`` seconds (a source scanned more
    recently, e.g. by an operator's Reindex, waits its turn). Runs until cancelled; a
    failing source (one outside ``allowed_roots()`` too) is logged and retried next
    round."""
    while True:
        await asyncio.sleep(min(interval, 60.0))
        now = time.time()
        for source in await retriever.sources():
            if source.kind != "directory" or source.disabled \
                    or now - (source.last_scan or 0) < interval:
                continue
            try:
                await scan_source(retriever, source.id, allowed_roots=allowed_roots())
            except Exception as exc:
                structlog.get_logger("llamad.retrieval").warning(
                    "scheduled rescan failed", source=source.id, error=str(exc)[:200])


async def backfill_loop(retriever: Retriever, interval: float) -> None:
    """Every ``interval`` seconds, start the background embedding of chunks without a
    vector of the current embedding model, if there are any and an embedder is available
    (:meth:`retrieval.Retriever.backfill`). Runs until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            retriever.backfill()
        except Exception as exc:
            structlog.get_logger("llamad.retrieval").warning(
                "backfill check failed", error=str(exc)[:200])


CONTENT_TYPES = {
    "application/pdf": "pdf", "text/html": "html", "application/xhtml+xml": "html",
    "text/markdown": "markdown", "text/plain": "text"}
"""The media types a pushed document's bytes may have, and the kind each is read as."""

MODES: dict[str, rpb.SearchMode.ValueType] = {
    "hybrid": rpb.SEARCH_MODE_HYBRID, "text": rpb.SEARCH_MODE_TEXT,
    "vector": rpb.SEARCH_MODE_VECTOR}
_MODE_NAMES = {v: k for k, v in MODES.items()}


def filters_from(f: rpb.SearchFilters) -> Filters:
    """A request's search filters."""
    return Filters(
        sources=tuple(f.sources), kinds=tuple(f.kinds), categories=tuple(f.categories),
        tags=tuple(f.tags),
        since=f.indexed_since.seconds if f.HasField("indexed_since") else None,
        until=f.indexed_until.seconds if f.HasField("indexed_until") else None,
    )


def query_from(request: rpb.SearchRequest) -> Query:
    """What a Search request chooses (unset: the configured defaults).

    Raises:
        InvalidArgument: an unknown mode.
    """
    mode = request.mode or rpb.SEARCH_MODE_HYBRID
    if mode not in _MODE_NAMES:
        raise InvalidArgument(f"unknown search mode {mode}")
    return Query(
        mode=_MODE_NAMES[mode],
        min_score=request.min_score if request.HasField("min_score") else None,
        candidates=request.candidates or None,
        text_weight=request.text_weight if request.HasField("text_weight") else None,
        vector_weight=request.vector_weight if request.HasField("vector_weight") else None,
        group_by_document=request.group_by_document)


def search_hit(h: Hit) -> rpb.SearchHit:
    hit = rpb.SearchHit(
        chunk_id=h.chunk_id, document_id=h.doc_id, title=h.title,
        source_id=h.source_id, path=h.path, heading=h.heading, text=h.text,
        snippet=h.snippet, search_source=SOURCES[h.search_source],
        fused_score=h.fused_score, score=h.score, kind=h.kind, category=h.category,
        tags=h.tags, ordinal=h.ordinal, other_chunk_ids=h.other_chunk_ids)
    if h.text_rank is not None:
        hit.text_rank = h.text_rank
    if h.text_score is not None:
        hit.text_score = h.text_score
    if h.vector_rank is not None:
        hit.vector_rank = h.vector_rank
    if h.vector_score is not None:
        hit.vector_score = h.vector_score
    if (ts := _ts(h.indexed_at)) is not None:
        hit.indexed_at.CopyFrom(ts)
    if h.mtime_ns:
        hit.modified_at.FromNanoseconds(h.mtime_ns)
    return hit


def _ts(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    if not seconds:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromSeconds(int(seconds))
    return ts


def _document(d: DocumentRow) -> rpb.Document:
    msg = rpb.Document(id=d.id, source_id=d.source_id, title=d.title, kind=d.kind,
                       category=d.category, tags=list(d.tags),
                       state=_STATES.get(d.state, rpb.DOCUMENT_STATE_UNSPECIFIED),
                       error=d.error, path=d.path, redactions=d.redactions)
    if (ts := _ts(d.indexed_at)) is not None:
        msg.indexed_at.CopyFrom(ts)
    return msg


def _source(s: SourceRow, documents: int = 0) -> rpb.Source:
    msg = rpb.Source(id=s.id, kind=s.kind, path=s.root, category=s.category, tags=list(s.tags),
                     last_error=s.last_error, documents=documents, disabled=s.disabled)
    if (ts := _ts(s.last_scan)) is not None:
        msg.last_scan.CopyFrom(ts)
    return msg


def _progress(r: ScanReport, done: bool) -> rpb.ReindexProgress:
    return rpb.ReindexProgress(
        source_id=r.source_id, seen=r.seen, added=r.added, changed=r.changed,
        unchanged=r.unchanged, deleted=r.deleted, done=done,
        failed=[rpb.FileIssue(path=p, reason=why) for p, why in r.failed],
        skipped=[rpb.FileIssue(path=p, reason=why) for p, why in r.skipped],
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
            audit: where Search calls are recorded (retrieval.search_audit_log), or None.
            refresh_interval: retrieval.refresh_min_interval (0: no refresh on search).
            wall: the clock last scans are compared with (injected in tests).
        """
        self._r = retriever
        self.metrics = metrics
        self._allowed_roots = allowed_roots
        self._audit = audit
        self._refresh_interval = refresh_interval
        self._wall = wall
        self._refreshes: dict[str, asyncio.Task[None]] = {}
        self._refreshed_at: dict[str, float] = {}

    @rpc.unary("UpsertDocument")
    async def UpsertDocument(
        self, request: rpb.UpsertDocumentRequest, context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> rpb.UpsertDocumentResponse:
        call.note(source=request.source_id, chars=len(request.text))
        if request.content:
            doc = await self._upsert_content(request)
            call.note(document=doc.id, content_bytes=len(request.content))
            return rpb.UpsertDocumentResponse(document=_document(doc))
        kind = request.kind or "text"
        # NULs go, as they do from files: no store, index or prompt should carry them.
        title, text = request.title.replace("\x00", ""), request.text.replace("\x00", "")
        if kind == "html":
            # Pushed markup is extracted like an .html file: its text, without tags,
            # scripts and styles, its nesting bounded (retrieval.html_max_depth).
            if request.id:
                validate_document_id(request.id)  # before the work, not after
            extracted = await asyncio.to_thread(
                extract_bytes, text.encode("utf-8"), request.id or "document", "html",
                self._r.limits.extract)
            title, text = title or extracted.title, extracted.text
        doc = await self._r.upsert(
            request.source_id, title, text, doc_id=request.id or None,
            kind=kind, category=request.category, tags=tuple(request.tags))
        call.note(document=doc.id)
        return rpb.UpsertDocumentResponse(document=_document(doc))

    async def _upsert_content(self, request: rpb.UpsertDocumentRequest) -> DocumentRow:
        """A document pushed as a file's bytes: extracted by its type, then upserted."""
        if request.text:
            raise InvalidArgument("give text or content, not both")
        media = request.content_type.split(";")[0].strip().lower()
        if media and media not in CONTENT_TYPES:
            raise InvalidArgument(
                f"content_type {request.content_type!r} is not one of "
                f"{', '.join(sorted(CONTENT_TYPES))}")
        kind = CONTENT_TYPES[media] if media else (request.kind or "text")
        if request.id:
            validate_document_id(request.id)  # before the work, not after
        return await self._r.ingest_bytes(
            request.source_id, request.id or request.title or "document",
            bytes(request.content), kind, title=request.title, doc_id=request.id or None,
            category=request.category, tags=tuple(request.tags))

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
        docs = await self._r.documents(request.source_id or None)
        return rpb.ListDocumentsResponse(documents=[_document(d) for d in docs])

    @rpc.unary("AddSource")
    async def AddSource(
        self, request: rpb.AddSourceRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> rpb.Source:
        root = None
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
                                       tags=tuple(request.tags))
        call.note(source=row.id)
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
                      deleted=report.deleted, failed=len(report.failed))
            yield _progress(report, done=True)

    @rpc.unary("Search")
    async def Search(
        self, request: rpb.SearchRequest, context: grpc.aio.ServicerContext, call: rpc.Call,
    ) -> rpb.SearchResponse:
        began = time.perf_counter()
        filters, options = filters_from(request.filters), query_from(request)
        await self._refresh(filters.sources)
        try:
            result = await self._r.search(request.query, k=request.top_k or None,
                                          filters=filters, options=options)
        except InvalidDocument as exc:
            raise InvalidArgument(str(exc)) from None
        call.note(query_chars=len(request.query), hits=len(result.hits), mode=result.mode)
        response = rpb.SearchResponse(hits=[search_hit(h) for h in result.hits],
                                      mode=MODES[result.mode], warnings=result.warnings)
        if self._audit is not None:
            await self._record(self._audit, request, result, filters=filters,
                               options=options, seconds=time.perf_counter() - began)
        return response

    async def _refresh(self, named: Sequence[str]) -> None:
        """Lazy refresh: rescan, in the background, each enabled directory source the
        search covers (those named, else all) whose last scan is older than
        retrieval.refresh_min_interval; at most once per interval per source, never two
        at once. The search itself does not wait: this one sees the index as it is. An
        incremental rescan costs a stat per unchanged file, so it is the change check."""
        interval = self._refresh_interval()
        if interval <= 0:
            return
        now = self._wall()
        for source in await self._r.sources():
            if source.kind != "directory" or source.disabled \
                    or (named and source.id not in named):
                continue
            last = max(source.last_scan or 0, self._refreshed_at.get(source.id, 0.0))
            running = self._refreshes.get(source.id)
            if now - last < interval or (running is not None and not running.done()):
                continue
            self._refreshed_at[source.id] = now
            self._refreshes[source.id] = asyncio.create_task(
                self._rescan(source.id), name=f"refresh-{source.id}")

    async def _rescan(self, source_id: str) -> None:
        try:
            await scan_source(self._r, source_id, allowed_roots=self._allowed_roots())
        except Exception as exc:  # recorded on the source by the scan; logged here
            structlog.get_logger("llamad.retrieval").warning(
                "refresh on search failed", source=source_id, error=str(exc)[:200])

    async def close(self) -> None:
        """Cancel the refreshes under way (a rescan cut short resumes at the next one)."""
        tasks = [t for t in self._refreshes.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _record(self, audit: AuditLog, request: rpb.SearchRequest, result: SearchResult,
                      *, filters: Filters, options: Query, seconds: float) -> None:
        """One audit record: the query (redacted by the log), filters, options, mode, the
        whole fused list with both ranks, what was returned, and the latency."""
        ids = await self._r.chunk_ids([key for key, *_ in result.fused])
        audit.record(
            call="Search", query=request.query, top_k=request.top_k,
            filters=dataclasses.asdict(filters), options=dataclasses.asdict(options),
            mode=result.mode, warnings=result.warnings,
            fused=[{"chunk_id": ids.get(key, f"#{key}"), "text_rank": tr,
                    "vector_rank": vr, "score": round(score, 6)}
                   for key, tr, vr, score in result.fused],
            returned=[h.chunk_id for h in result.hits],
            latency_ms=round(seconds * 1000, 2))

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
