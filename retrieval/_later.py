"""Upserts accepted now and indexed in the background (``UpsertDocument`` with
``wait=false``).

A document accepted here is checked at once (source, id, kind, size: what would make it
refused is said before it is accepted), shown in state ``pending`` until its upsert
starts, then ``processing``, then ``indexed`` or ``failed`` with the reason, as
:meth:`retrieval.Retriever.document` shows. Two accepted versions of one document are
indexed in the order they came. At most ``limits.max_pending`` wait at once: past that,
:class:`retrieval.errors.Busy` says to retry. A pending document is not durable until it
is indexed: closing the retriever finishes the ones accepted (the daemon's drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

import structlog

from .errors import Busy, validate_document_id
from .store._rows import DocumentRow

_log = structlog.get_logger("llamad.retrieval")

Upsert = Callable[..., Awaitable[DocumentRow]]
Check = Callable[[str, str, str], Awaitable[object]]
"""What refuses a document (source id, text, kind), raising: the upsert's own check."""


class Later:
    """The background upserts of one retriever."""

    def __init__(self, upsert: Upsert, check: Check, max_pending: Callable[[], int]) -> None:
        self._upsert = upsert
        self._check = check
        self._max_pending = max_pending
        self.pending: dict[str, DocumentRow] = {}   # accepted, not started
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the latest per document
        self._running: set[asyncio.Task[None]] = set()   # all of them

    async def accept(self, source_id: str, title: str, text: str, *, doc_id: str, kind: str,
                     category: str, tags: Sequence[str], document_date: int | None = None,
                     received_at: int | None = None, review: bool = False) -> DocumentRow:
        """Check the document as its upsert would, then queue the upsert; return the
        document in state ``pending`` (with ``review``, held for review once processed).

        Raises:
            InvalidDocument: a bad id or kind, an empty or oversized text.
            NotFound: an unknown source.
            Busy: ``max_pending`` documents already wait.
        """
        validate_document_id(doc_id)
        await self._check(source_id, text, kind)
        waiting = len(self._running)
        if waiting >= self._max_pending():
            raise Busy(f"{waiting} documents already wait to be indexed "
                       f"(retrieval.max_pending_upserts); retry shortly, or wait=true")
        row = DocumentRow(doc_id, source_id, "", title, kind, category, tuple(tags), "", 0, 0,
                          "pending", "", int(time.time()), 0, document_date)
        self.pending[doc_id] = row
        previous = self._tasks.get(doc_id)
        task = asyncio.create_task(self._run(row, text, previous, received_at, review),
                                   name=f"upsert-{doc_id}")
        self._tasks[doc_id] = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return row

    async def _run(self, row: DocumentRow, text: str,
                   previous: asyncio.Task[None] | None, received_at: int | None,
                   review: bool = False) -> None:
        if previous is not None:  # an earlier version of this document goes first
            await asyncio.gather(previous, return_exceptions=True)
        try:  # pending until the ingest shows it processing (its state then wins)
            await self._upsert(row.source_id, row.title, text, doc_id=row.id, kind=row.kind,
                               category=row.category, tags=row.tags,
                               document_date=row.document_date, received_at=received_at,
                               review=review)
        except Exception as exc:  # the upsert recorded it as failed; logged here
            _log.warning("background upsert failed", document=row.id, error=str(exc)[:200])
        finally:
            if self.pending.get(row.id) is row:
                del self.pending[row.id]
            if self._tasks.get(row.id) is asyncio.current_task():
                del self._tasks[row.id]

    async def close(self) -> None:
        """Finish the upserts accepted (they were acknowledged as pending)."""
        while self._running:
            with contextlib.suppress(Exception):
                await asyncio.gather(*list(self._running), return_exceptions=True)
