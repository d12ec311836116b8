"""The fake RetrievalService of :class:`clients.testing.FakeLlamad`: documents pushed or
read from directory sources, kept whole (one chunk each), found by shared words. Review
works as the daemon's: a document pushed with review, or of a source requiring it, waits
in review_required (not found) until ApproveDocument or RejectDocument. Documents keep the
caller's document_date (a history source's records: else when received), searches filter
on it, and a history source is pruned to its max_items and max_age_days at each push (the
daemon prunes in the background)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from llamad_protocol.v1 import retrieval_pb2, retrieval_pb2_grpc

if TYPE_CHECKING:
    from ..testing import FakeLlamad


_SOURCE_FIELDS = tuple(
    f.name for f in retrieval_pb2.AddSourceRequest.DESCRIPTOR.fields
    if f.name in retrieval_pb2.Source.DESCRIPTOR.fields_by_name)
"""What AddSource sets of a Source: the fields both messages have (id, path, category,
tags, review_required, retention, exclude, ...)."""


@dataclass
class Doc:
    """A document the fake holds (its whole text is its one chunk)."""

    id: str
    source_id: str
    title: str
    text: str
    path: str = ""
    kind: str = "text"
    state: str = "indexed"          # indexed | review_required | rejected
    note: str = ""
    date: int | None = None         # its own date, unix seconds


_STATE = {"indexed": retrieval_pb2.DOCUMENT_STATE_INDEXED,
          "review_required": retrieval_pb2.DOCUMENT_STATE_REVIEW_REQUIRED,
          "rejected": retrieval_pb2.DOCUMENT_STATE_REJECTED}


class FakeRetrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    def __init__(self, fake: FakeLlamad) -> None:
        self.fake = fake

    def _doc(self, d: Doc) -> retrieval_pb2.Document:
        doc = retrieval_pb2.Document(id=d.id, source_id=d.source_id, title=d.title,
                                     kind=d.kind, path=d.path, state=_STATE[d.state],
                                     review_note=d.note)
        if d.date is not None:
            doc.document_date.FromSeconds(d.date)
        return doc

    def _held(self, source_id: str, review: bool = False) -> str:
        source = self.fake.sources.get(source_id)
        held = review or (source is not None and source.review_required)
        return "review_required" if held else "indexed"

    def UpsertDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/UpsertDocument", context)
        if request.text and request.content:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give text or content, not both")
        # Pushed bytes: the fake reads them as UTF-8 text (the daemon extracts them).
        text = request.text or bytes(request.content).decode("utf-8", "replace")
        if not text.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text is empty")
        doc_id = request.id or hashlib.sha256(text.encode()).hexdigest()[:16]
        source = self.fake.sources.get(request.source_id)
        history = source is not None and source.kind == "history"
        date = request.document_date.seconds if request.HasField("document_date") else \
            int(time.time()) if history else None
        doc = Doc(doc_id, request.source_id, request.title or doc_id, text,
                  kind=request.kind or "text",
                  state=self._held(request.source_id, request.review), date=date)
        self.fake.docs[doc_id] = doc
        if history and source is not None:
            self._prune(source)
        return retrieval_pb2.UpsertDocumentResponse(document=self._doc(doc))

    def _prune(self, source: retrieval_pb2.Source) -> None:
        """A history source's retention: the records past max_age_days, then the oldest
        beyond max_items, go (counted in its pruned)."""
        records = sorted((d for d in self.fake.docs.values() if d.source_id == source.id),
                         key=lambda d: (d.date or 0, d.id))
        cutoff = time.time() - source.max_age_days * 86_400
        old = [d for d in records if source.max_age_days and (d.date or 0) < cutoff]
        extra = len(records) - source.max_items if source.max_items else 0
        gone = records[:max(len(old), extra)]
        for d in gone:
            del self.fake.docs[d.id]
        source.pruned += len(gone)
        self.fake.pruned += len(gone)

    def DeleteDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/DeleteDocument", context)
        return retrieval_pb2.DeleteDocumentResponse(
            deleted=self.fake.docs.pop(request.id, None) is not None)

    def GetDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/GetDocument", context)
        doc = self.fake.docs.get(request.id)
        if doc is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no document {request.id!r}")
        return self._doc(doc)  # type: ignore[arg-type]

    def ListDocuments(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/ListDocuments", context)
        docs = [self._doc(d) for d in self.fake.docs.values()
                if (not request.source_id or d.source_id == request.source_id)
                and (not request.states or _STATE[d.state] in request.states)]
        return retrieval_pb2.ListDocumentsResponse(documents=docs)

    def ApproveDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/ApproveDocument", context)
        return self._decide(request, context, "indexed")

    def RejectDocument(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/RejectDocument", context)
        return self._decide(request, context, "rejected")

    def _decide(self, request: Any, context: grpc.ServicerContext, state: str) -> Any:
        doc = self.fake.docs.get(request.id)
        if doc is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no document {request.id!r}")
            raise AssertionError("unreachable: abort raises")
        if doc.state != "review_required":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"document {request.id!r} is {doc.state}, not review_required: "
                          "only a document awaiting review can be approved or rejected")
        doc.state, doc.note = state, request.note
        return self._doc(doc)

    def AddSource(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/AddSource", context)
        if request.history and request.path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "a history source holds pushed records: give no path")
        if not request.history and (request.max_age_days or request.max_items):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_age_days and max_items "
                          "apply to history sources only (set history)")
        if request.path and not Path(request.path).is_dir():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.path} is not a directory")
        if request.exclude and not request.path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "exclude patterns apply to "
                          "directory sources only (give a path)")
        kind = "history" if request.history else "directory" if request.path else "push"
        source = retrieval_pb2.Source(kind=kind)
        for name in _SOURCE_FIELDS:  # every setting the request and the Source share
            value = getattr(request, name)
            if isinstance(value, str | int | bool):
                setattr(source, name, value)
            else:  # a repeated field
                getattr(source, name).extend(value)
        self.fake.sources[request.id] = source
        return source

    def RemoveSource(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/RemoveSource", context)
        self.fake.sources.pop(request.id, None)
        gone = [k for k, d in self.fake.docs.items() if d.source_id == request.id]
        for key in gone:
            del self.fake.docs[key]
        return retrieval_pb2.RemoveSourceResponse(chunks_removed=len(gone))

    def ListSources(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/ListSources", context)
        return retrieval_pb2.ListSourcesResponse(sources=self._sources())

    def SetSourceDisabled(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/SetSourceDisabled", context)
        source = self.fake.sources.get(request.id)
        if source is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no source {request.id!r}")
            raise AssertionError("unreachable: abort raises")
        source.disabled = request.disabled
        return next(s for s in self._sources() if s.id == request.id)

    def _sources(self) -> list[retrieval_pb2.Source]:
        out = []
        for s in self.fake.sources.values():
            copy = retrieval_pb2.Source()
            copy.CopyFrom(s)
            copy.documents = sum(d.source_id == s.id for d in self.fake.docs.values())
            out.append(copy)
        return out

    def Reindex(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        sources = [s for s in self.fake.sources.values() if s.kind == "directory"
                   and (not request.source_id or s.id == request.source_id)]
        if request.source_id and not sources:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"no directory source {request.source_id!r}")

        def items() -> Iterator[Any]:
            for source in sources:
                files = sorted(p for p in Path(source.path).rglob("*") if p.is_file())
                added = 0
                for n, path in enumerate(files, 1):
                    rel = str(path.relative_to(source.path))
                    doc_id = f"{source.id}:{rel}"
                    added += doc_id not in self.fake.docs
                    self.fake.docs[doc_id] = Doc(doc_id, source.id, path.stem,
                                                 path.read_text(errors="replace"), rel,
                                                 state=self._held(source.id))
                    yield retrieval_pb2.ReindexProgress(source_id=source.id, seen=n,
                                                        added=added)
                yield retrieval_pb2.ReindexProgress(
                    source_id=source.id, seen=len(files), added=added,
                    unchanged=len(files) - added, done=True)

        return self.fake.stream("RetrievalService/Reindex", context, items())

    def hits(self, query: str, top_k: int,
             filters: retrieval_pb2.SearchFilters | None = None
             ) -> list[retrieval_pb2.SearchHit]:
        words = {w.lower() for w in query.split()}
        scored = sorted(((sum(w in d.text.lower() for w in words), d)
                         for d in self.fake.docs.values()
                         if d.state == "indexed" and _dated(d, filters)),
                        key=lambda x: -x[0])
        hits = []
        for rank, (score, d) in enumerate([s for s in scored if s[0]][: top_k or 5], 1):
            hits.append(retrieval_pb2.SearchHit(
                chunk_id=f"{d.id}#0", document_id=d.id, title=d.title, source_id=d.source_id,
                path=d.path, text=d.text, snippet=d.text[:80],
                search_source=retrieval_pb2.SEARCH_SOURCE_HYBRID, fused_score=1 / (60 + rank),
                text_rank=rank, text_score=float(score), vector_rank=rank,
                vector_score=0.5, heading=_heading(d.text),
                # The daemon's scale: the fused score over the best it could be.
                score=(1 / (60 + rank)) / (1 / 61)))
            if d.date is not None:
                hits[-1].document_date.FromSeconds(d.date)
        return hits

    def Search(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/Search", context)
        self.fake.requests["RetrievalService/Search"] = request
        if not request.query.strip():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "query is empty")
        return retrieval_pb2.SearchResponse(
            hits=self.hits(request.query, request.top_k, request.filters),
            mode=retrieval_pb2.SEARCH_MODE_HYBRID)

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("RetrievalService/Status", context)
        by_state: dict[str, int] = {}
        for d in self.fake.docs.values():
            by_state[d.state] = by_state.get(d.state, 0) + 1
        n = by_state.get("indexed", 0)
        return retrieval_pb2.RetrievalStatusResponse(
            sources=len(self.fake.sources), chunks=n, documents_by_state=by_state,
            embedded_chunks=n, vectors=n, embedding_model="fake-embed.gguf@0123",
            disk_bytes=4096, source_list=self._sources(), pruned=self.fake.pruned)

    def Reprocess(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Every fake chunk has its vector: nothing to embed (an unknown id is
        NOT_FOUND, both ids INVALID_ARGUMENT, as the daemon answers)."""
        self.fake.enter("RetrievalService/Reprocess", context)
        if request.document_id and request.source_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "give document_id or source_id, not both")
        if request.document_id and request.document_id not in self.fake.docs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no document {request.document_id!r}")
        if request.source_id and request.source_id not in self.fake.sources:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no source {request.source_id!r}")
        return retrieval_pb2.ReprocessResponse(
            chunks=0, reason="every chunk has a vector of the current embedding model")


def _dated(d: Doc, filters: retrieval_pb2.SearchFilters | None) -> bool:
    """Whether a document passes a search's dated_since / dated_until (an undated one
    never does once either is set)."""
    if filters is None or not (filters.HasField("dated_since")
                               or filters.HasField("dated_until")):
        return True
    return d.date is not None and \
        (not filters.HasField("dated_since") or d.date >= filters.dated_since.seconds) and \
        (not filters.HasField("dated_until") or d.date <= filters.dated_until.seconds)


def _heading(text: str) -> str:
    """The section a fake hit is in: its document's last Markdown heading ("" for none)."""
    headings = [line.lstrip("#").strip() for line in text.splitlines()
                if line.startswith("#")]
    return headings[-1] if headings else ""
