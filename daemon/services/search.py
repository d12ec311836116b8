"""Search, free of any wire: hybrid retrieval over the knowledge base, the lazy refresh of
the sources it covers, and its audit record.

gRPC's RetrievalService/Search (:mod:`daemon.grpcapi.retrieval`) reads its request into
plain arguments (:class:`retrieval.Filters`, :class:`retrieval.Query`) and writes the
:class:`retrieval.SearchResult` back; an invalid argument is refused as
:class:`~daemon.errors.InvalidArgument` naming its field as the request does (``top_k``,
``query``, ``min_score``...).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from retrieval import Filters, InvalidDocument, Query, Retriever, SearchResult, scan_source

from ..errors import InvalidArgument
from ..models import lanes
from ..telemetry.audit import AuditLog
from .retrieval_bridge import _no_roots, counting_tokens

REFRESH_CHECK = 10.0
"""Seconds between two looks at the sources' last scans by searches (lazy refresh): a
stale source is noticed within this long of a search, and searches pay no read for it."""

_FIELDS = {"k": "top_k"}
"""The retriever's argument -> the request's field, where they differ."""


def _no_note(**_: Any) -> None:
    return None


class SearchService:
    """Searches of one retriever, and the rescans they start (module docstring)."""

    def __init__(self, retriever: Retriever,
                 allowed_roots: Callable[[], tuple[str, ...]] = _no_roots, *,
                 audit: AuditLog | None = None,
                 refresh_interval: Callable[[], float] = lambda: 0.0,
                 wall: Callable[[], float] = time.time) -> None:
        """Args:
            allowed_roots: where directory sources may live (retrieval.allowed_roots; read
                at every rescan, so a reload applies at once).
            audit: where searches are recorded (retrieval.search_audit_log), or None.
            refresh_interval: retrieval.refresh_min_interval (0: no refresh on search).
            wall: the clock last scans are compared with (injected in tests).
        """
        self._r = retriever
        self._allowed_roots = allowed_roots
        self._audit = audit
        self._refresh_interval = refresh_interval
        self._wall = wall
        self._refreshes: dict[str, asyncio.Task[None]] = {}
        self._refreshed_at: dict[str, float] = {}
        self._checked_at = float("-inf")  # when a search last looked at the sources

    async def search(self, query: str, *, top_k: int = 0, filters: Filters | None = None,
                     options: Query | None = None,
                     note: Callable[..., None] = _no_note) -> SearchResult:
        """The hits for ``query`` (``top_k`` 0: retrieval.default_k), best first.

        Stale directory sources the search covers are rescanned in the background first
        (:meth:`_refresh`); this search sees the index as it is. Cancelling the call
        cancels the search, not the rescans it started.

        Raises:
            InvalidArgument: an empty or oversized query, or options out of range, naming
                the field (``query``, ``top_k``, ``mode``, ``candidates``, ...).
            VectorUnavailable: vector mode asked for while vectors cannot be searched.
        """
        began = time.perf_counter()
        filters, options = filters or Filters(), options or Query()
        await self._refresh(filters.sources)
        try:
            # The query's embedding waits in the caller's lane (interactive unless it asked
            # for batch), not in the background lane of the retriever's own embeddings;
            # set here, not around the rescans above, which are background work.
            # Its tokens are those of its query embedding (its token's tpm counts them).
            with lanes.using(lanes.asked()), counting_tokens() as spent:
                result = await self._r.search(query, k=top_k or None, filters=filters,
                                              options=options)
        except InvalidDocument as exc:
            field = None if exc.field is None else _FIELDS.get(exc.field, exc.field)
            raise InvalidArgument(str(exc), field=field) from None
        note(query_chars=len(query), hits=len(result.hits), mode=result.mode,
             prompt_tokens=spent[0])
        if self._audit is not None:
            await self._record(self._audit, query, top_k, result, filters=filters,
                               options=options, seconds=time.perf_counter() - began)
        return result

    async def _refresh(self, named: Sequence[str]) -> None:
        """Lazy refresh: rescan, in the background, each enabled directory source the
        search covers (those named, else all) whose last scan is older than
        retrieval.refresh_min_interval; at most once per interval per source, never two
        at once. The search itself does not wait: this one sees the index as it is. An
        incremental rescan costs a stat per unchanged file, so it is the change check."""
        interval = self._refresh_interval()
        now = self._wall()
        # The sources are read at most every REFRESH_CHECK seconds: not once per search.
        if interval <= 0 or now - self._checked_at < min(REFRESH_CHECK, interval):
            return
        self._checked_at = now
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

    async def _record(self, audit: AuditLog, query: str, top_k: int, result: SearchResult,
                      *, filters: Filters, options: Query, seconds: float) -> None:
        """One audit record: the query (redacted by the log), filters, options, mode, the
        whole fused list with both ranks, what was returned, and the latency."""
        ids = await self._r.chunk_ids([key for key, *_ in result.fused])
        audit.record(
            call="Search", query=query, top_k=top_k,
            filters=dataclasses.asdict(filters), options=dataclasses.asdict(options),
            mode=result.mode, vector_model=result.vector_model, warnings=result.warnings,
            fused=[{"chunk_id": ids.get(key, f"#{key}"), "text_rank": tr,
                    "vector_rank": vr, "score": round(score, 6)}
                   for key, tr, vr, score in result.fused],
            returned=[h.chunk_id for h in result.hits],
            latency_ms=round(seconds * 1000, 2))
