"""Rows of the PostgreSQL store as the embedded store's dataclasses, and back.

The same :class:`~retrieval.store._metadata.SourceRow`,
:class:`~retrieval.store._metadata.DocumentRow` and
:class:`~retrieval.store._metadata.StoredChunk` come out of both stores, so the code above them
does not know which one answered. Columns are listed by name (never ``SELECT *``), so a
later migration that adds one does not shift these tuples.
"""

from __future__ import annotations

from psycopg.rows import TupleRow

from ..store._rows import DocumentRow, SourceRow, StoredChunk

SOURCE_COLUMNS = ("id, kind, root, category, tags, created_at, last_scan, last_error, "
                  "disabled, review_required, max_age_days, max_items, pruned, exclude, "
                  "excluded")
SOURCE_SELECT = f"SELECT {SOURCE_COLUMNS} FROM sources"  # noqa: S608 - fixed column list

DOCUMENT_COLUMNS = ("id, source_id, path, title, kind, category, tags, content_hash, "
                    "mtime_ns, size, state, error, indexed_at, redactions, document_date, "
                    "review_note")
DOCUMENT_SELECT = f"SELECT {DOCUMENT_COLUMNS} FROM documents"  # noqa: S608 - fixed columns

DOCUMENT_UPSERT = (
    "INSERT INTO documents(id, source_id, path, title, kind, category, tags, content_hash, "
    "mtime_ns, size, state, error, indexed_at, redactions, document_date, review_note) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'indexed', '', %s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET source_id = excluded.source_id, path = excluded.path, "
    "title = excluded.title, kind = excluded.kind, category = excluded.category, "
    "tags = excluded.tags, content_hash = excluded.content_hash, "
    "mtime_ns = excluded.mtime_ns, size = excluded.size, state = 'indexed', error = '', "
    "indexed_at = excluded.indexed_at, redactions = excluded.redactions, "
    "document_date = excluded.document_date, review_note = excluded.review_note")
"""A document upserted as indexed (its replacement's metadata), as the embedded store."""

CHUNK_SELECT = (
    "SELECT c.key, c.chunk_id, c.doc_id, c.ordinal, c.heading, c.text, c.content_hash, "
    "d.title, d.source_id, d.path, d.kind, d.category, d.tags, d.indexed_at, d.mtime_ns, "
    "d.document_date FROM chunks c JOIN documents d ON d.id = c.doc_id")


def document_args(doc: DocumentRow) -> tuple[object, ...]:
    """The parameters of :data:`DOCUMENT_UPSERT` for ``doc``."""
    return (doc.id, doc.source_id, doc.path, doc.title, doc.kind, doc.category,
            list(doc.tags), doc.content_hash, doc.mtime_ns, doc.size, doc.indexed_at,
            doc.redactions, doc.document_date, doc.review_note)


def _tags(value: object) -> tuple[str, ...]:
    return tuple(str(t) for t in value) if isinstance(value, list) else ()


def source_row(r: TupleRow) -> SourceRow:
    return SourceRow(r[0], r[1], r[2], r[3], _tags(r[4]), int(r[5]),
                     None if r[6] is None else int(r[6]), r[7], bool(r[8]), bool(r[9]),
                     int(r[10]), int(r[11]), int(r[12]), _tags(r[13]), int(r[14]))


def document_row(r: TupleRow) -> DocumentRow:
    return DocumentRow(r[0], r[1], r[2], r[3], r[4], r[5], _tags(r[6]), r[7], int(r[8]),
                       int(r[9]), r[10], r[11], int(r[12]), int(r[13]),
                       None if r[14] is None else int(r[14]), r[15])


def chunk_row(r: TupleRow) -> StoredChunk:
    return StoredChunk(int(r[0]), r[1], r[2], int(r[3]), r[4], r[5], r[6], r[7], r[8], r[9],
                       r[10], r[11], _tags(r[12]), int(r[13]), int(r[14] or 0),
                       None if r[15] is None else int(r[15]))
