"""The metadata store's side of review: versions held for a reviewer, never chunked.

A document that needs review (its source has ``review_required``, or its upsert asked for
review) is extracted, redacted and checked as usual, then held: its exact text to index
and the version's metadata go to ``held_documents`` (one row per document: the newest
version awaiting review), and its ``documents`` row shows state ``review_required``.
Nothing of a held version reaches ``chunks``: it is neither embedded nor in BM25 or HNSW,
and the vector backfill (which reads chunks) never sees it. The ``documents`` row keeps
the version that is searchable, if one is: its chunks stay until the new one is approved.

Approval indexes the held text through the usual replacement
(:meth:`retrieval.store._metadata.Store.replace_documents`, which drops the held row in the same
transaction); rejection (:meth:`ReviewStore.reject_document`) removes the document's
chunks, records the rejected version's metadata and hash (so an unchanged file stays
rejected) and drops the held row, in one transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._rows import DocumentRow

REVIEW_SCHEMA = """
CREATE TABLE IF NOT EXISTS held_documents (   -- versions awaiting review: never chunked
    doc_id TEXT PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
    path TEXT NOT NULL DEFAULT '',
    title TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL DEFAULT 'text',
    category TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '[]',
    content_hash TEXT NOT NULL,
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    redactions INTEGER NOT NULL DEFAULT 0,
    document_date INTEGER,
    held_at INTEGER NOT NULL,
    text TEXT NOT NULL              -- exactly what approval indexes (redacted)
);
"""
"""The table of held versions (part of the store's schema)."""

INSERT_DOCUMENT = (
    "INSERT INTO documents(id, source_id, path, title, kind, category, tags, "
    "content_hash, mtime_ns, size, state, error, indexed_at, redactions, "
    "document_date, review_note) "
)
"""The start of an insert of a whole document row (VALUES and ON CONFLICT follow)."""


def document_head(doc: DocumentRow) -> tuple[object, ...]:
    """The values of a document row's first ten columns, ``id`` to ``size``."""
    return (doc.id, doc.source_id, doc.path, doc.title, doc.kind, doc.category,
            json.dumps(list(doc.tags)), doc.content_hash, doc.mtime_ns, doc.size)


_HELD_SELECT = (
    "SELECT d.*, h.path AS h_path, h.title AS h_title, h.kind AS h_kind, "
    "h.category AS h_category, h.tags AS h_tags, h.content_hash AS h_content_hash, "
    "h.mtime_ns AS h_mtime_ns, h.size AS h_size, h.redactions AS h_redactions, "
    "h.document_date AS h_document_date "
    "FROM held_documents h JOIN documents d ON d.id = h.doc_id"
)


class ReviewStore:
    """Held versions, for :class:`retrieval.store._metadata.Store` (which provides the
    connection, its lock and its transactions)."""

    _db: sqlite3.Connection
    _lock: threading.RLock

    def _transaction(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    @staticmethod
    def _document(row: sqlite3.Row) -> DocumentRow:
        raise NotImplementedError

    def _held(self, row: sqlite3.Row) -> DocumentRow:
        """A held version as its document shows it: the held metadata, state
        ``review_required``; ``indexed_at``, the note and the error are the row's."""
        tags = json.loads(row["h_tags"] or "[]")
        return dataclasses.replace(
            self._document(row), path=row["h_path"], title=row["h_title"],
            kind=row["h_kind"], category=row["h_category"],
            tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
            content_hash=row["h_content_hash"], mtime_ns=row["h_mtime_ns"],
            size=row["h_size"], redactions=row["h_redactions"],
            document_date=row["h_document_date"], state="review_required")

    def hold_document(self, doc: DocumentRow, text: str) -> None:
        """Hold ``doc`` (this version's metadata) and ``text`` for review, replacing a
        version held before; its document shows ``review_required`` (a new document's
        row is created). The note of an earlier decision is cleared; chunks are kept."""
        with self._transaction():
            self._db.execute(
                INSERT_DOCUMENT + "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'review_required', "
                "'', 0, ?, ?, '') ON CONFLICT(id) DO UPDATE SET state = 'review_required', "
                "error = '', review_note = ''",
                (*document_head(doc), doc.redactions, doc.document_date))
            self._db.execute(
                "INSERT OR REPLACE INTO held_documents(doc_id, path, title, kind, category, "
                "tags, content_hash, mtime_ns, size, redactions, document_date, held_at, "
                "text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (doc.id, doc.path, doc.title, doc.kind, doc.category,
                 json.dumps(list(doc.tags)), doc.content_hash, doc.mtime_ns, doc.size,
                 doc.redactions, doc.document_date, int(time.time()), text))

    def held_document(self, doc_id: str) -> tuple[DocumentRow, str] | None:
        """The version of ``doc_id`` awaiting review and its text, or None."""
        with self._lock:
            row = self._db.execute(f"{_HELD_SELECT} WHERE h.doc_id = ?", (doc_id,)).fetchone()
            if row is None:
                return None
            text = self._db.execute("SELECT text FROM held_documents WHERE doc_id = ?",
                                    (doc_id,)).fetchone()[0]
        return self._held(row), str(text)

    def held_version(self, doc_id: str) -> DocumentRow | None:
        """The version of ``doc_id`` awaiting review (without its text), or None."""
        with self._lock:
            row = self._db.execute(f"{_HELD_SELECT} WHERE h.doc_id = ?", (doc_id,)).fetchone()
        return None if row is None else self._held(row)

    def held_documents(self, source_id: str | None = None) -> dict[str, DocumentRow]:
        """The versions awaiting review (of one source), by document id, without text."""
        with self._lock:
            if source_id is None:
                rows = self._db.execute(_HELD_SELECT).fetchall()
            else:
                rows = self._db.execute(f"{_HELD_SELECT} WHERE d.source_id = ?",
                                        (source_id,)).fetchall()
        return {r["id"]: self._held(r) for r in rows}

    def release_held(self, doc_id: str) -> None:
        """Drop the held version and show the document ``indexed`` again: what was held
        is the version already indexed (a file changed back, say)."""
        with self._transaction():
            self._db.execute("DELETE FROM held_documents WHERE doc_id = ?", (doc_id,))
            self._db.execute("UPDATE documents SET state = 'indexed', error = '' "
                             "WHERE id = ?", (doc_id,))

    def reject_document(self, doc_id: str, note: str) -> list[int]:
        """Reject the held version of ``doc_id``: the document's chunks go (a version
        approved before is withdrawn too), its row takes the rejected version's metadata
        and hash, state ``rejected`` and ``note``, and the held text is dropped. Returns
        the chunk keys removed; nothing changes when no version is held."""
        with self._transaction():
            held = self._db.execute(f"{_HELD_SELECT} WHERE h.doc_id = ?",
                                    (doc_id,)).fetchone()
            if held is None:
                return []
            version = self._held(held)
            keys = [int(r[0]) for r in self._db.execute(
                "SELECT key FROM chunks WHERE doc_id = ?", (doc_id,))]
            self._db.execute("DELETE FROM chunks WHERE doc_id = ?", (doc_id,))
            self._db.execute(
                "UPDATE documents SET path = ?, title = ?, kind = ?, category = ?, tags = ?, "
                "content_hash = ?, mtime_ns = ?, size = ?, redactions = ?, "
                "document_date = ?, state = 'rejected', error = '', indexed_at = 0, "
                "review_note = ? WHERE id = ?",
                (version.path, version.title, version.kind, version.category,
                 json.dumps(list(version.tags)), version.content_hash, version.mtime_ns,
                 version.size, version.redactions, version.document_date, note, doc_id))
            self._db.execute("DELETE FROM held_documents WHERE doc_id = ?", (doc_id,))
        return keys
