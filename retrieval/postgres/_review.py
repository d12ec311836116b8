"""The PostgreSQL store's side of review: versions held for a reviewer, never chunked.

The embedded store's :mod:`retrieval.store._review`, method for method, over
``held_documents`` (schema version 3): a held version's metadata and exact text wait
there, its ``documents`` row shows ``review_required`` and keeps the version that is
searchable, if one is. Approval indexes the held text through the usual replacement
(:meth:`~retrieval.postgres._store.PostgresStore.replace_documents`, which drops the held row
in the same transaction); rejection removes the document's chunks (their vectors go with
them), records the rejected version's metadata and hash and drops the held row, in one
transaction. Every write here takes the document's transaction lock first
(:func:`~retrieval.postgres._locks.document_lock_key`), as a replacement does, so a node's
review and another node's replacement of the same document take turns.

A mixin of :class:`~retrieval.postgres._store.PostgresStore` (which provides the connections).
"""

from __future__ import annotations

import dataclasses
import time

from psycopg.rows import TupleRow

from ..store._rows import DocumentRow
from ._connect import Connection, PgConnected
from ._entries import lock_texts_of, write_entries
from ._locks import document_lock_key
from ._rows import DOCUMENT_COLUMNS, document_row

_DOCUMENT_FIELDS = len(DOCUMENT_COLUMNS.split(", "))
_HELD_SELECT = (
    "SELECT " + ", ".join(f"d.{c}" for c in DOCUMENT_COLUMNS.split(", "))  # noqa: S608 - fixed columns
    + ", h.path, h.title, h.kind, h.category, h.tags, h.content_hash, h.mtime_ns, h.size, "
    "h.redactions, h.document_date FROM held_documents h JOIN documents d ON d.id = h.doc_id")


def _held(r: TupleRow) -> DocumentRow:
    """A held version as its document shows it: the held metadata, state
    ``review_required``; ``indexed_at``, the note and the error are the row's."""
    h = r[_DOCUMENT_FIELDS:]
    tags = tuple(str(t) for t in h[4]) if isinstance(h[4], list) else ()
    return dataclasses.replace(
        document_row(r[:_DOCUMENT_FIELDS]), path=h[0], title=h[1], kind=h[2],
        category=h[3], tags=tags, content_hash=h[5], mtime_ns=int(h[6]), size=int(h[7]),
        redactions=int(h[8]), document_date=None if h[9] is None else int(h[9]),
        state="review_required")


def _document_lock(conn: Connection, doc_id: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (document_lock_key(doc_id),))


class PgReview(PgConnected):
    """Held versions, for :class:`~retrieval.postgres._store.PostgresStore`."""

    def hold_document(self, doc: DocumentRow, text: str) -> None:
        """Hold ``doc`` (this version's metadata) and ``text`` for review, replacing a
        version held before; its document shows ``review_required`` (a new document's
        row is created). The note of an earlier decision is cleared; chunks are kept."""
        tags = list(doc.tags)
        with self._conn() as conn, conn.transaction():
            _document_lock(conn, doc.id)
            conn.execute(
                "INSERT INTO documents(id, source_id, path, title, kind, category, tags, "
                "content_hash, mtime_ns, size, state, error, indexed_at, redactions, "
                "document_date, review_note) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, 'review_required', '', 0, %s, %s, '') ON CONFLICT (id) DO UPDATE SET "
                "state = 'review_required', error = '', review_note = ''",
                (doc.id, doc.source_id, doc.path, doc.title, doc.kind, doc.category, tags,
                 doc.content_hash, doc.mtime_ns, doc.size, doc.redactions,
                 doc.document_date))
            conn.execute(
                "INSERT INTO held_documents(doc_id, path, title, kind, category, tags, "
                "content_hash, mtime_ns, size, redactions, document_date, held_at, text) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (doc_id) DO UPDATE SET path = excluded.path, "
                "title = excluded.title, kind = excluded.kind, category = excluded.category, "
                "tags = excluded.tags, content_hash = excluded.content_hash, "
                "mtime_ns = excluded.mtime_ns, size = excluded.size, "
                "redactions = excluded.redactions, document_date = excluded.document_date, "
                "held_at = excluded.held_at, text = excluded.text",
                (doc.id, doc.path, doc.title, doc.kind, doc.category, tags, doc.content_hash,
                 doc.mtime_ns, doc.size, doc.redactions, doc.document_date,
                 int(time.time()), text))

    def held_document(self, doc_id: str) -> tuple[DocumentRow, str] | None:
        """The version of ``doc_id`` awaiting review and its text, or None."""
        with self._conn() as conn:
            row = conn.execute(_HELD_SELECT.replace(" FROM held_documents", ", h.text FROM "
                                                    "held_documents", 1)
                               + " WHERE h.doc_id = %s", (doc_id,)).fetchone()
        return None if row is None else (_held(row[:-1]), str(row[-1]))

    def held_version(self, doc_id: str) -> DocumentRow | None:
        """The version of ``doc_id`` awaiting review (without its text), or None."""
        with self._conn() as conn:
            row = conn.execute(_HELD_SELECT + " WHERE h.doc_id = %s", (doc_id,)).fetchone()
        return None if row is None else _held(row)

    def held_documents(self, source_id: str | None = None) -> dict[str, DocumentRow]:
        """The versions awaiting review (of one source), by document id, without text."""
        with self._conn() as conn:
            if source_id is None:
                rows = conn.execute(_HELD_SELECT).fetchall()
            else:
                rows = conn.execute(_HELD_SELECT + " WHERE d.source_id = %s",
                                    (source_id,)).fetchall()
        return {str(r[0]): _held(r) for r in rows}

    def release_held(self, doc_id: str) -> None:
        """Drop the held version and show the document ``indexed`` again: what was held
        is the version already indexed (a file changed back, say)."""
        with self._conn() as conn, conn.transaction():
            _document_lock(conn, doc_id)
            conn.execute("DELETE FROM held_documents WHERE doc_id = %s", (doc_id,))
            conn.execute("UPDATE documents SET state = 'indexed', error = '' WHERE id = %s",
                         (doc_id,))

    def reject_document(self, doc_id: str, note: str) -> list[int]:
        """Reject the held version of ``doc_id``: the document's chunks go with their
        vectors (a version approved before is withdrawn too), its row takes the rejected
        version's metadata and hash, state ``rejected`` and ``note``, and the held text
        is dropped, in one transaction. Returns the chunk keys removed; nothing changes
        when no version is held."""
        with self._conn() as conn, conn.transaction():
            _document_lock(conn, doc_id)
            row = conn.execute(_HELD_SELECT + " WHERE h.doc_id = %s", (doc_id,)).fetchone()
            if row is None:
                return []
            v = _held(row)
            lock_texts_of(conn, "c.doc_id = %s", (doc_id,))
            keys = [int(r[0]) for r in conn.execute(
                "DELETE FROM chunks WHERE doc_id = %s RETURNING key", (doc_id,))]
            write_entries(conn, [])  # its texts other documents hold stay, once
            conn.execute(
                "UPDATE documents SET path = %s, title = %s, kind = %s, category = %s, "
                "tags = %s, content_hash = %s, mtime_ns = %s, size = %s, redactions = %s, "
                "document_date = %s, state = 'rejected', error = '', indexed_at = 0, "
                "review_note = %s WHERE id = %s",
                (v.path, v.title, v.kind, v.category, list(v.tags), v.content_hash,
                 v.mtime_ns, v.size, v.redactions, v.document_date, note, doc_id))
            conn.execute("DELETE FROM held_documents WHERE doc_id = %s", (doc_id,))
        return keys
