"""Review before indexing: documents held until a reviewer approves or rejects them.

A document needs review when its source has ``review_required`` or its upsert asked for
it. Ingest extracts, redacts and checks it as usual, then :meth:`Review.hold` stores it in
state ``review_required`` with the exact text to be indexed
(:mod:`retrieval.store._review`): never chunked, embedded or searchable. A version already
indexed stays searchable meanwhile. Then:

* :meth:`Review.approve` indexes exactly the held text (even if the file has changed
  since: the reviewed content), as a normal ingest does: ``indexed``, or ``failed`` with
  the reason; the reviewer's note is kept.
* :meth:`Review.reject` withdraws the document from search (a version approved before
  too), drops the held text and records state ``rejected`` with the note and the rejected
  version's hash: the same content again stays rejected, a changed one goes back to review.

The same content as the version indexed needs no review (a file changed back releases the
held version). One review operation per document runs at a time (on a PostgreSQL store
shared by nodes, across the nodes: the store's ``review_turn``), so an approval never
indexes a version a newer one has replaced meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

from ._interface import DocumentStore, StoreBackend
from .errors import InvalidDocument, NotFound, WrongState
from .redaction._redactor import redact
from .store._rows import DocumentRow

MAX_NOTE_CHARS = 2000
"""Longest reviewer's note, in characters (docs/retrieval.md, "Review")."""

Index = Callable[[DocumentRow, str], Awaitable[DocumentRow]]
"""Chunk, embed and commit a document with its text (the ingest's)."""
Processing = Callable[[DocumentRow], contextlib.AbstractAsyncContextManager[None]]
"""The ingest's bookkeeping around work on a document (:meth:`Ingest.processing`)."""


def _same(a: DocumentRow, b: DocumentRow) -> bool:
    """Whether two versions would be indexed alike (content, filters, date, file)."""
    return (a.content_hash, a.category, a.tags, a.document_date, a.path, a.mtime_ns,
            a.size) == (b.content_hash, b.category, b.tags, b.document_date, b.path,
                        b.mtime_ns, b.size)


def check_note(note: str) -> str:
    """The note as stored: redacted (a credential pasted into a note is not kept).

    Raises:
        InvalidDocument: longer than :data:`MAX_NOTE_CHARS`.
    """
    if len(note) > MAX_NOTE_CHARS:
        raise InvalidDocument(f"review note has {len(note)} characters; the limit is "
                              f"{MAX_NOTE_CHARS}")
    return redact(note.replace("\x00", "")).text


class Review:
    """Held versions of one retriever's documents, and the reviewer's decisions."""

    def __init__(self, indexes: StoreBackend, index: Index, processing: Processing) -> None:
        """Args:
            index: the ingest's indexing of a document and its text.
            processing: the ingest's bookkeeping around work on a document (shown
                ``processing``; ``failed`` with the reason if the work raises).
        """
        self._indexes = indexes
        self._index = index
        self._processing = processing
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def _exclusive(self, doc_id: str) -> AsyncIterator[DocumentStore]:
        """One review operation (hold, approve, reject) of a document at a time (across
        the nodes sharing a PostgreSQL store too)."""
        lock = self._locks.get(doc_id)
        if lock is None:
            lock = self._locks[doc_id] = asyncio.Lock()
        async with lock, self._indexes.review_turn(doc_id):
            store = self._indexes.require()
            yield store

    async def hold(self, doc: DocumentRow, text: str) -> DocumentRow:
        """Store ``doc`` (a new version, checked and redacted) with its ``text`` for
        review; returns it in state ``review_required``. The same content held already,
        or rejected already, changes nothing; the content already indexed is released
        instead (it was approved)."""
        async with self._exclusive(doc.id) as store:
            existing = await asyncio.to_thread(store.document, doc.id)
            if existing is not None and existing.state == "rejected" and \
                    existing.content_hash == doc.content_hash:
                return existing  # rejected as it is: stays so until it changes
            if existing is not None and existing.state == "review_required":
                held = await asyncio.to_thread(store.held_document, doc.id)
                if held is not None and _same(held[0], doc):
                    return held[0]
                if existing.indexed_at and existing.content_hash == doc.content_hash \
                        and existing.category == doc.category and existing.tags == doc.tags \
                        and existing.document_date == doc.document_date:
                    await asyncio.to_thread(store.release_held, doc.id)
                    return dataclasses.replace(existing, state="indexed", error="")
            async with self._processing(doc):
                await asyncio.to_thread(store.hold_document, doc, text)
        return dataclasses.replace(
            doc, state="review_required", error="", review_note="",
            indexed_at=existing.indexed_at if existing is not None else 0)

    async def approve(self, doc_id: str, note: str = "") -> DocumentRow:
        """Index exactly the held version of ``doc_id`` (replacing the version indexed
        before, atomically); returns it ``indexed``, with ``note``.

        Raises:
            NotFound: no such document.
            WrongState: it does not await review (the message names its state).
            InvalidDocument: the note is too long.
            StorageFull: as an upsert.
        """
        note = check_note(note)
        async with self._exclusive(doc_id) as store:
            await self._awaiting(store, doc_id)
            held = await asyncio.to_thread(store.held_document, doc_id)
            if held is None:  # a store older than its row's state; cannot be indexed
                raise WrongState(f"document {doc_id!r} has no version held for review")
            version, text = held
            await self._indexes.catch_up()
            return await self._index(dataclasses.replace(
                version, state="processing", error="", review_note=note,
                indexed_at=int(time.time())), text)

    async def reject(self, doc_id: str, note: str = "") -> DocumentRow:
        """Reject the held version of ``doc_id``: the document leaves every index (a
        version approved before too), keeps the rejected version's hash, and shows
        ``rejected`` with ``note``.

        Raises:
            NotFound, WrongState, InvalidDocument: as :meth:`approve`.
        """
        note = check_note(note)
        async with self._exclusive(doc_id) as store:
            await self._awaiting(store, doc_id)
            await self._indexes.withdraw(partial(store.reject_document, doc_id, note))
            row = await asyncio.to_thread(store.document, doc_id)
        if row is None:  # deleted meanwhile
            raise NotFound(f"no document {doc_id!r}")
        return row

    @staticmethod
    async def _awaiting(store: DocumentStore, doc_id: str) -> None:
        row = await asyncio.to_thread(store.document, doc_id)
        if row is None:
            raise NotFound(f"no document {doc_id!r}")
        if row.state != "review_required":
            raise WrongState(f"document {doc_id!r} is {row.state}, not review_required: "
                             "only a document awaiting review can be approved or rejected")
