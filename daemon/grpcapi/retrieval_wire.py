"""RetrievalService's messages: requests read into the retriever's terms, its results
written back (hits, documents, sources, progress), and the enums between the two."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from llamad_protocol.v1 import retrieval_pb2 as rpb
from retrieval import (
    DocumentRow,
    Filters,
    Hit,
    Query,
    RetrievalStatus,
    ScanReport,
    SearchMode,
    SearchResult,
    SourceRow,
    VectorRebuild,
)

from ..errors import InvalidArgument

_STATES = {
    "pending": rpb.DOCUMENT_STATE_PENDING,
    "processing": rpb.DOCUMENT_STATE_PROCESSING,
    "indexed": rpb.DOCUMENT_STATE_INDEXED,
    "failed": rpb.DOCUMENT_STATE_FAILED,
    "review_required": rpb.DOCUMENT_STATE_REVIEW_REQUIRED,
    "rejected": rpb.DOCUMENT_STATE_REJECTED,
}
_STATE_NAMES = {v: k for k, v in _STATES.items()}
SOURCES = {"text": rpb.SEARCH_SOURCE_TEXT, "vector": rpb.SEARCH_SOURCE_VECTOR,
            "hybrid": rpb.SEARCH_SOURCE_HYBRID}


MODES: dict[str, rpb.SearchMode.ValueType] = {
    m: rpb.SearchMode.Value(f"SEARCH_MODE_{m.name}") for m in SearchMode}
"""Each :class:`retrieval.SearchMode` as the wire's."""
_MODE_NAMES = {v: k for k, v in MODES.items()}


def filters_from(f: rpb.SearchFilters) -> Filters:
    """A request's search filters."""
    return Filters(
        sources=tuple(f.sources), kinds=tuple(f.kinds), categories=tuple(f.categories),
        tags=tuple(f.tags),
        since=f.indexed_since.seconds if f.HasField("indexed_since") else None,
        until=f.indexed_until.seconds if f.HasField("indexed_until") else None,
        dated_since=f.dated_since.seconds if f.HasField("dated_since") else None,
        dated_until=f.dated_until.seconds if f.HasField("dated_until") else None,
    )


def mode_name(value: rpb.SearchMode.ValueType) -> str:
    """The search mode a request asks for (unset: hybrid).

    Raises:
        InvalidArgument: an unknown mode.
    """
    mode = value or rpb.SEARCH_MODE_HYBRID
    if mode not in _MODE_NAMES:
        raise InvalidArgument(f"unknown search mode {mode}", field="mode")
    return _MODE_NAMES[mode]


def query_from(request: rpb.SearchRequest) -> Query:
    """What a Search request chooses (unset: the configured defaults).

    Raises:
        InvalidArgument: an unknown mode.
    """
    return Query(
        mode=mode_name(request.mode),
        min_score=request.min_score if request.HasField("min_score") else None,
        candidates=request.candidates or None,
        text_weight=request.text_weight if request.HasField("text_weight") else None,
        vector_weight=request.vector_weight if request.HasField("vector_weight") else None,
        group_by_document=request.group_by_document, fusion=request.fusion or None)


def search_response(result: SearchResult) -> rpb.SearchResponse:
    """A search's answer on the wire (gRPC's and, as JSON, HTTP's)."""
    st = result.stats
    stats = rpb.SearchStats(
        text_chunks=st.text_chunks, vector_chunks=st.vector_chunks,
        text_depth=st.text_depth, vector_depth=st.vector_depth,
        text_candidates=st.text_candidates, vector_candidates=st.vector_candidates,
        fused=st.fused, stages_ms=st.stages_ms)
    return rpb.SearchResponse(hits=[search_hit(h) for h in result.hits],
                              mode=MODES[result.mode], warnings=result.warnings,
                              vector_model=result.vector_model, stats=stats)


def search_hit(h: Hit) -> rpb.SearchHit:
    hit = rpb.SearchHit(
        chunk_id=h.chunk_id, document_id=h.doc_id, title=h.title,
        source_id=h.source_id, path=h.path, heading=h.heading, text=h.text,
        snippet=h.snippet, search_source=SOURCES[h.search_source],
        fused_score=h.fused_score, score=h.score, kind=h.kind, category=h.category,
        tags=h.tags, ordinal=h.ordinal, other_chunk_ids=h.other_chunk_ids,
        also_in=h.also_in)
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
    if h.document_date is not None:
        hit.document_date.FromSeconds(h.document_date)
    return hit


_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799
"""0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the range of a protobuf Timestamp."""


def document_date_from(request: rpb.UpsertDocumentRequest) -> int | None:
    """The caller's document_date, in unix seconds (None when unset).

    Raises:
        InvalidArgument: a time outside what a Timestamp may carry (years 1 to 9999).
    """
    if not request.HasField("document_date"):
        return None
    ts = request.document_date
    if not (_MIN_SECONDS <= ts.seconds <= _MAX_SECONDS and 0 <= ts.nanos < 1_000_000_000):
        raise InvalidArgument(f"document_date is out of range ({ts.seconds} s, {ts.nanos} "
                              "ns): it must lie within years 1 to 9999")
    return ts.seconds


def retrieval_status(s: RetrievalStatus, sources: list[rpb.Source], pruned: int
                     ) -> rpb.RetrievalStatusResponse:
    """The knowledge base's status (``sources``: each with its document count;
    ``pruned``: records retention removed since the start)."""
    return rpb.RetrievalStatusResponse(
        sources=s.sources, chunks=s.chunks, documents_by_state=s.documents_by_state,
        embedded_chunks=s.embedded_chunks, vectors=s.vectors,
        embedding_model=s.embedding_model, disk_bytes=s.disk_bytes, repaired=s.repaired,
        source_list=sources,
        backfill=rpb.VectorBackfill(
            running=s.backfill.running, model=s.backfill.model, pending=s.backfill.pending,
            done=s.backfill.done, failed=s.backfill.failed,
            last_error=s.backfill.last_error),
        rebuild=vector_rebuild(s.rebuild), pruned=pruned, store=s.store,
        lexical_ranking=s.lexical_ranking, store_target=s.store_target)


def vector_rebuild(r: VectorRebuild) -> rpb.VectorRebuild:
    """The rebuild for a new embedding model (all empty when none is due)."""
    return rpb.VectorRebuild(running=r.running, model=r.model,
                             serving_model=r.serving_model, pending=r.pending, done=r.done)


def _ts(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    if not seconds:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromSeconds(int(seconds))
    return ts


def states_from(values: Iterable[int]) -> tuple[str, ...]:
    """The document states a ListDocuments request filters by (empty: every state).

    Raises:
        InvalidArgument: an unspecified or unknown state.
    """
    names = []
    for value in values:
        if value not in _STATE_NAMES:
            raise InvalidArgument(f"unknown document state {value} in states")
        names.append(_STATE_NAMES[value])  # type: ignore[index]
    return tuple(names)


def _document(d: DocumentRow) -> rpb.Document:
    msg = rpb.Document(id=d.id, source_id=d.source_id, title=d.title, kind=d.kind,
                       category=d.category, tags=list(d.tags),
                       state=_STATES.get(d.state, rpb.DOCUMENT_STATE_UNSPECIFIED),
                       error=d.error, path=d.path, redactions=d.redactions,
                       review_note=d.review_note)
    if (ts := _ts(d.indexed_at)) is not None:
        msg.indexed_at.CopyFrom(ts)
    if d.document_date is not None:
        msg.document_date.FromSeconds(d.document_date)
    return msg


def _source(s: SourceRow, documents: int = 0) -> rpb.Source:
    msg = rpb.Source(id=s.id, kind=s.kind, path=s.root, category=s.category, tags=list(s.tags),
                     last_error=s.last_error, documents=documents, disabled=s.disabled,
                     review_required=s.review_required, max_age_days=s.max_age_days,
                     max_items=s.max_items, pruned=s.pruned, exclude=list(s.exclude),
                     excluded=s.excluded)
    if (ts := _ts(s.last_scan)) is not None:
        msg.last_scan.CopyFrom(ts)
    return msg


def _progress(r: ScanReport, done: bool) -> rpb.ReindexProgress:
    return rpb.ReindexProgress(
        source_id=r.source_id, seen=r.seen, added=r.added, changed=r.changed,
        unchanged=r.unchanged, deleted=r.deleted, done=done,
        failed=[rpb.FileIssue(path=p, reason=why) for p, why in r.failed],
        skipped=[rpb.FileIssue(path=p, reason=why) for p, why in r.skipped],
        failed_total=r.failed_total, skipped_total=r.skipped_total,
        limit_reached=r.limit_reached, excluded=r.excluded,
    )
