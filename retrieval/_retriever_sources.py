"""The retriever's sources: add, list, disable, remove, and the scan turn of a directory
source (one node at a time on a shared PostgreSQL store).

A mixin of :class:`~retrieval._retriever.Retriever` (kept apart so neither module grows past
the house limit); sources are rows of the store: adding one touches the store only,
removing one removes its documents from every index.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from ._interface import StoreBackend
from ._limits import RetrievalLimits
from ._retention import Retention
from .errors import InvalidDocument, NotFound, validate_source_id
from .extraction._exclude import ExcludeError, check_patterns
from .store._rows import SourceRow


class RetrieverSources:
    """Sources over the retriever's backend (``_backend``)."""

    _backend: StoreBackend
    _retention: Retention
    limits: RetrievalLimits

    # -- sources -----------------------------------------------------------------------

    async def add_source(self, source_id: str, *, root: Path | None = None, category: str = "",
                         tags: Sequence[str] = (), review_required: bool = False,
                         history: bool = False, max_age_days: int = 0,
                         max_items: int = 0, exclude: Sequence[str] = ()) -> SourceRow:
        """Add (or update) a source: a directory to scan, or (root None) pushed documents,
        or (``history``) time-ordered records pushed by other tools, each dated (when it
        was received unless its upsert says), kept within ``max_age_days`` and
        ``max_items`` (0: unlimited) by background retention (:mod:`retrieval._retention`).

        With ``review_required``, every new or changed document of it waits in state
        ``review_required`` until approved (:meth:`approve`); updating a source turns that
        on or off for what comes next (documents indexed already stay indexed).

        ``exclude``: gitignore-style patterns of files and directories a directory
        source's scans leave out, after the built-in defaults while
        ``limits.exclude_defaults`` (:mod:`retrieval.extraction._exclude`); the next scan
        removes documents they now exclude.

        Raises:
            InvalidDocument: a bad source id; a history source with a root; a retention
                limit for a source that is not history, or a negative one.
        """
        validate_source_id(source_id)
        if history and root is not None:
            raise InvalidDocument("a history source holds pushed records: it has no path")
        if not history and (max_age_days or max_items):
            raise InvalidDocument("max_age_days and max_items apply to history sources "
                                  "only (add it with history)")
        if max_age_days < 0 or max_items < 0:
            raise InvalidDocument("max_age_days and max_items cannot be negative")
        if exclude and root is None:
            raise InvalidDocument("exclude patterns apply to directory sources only")
        try:
            check_patterns(exclude, max_patterns=self.limits.max_exclude_patterns,
                           max_chars=self.limits.max_exclude_chars)
        except ExcludeError as exc:
            raise InvalidDocument(str(exc)) from None
        kind = "history" if history else "directory" if root is not None else "push"
        row = SourceRow(source_id, kind, str(root) if root is not None else "", category,
                        tuple(tags), int(time.time()), review_required=review_required,
                        max_age_days=max_age_days, max_items=max_items,
                        exclude=tuple(exclude))
        store = self._backend.require()
        await asyncio.to_thread(store.upsert_source, row)
        return row

    async def sources(self) -> list[SourceRow]:
        """Every source, by id."""
        store = self._backend.require()
        return await asyncio.to_thread(store.sources)

    async def set_source_disabled(self, source_id: str, disabled: bool) -> SourceRow:
        """Disable a source (its documents are kept, but neither searched nor rescanned)
        or enable it again; returns the source.

        Raises:
            NotFound: unknown source.
        """
        store = self._backend.require()
        if not await self._backend.set_source_disabled(source_id, disabled):
            raise NotFound(f"no source {source_id!r}")
        row = await asyncio.to_thread(store.source, source_id)
        if row is None:  # removed meanwhile
            raise NotFound(f"no source {source_id!r}")
        return row

    async def mark_failed(self, doc_id: str, error: str) -> None:
        """Record that a new version of a document failed (extraction, say): the last
        indexed version stays searchable, and the document shows state ``failed`` with
        ``error`` until a later version is indexed (see :meth:`upsert`)."""
        store = self._backend.require()
        doc = await asyncio.to_thread(store.document, doc_id)
        if doc is not None:
            await asyncio.to_thread(store.set_state, doc, "failed", error[:500])

    @contextlib.asynccontextmanager
    async def scan_turn(self, source_id: str) -> AsyncIterator[bool]:
        """Whether this node may scan the source now (always, on the embedded store; on
        Postgres, while it holds the source's scan lock, which another node may hold:
        then False), for the block; the lock is released after it."""
        taken = await asyncio.to_thread(self._backend.try_scan_lock_sync, source_id)
        try:
            yield taken
        finally:
            if taken:
                await asyncio.to_thread(self._backend.release_scan_lock_sync, source_id)

    async def mark_scanned(self, source_id: str, error: str = "",
                           excluded: int | None = None) -> None:
        """Record that a source was just scanned (and its error, if the scan failed, and
        what its exclude patterns left out, if it ran to its end)."""
        store = self._backend.require()
        await asyncio.to_thread(store.mark_scanned, source_id, error, excluded)

    async def remove_source(self, source_id: str) -> int:
        """Remove a source and everything indexed from it; return the chunks removed.

        Raises:
            NotFound: unknown source.
        """
        return len(await self._backend.delete_source(source_id))
