"""The metadata store: SQLite in WAL mode, the source of truth for everything indexed.

tantivy and hnswlib hold derived data; whatever they lack or hold in excess after a crash
is re-derived from here at start-up. A document's replacement is one transaction: its old
chunks go and its new ones arrive together, so a reader never sees half of each.
``synchronous=FULL``: a commit that returned is on disk (an acknowledged write survives a
power cut, not just a crash of the process).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ._bm25 import Filters
from ._embeddings import EmbeddingCache
from ._entries import ENTRY_BACKFILL, ENTRY_SCHEMA, EntryStore
from ._history import HistoryStore, bounded
from ._review import INSERT_DOCUMENT, REVIEW_SCHEMA, ReviewStore, document_head
from ._rows import ChunkRow, DocumentRow, Replacement, SourceRow, StoredChunk

__all__ = ["ChunkRow", "DocumentRow", "Replacement", "SourceRow", "Store", "StoredChunk"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,             -- directory | push | history
    root TEXT NOT NULL DEFAULT '',
    category TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '[]',
    created_at INTEGER NOT NULL,
    last_scan INTEGER,
    last_error TEXT NOT NULL DEFAULT '',
    disabled INTEGER NOT NULL DEFAULT 0,  -- 1: kept, but neither searched nor rescanned
    review_required INTEGER NOT NULL DEFAULT 0,  -- 1: every new version waits for review
    max_age_days INTEGER NOT NULL DEFAULT 0,     -- history retention (0: unlimited)
    max_items INTEGER NOT NULL DEFAULT 0,
    pruned INTEGER NOT NULL DEFAULT 0,           -- records deleted by retention, ever
    exclude TEXT NOT NULL DEFAULT '[]',          -- gitignore-style patterns (directory)
    excluded INTEGER NOT NULL DEFAULT 0          -- what the last scan left out by them
);
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY,
    source_id TEXT NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
    path TEXT NOT NULL DEFAULT '',
    title TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL DEFAULT 'text',
    category TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '[]',
    content_hash TEXT NOT NULL DEFAULT '',
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    size INTEGER NOT NULL DEFAULT 0,
    -- pending | processing | indexed | failed | review_required | rejected
    state TEXT NOT NULL DEFAULT 'pending',
    error TEXT NOT NULL DEFAULT '',
    indexed_at INTEGER NOT NULL DEFAULT 0,
    redactions INTEGER NOT NULL DEFAULT 0,
    document_date INTEGER,          -- the document's own date, unix seconds (NULL: none)
    review_note TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS documents_source ON documents(source_id);
CREATE TABLE IF NOT EXISTS chunks (
    key INTEGER PRIMARY KEY AUTOINCREMENT,
    chunk_id TEXT NOT NULL UNIQUE,
    doc_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    heading TEXT NOT NULL DEFAULT '',
    text TEXT NOT NULL,
    content_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);
CREATE TABLE IF NOT EXISTS embeddings (
    model TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (model, content_hash)
);
"""

_ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sources", "disabled", "INTEGER NOT NULL DEFAULT 0"),
    ("sources", "review_required", "INTEGER NOT NULL DEFAULT 0"),
    ("sources", "max_age_days", "INTEGER NOT NULL DEFAULT 0"),
    ("sources", "max_items", "INTEGER NOT NULL DEFAULT 0"),
    ("sources", "pruned", "INTEGER NOT NULL DEFAULT 0"),
    ("documents", "document_date", "INTEGER"),
    ("documents", "review_note", "TEXT NOT NULL DEFAULT ''"),
    ("sources", "exclude", "TEXT NOT NULL DEFAULT '[]'"),
    ("sources", "excluded", "INTEGER NOT NULL DEFAULT 0"),
    ("chunks", "entry", "INTEGER"),  # the text's indexed holder (retrieval.store._entries)
)
"""Columns added since the first schema, in order: (table, column, declaration)."""


def _tags(raw: str) -> tuple[str, ...]:
    value = json.loads(raw or "[]")
    return tuple(str(t) for t in value) if isinstance(value, list) else ()


class Store(ReviewStore, HistoryStore, EmbeddingCache, EntryStore):
    """Thread-safe access to the SQLite database (one connection, one lock); versions
    held for review are :class:`~retrieval.store._review.ReviewStore`'s, retention's
    queries :class:`~retrieval.store._history.HistoryStore`'s, the embedding cache
    :class:`~retrieval.store._embeddings.EmbeddingCache`'s, a text's one index entry
    :class:`~retrieval.store._entries.EntryStore`'s."""

    _tags_of = staticmethod(_tags)

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._applied: set[str] = set()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA + REVIEW_SCHEMA)
            self._migrate()
        # A search's reads of chunks (its fetch stage, the copies of a text) go through a
        # connection of their own: in WAL mode a write transaction (a group commit of up to
        # retrieval.max_commit_batch documents) does not block it, where on the writer's
        # connection a search waited for the whole commit under the one lock.
        self._read_db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._read_db.row_factory = sqlite3.Row
        self._read_db.execute("PRAGMA busy_timeout=5000")
        self._read_db.execute("PRAGMA query_only=ON")
        self._read_lock = threading.Lock()
        self._writer = 0  # the thread inside a write transaction (0: none)

    def _migrate(self) -> None:
        """Bring a store made by an older llamad up to this schema (columns added since
        get their defaults)."""
        for table, column, declaration in _ADDED_COLUMNS:
            columns = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        # After the columns: an older store has no document_date until just now. Serves
        # date filters and retention's oldest-first order (retrieval.store._history).
        self._db.execute("CREATE INDEX IF NOT EXISTS documents_source_date "
                         "ON documents(source_id, document_date, id)")
        # The copies of a text under several documents (copies_of, for search).
        self._db.execute("CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(content_hash)")
        # One index entry per text: before the triggers, a store made earlier names each
        # chunk's entry (its text's oldest holder).
        self._db.executescript(ENTRY_SCHEMA)
        self._db.execute(ENTRY_BACKFILL)

    def close(self) -> None:
        with self._read_lock:
            self._read_db.close()
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for a read of chunks: the writer's own inside its transaction
        (it reads what it wrote), else the reader connection, which sees the last commit
        and does not wait for a write transaction."""
        if self._writer == threading.get_ident():
            with self._lock:
                yield self._db
        else:
            with self._read_lock:
                yield self._read_db

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Hold the lock for one write transaction: ``BEGIN IMMEDIATE``, ``COMMIT`` when the
        block exits normally (a ``return`` too), rolled back when it or the commit raises."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._writer = threading.get_ident()
            try:
                self._clear_applied()
                yield
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back by itself (SQLITE_FULL, IOERR, ...): a second
                # ROLLBACK would raise "no transaction is active" over the real error.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            finally:
                self._writer = 0

    # -- meta --------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                             "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                             (key, value))

    # -- sources -----------------------------------------------------------------------

    def upsert_source(self, source: SourceRow) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO sources(id, kind, root, category, tags, created_at, "
                "review_required, max_age_days, max_items, exclude) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET kind = excluded.kind,"
                " root = excluded.root, category = excluded.category, tags = excluded.tags,"
                " review_required = excluded.review_required,"
                " max_age_days = excluded.max_age_days, max_items = excluded.max_items,"
                " exclude = excluded.exclude",
                (source.id, source.kind, source.root, source.category,
                 json.dumps(list(source.tags)), source.created_at or int(time.time()),
                 int(source.review_required), source.max_age_days, source.max_items,
                 json.dumps(list(source.exclude))),
            )

    def source(self, source_id: str) -> SourceRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM sources WHERE id = ?", (source_id,)).fetchone()
        return None if row is None else self._source(row)

    def sources(self) -> list[SourceRow]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM sources ORDER BY id").fetchall()
        return [self._source(r) for r in rows]

    def set_source_disabled(self, source_id: str, disabled: bool) -> bool:
        """Disable or enable a source; False when there is no such source."""
        with self._lock:
            cursor = self._db.execute("UPDATE sources SET disabled = ? WHERE id = ?",
                                      (int(disabled), source_id))
        return cursor.rowcount > 0

    def mark_scanned(self, source_id: str, error: str = "", excluded: int | None = None,
                     ) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE sources SET last_scan = ?, last_error = ?, "
                "excluded = coalesce(?, excluded) WHERE id = ?",
                (int(time.time()), error, excluded, source_id))

    def delete_source(self, source_id: str) -> list[int]:
        """Delete a source and its documents; return the removed chunk keys."""
        with self._transaction():
            keys = [int(r[0]) for r in self._db.execute(
                "SELECT c.key FROM chunks c JOIN documents d ON d.id = c.doc_id "
                "WHERE d.source_id = ?", (source_id,))]
            self._db.execute("DELETE FROM sources WHERE id = ?", (source_id,))
        return keys

    @staticmethod
    def _source(row: sqlite3.Row) -> SourceRow:
        return SourceRow(row["id"], row["kind"], row["root"], row["category"],
                         _tags(row["tags"]), row["created_at"], row["last_scan"],
                         row["last_error"], bool(row["disabled"]),
                         bool(row["review_required"]), int(row["max_age_days"]),
                         int(row["max_items"]), int(row["pruned"]),
                         _tags(row["exclude"]), int(row["excluded"]))

    # -- documents ---------------------------------------------------------------------

    @staticmethod
    def _document(row: sqlite3.Row) -> DocumentRow:
        return DocumentRow(row["id"], row["source_id"], row["path"], row["title"], row["kind"],
                           row["category"], _tags(row["tags"]), row["content_hash"],
                           row["mtime_ns"], row["size"], row["state"], row["error"],
                           row["indexed_at"], row["redactions"], row["document_date"],
                           row["review_note"])

    def document(self, doc_id: str) -> DocumentRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM documents WHERE id = ?", (doc_id,)).fetchone()
        return None if row is None else self._document(row)

    def documents(self, source_id: str | None = None) -> list[DocumentRow]:
        with self._lock:
            if source_id is None:
                rows = self._db.execute("SELECT * FROM documents ORDER BY id").fetchall()
            else:
                rows = self._db.execute("SELECT * FROM documents WHERE source_id = ? ORDER BY id",
                                        (source_id,)).fetchall()
        return [self._document(r) for r in rows]

    def document_counts(self, leaving_out: Sequence[str] = ()) -> dict[str, int]:
        """Documents per source id, as :meth:`documents` holds them, but for those of
        ``leaving_out`` (sources without any left out): counted by SQLite in one
        statement, not read row by row (Status and ListSources ask for this, operators
        every second or so during an ingest)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT source_id, COUNT(*) FROM documents WHERE id NOT IN "
                "(SELECT value FROM json_each(?)) GROUP BY source_id",
                (json.dumps(list(leaving_out)),)).fetchall()
        return {str(source): int(n) for source, n in rows}

    def set_state(self, doc: DocumentRow, state: str, error: str = "") -> None:
        """Record a document's pipeline state (creating the row if needed), chunks kept."""
        with self._lock:
            self._db.execute(
                "INSERT INTO documents(id, source_id, path, title, kind, category, tags, "
                "content_hash, mtime_ns, size, state, error) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET state = excluded.state, error = excluded.error",
                (doc.id, doc.source_id, doc.path, doc.title, doc.kind, doc.category,
                 json.dumps(list(doc.tags)), "", doc.mtime_ns, doc.size, state, error),
            )

    def replace_document(self, doc: DocumentRow, chunks: Sequence[ChunkRow]) -> Replacement:
        """Atomically make ``chunks`` the document's chunks and mark it indexed."""
        return self.replace_documents([(doc, chunks)])[0]

    def replace_documents(
        self,
        items: Sequence[tuple[DocumentRow, Sequence[ChunkRow]]],
        vectors: Sequence[tuple[str, dict[str, np.ndarray]]] = (),
    ) -> list[Replacement]:
        """Replace several documents' chunks (in order) and cache ``(model, vectors)``, all
        in one transaction: one fsync for the whole group (a group commit)."""
        with self._transaction():
            results = [self._replace(doc, chunks) for doc, chunks in items]
            for model, by_hash in vectors:
                self._put_vectors(model, by_hash)
        return results

    def _replace(self, doc: DocumentRow, chunks: Sequence[ChunkRow]) -> Replacement:
        result = Replacement()
        result.removed = [int(r[0]) for r in self._db.execute(
            "SELECT key FROM chunks WHERE doc_id = ?", (doc.id,))]
        self._db.execute("DELETE FROM chunks WHERE doc_id = ?", (doc.id,))
        # A version indexed now supersedes one held for review (an approval indexes it).
        self._db.execute("DELETE FROM held_documents WHERE doc_id = ?", (doc.id,))
        self._db.execute(
            INSERT_DOCUMENT + "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'indexed', '', ?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET source_id = excluded.source_id, "
            "path = excluded.path, title = excluded.title, kind = excluded.kind, "
            "category = excluded.category, tags = excluded.tags, "
            "content_hash = excluded.content_hash, mtime_ns = excluded.mtime_ns, "
            "size = excluded.size, state = 'indexed', error = '', "
            "indexed_at = excluded.indexed_at, redactions = excluded.redactions, "
            "document_date = excluded.document_date, review_note = excluded.review_note",
            (*document_head(doc), doc.indexed_at, doc.redactions, doc.document_date,
             doc.review_note),
        )
        for c in chunks:
            cur = self._db.execute(
                "INSERT INTO chunks(chunk_id, doc_id, ordinal, heading, text, "
                "content_hash) VALUES (?, ?, ?, ?, ?, ?)",
                (c.chunk_id, doc.id, c.ordinal, c.heading, c.text, c.content_hash))
            key = int(cur.lastrowid or 0)
            result.added.append(StoredChunk(
                key, c.chunk_id, doc.id, c.ordinal, c.heading, c.text, c.content_hash,
                doc.title, doc.source_id, doc.path, doc.kind, doc.category, doc.tags,
                doc.indexed_at, doc.mtime_ns, doc.document_date))
        return result

    def delete_document(self, doc_id: str) -> list[int] | None:
        """Delete a document; return its chunk keys, or None if it did not exist."""
        with self._transaction():
            if self._db.execute("SELECT 1 FROM documents WHERE id = ?",
                                (doc_id,)).fetchone() is None:
                return None  # commits an empty transaction: nothing was written
            keys = [int(r[0]) for r in self._db.execute(
                "SELECT key FROM chunks WHERE doc_id = ?", (doc_id,))]
            self._db.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
        return keys

    # -- chunks ------------------------------------------------------------------------

    _CHUNK_SELECT = (
        "SELECT c.key, c.chunk_id, c.doc_id, c.ordinal, c.heading, c.text, c.content_hash, "
        "d.title, d.source_id, d.path, d.kind, d.category, d.tags, d.indexed_at, d.mtime_ns, "
        "d.document_date "
        "FROM chunks c JOIN documents d ON d.id = c.doc_id"
    )

    @staticmethod
    def _chunk(r: sqlite3.Row) -> StoredChunk:
        return StoredChunk(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                           r[11], _tags(r[12]), r[13], int(r[14] or 0),
                           None if r[15] is None else int(r[15]))

    def _by_keys(self, select: str, keys: Iterable[int],
                 db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Row]:
        """The rows of ``select`` (ending in ``IN``) for ``keys``, 500 keys a statement
        (SQLite's limit on placeholders), on ``db`` (the writer's connection by default);
        the caller holds that connection's lock."""
        db = db or self._db
        wanted = list(keys)
        for i in range(0, len(wanted), 500):
            part = wanted[i:i + 500]
            yield from db.execute(f"{select} ({','.join('?' * len(part))})", part)

    def chunks_by_keys(self, keys: Iterable[int]) -> dict[int, StoredChunk]:
        with self._reading() as db:
            return {int(r[0]): self._chunk(r) for r in self._by_keys(
                f"{self._CHUNK_SELECT} WHERE c.key IN", keys, db)}

    def copies_of(self, hashes: Sequence[str], limit: int) -> dict[str, list[StoredChunk]]:
        with self._reading() as db:
            return {h: [self._chunk(r) for r in db.execute(
                f"{self._CHUNK_SELECT} WHERE c.content_hash = ? ORDER BY c.doc_id LIMIT ?",
                (h, limit))] for h in dict.fromkeys(hashes)}

    def chunk_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def chunk_hashes(self, keys: Iterable[int]) -> dict[int, str]:
        """Chunk key -> content hash, for the keys that exist (no text loaded)."""
        return self._chunk_column("content_hash", keys)

    def chunk_ids(self, keys: Iterable[int]) -> dict[int, str]:
        """Chunk key -> chunk id (the citation key), for the keys that exist."""
        return self._chunk_column("chunk_id", keys)

    def _chunk_column(self, column: str, keys: Iterable[int]) -> dict[int, str]:
        with self._lock:
            return {int(k): str(v) for k, v in self._by_keys(
                f"SELECT key, {column} FROM chunks WHERE key IN", keys)}  # noqa: S608 - a fixed column, placeholders

    def document_chunk_keys(self, doc_id: str) -> set[int]:
        """The chunk keys of one document."""
        with self._lock:
            return {int(r[0]) for r in self._db.execute(
                "SELECT key FROM chunks WHERE doc_id = ?", (doc_id,))}

    def chunk_keys(self) -> set[int]:
        with self._lock:
            return {int(r[0]) for r in self._db.execute("SELECT key FROM chunks")}

    def iter_chunks(self, batch: int = 1000) -> Iterator[list[StoredChunk]]:
        """Every chunk, in key order, in batches (for rebuilding derived indexes)."""
        last = 0
        while True:
            with self._lock:
                rows = self._db.execute(f"{self._CHUNK_SELECT} WHERE c.key > ? ORDER BY c.key "
                                        "LIMIT ?", (last, batch)).fetchall()
            if not rows:
                return
            chunks = [self._chunk(r) for r in rows]
            last = chunks[-1].key
            yield chunks

    def keys_matching(
        self,
        *,
        sources: Sequence[str] = (),
        kinds: Sequence[str] = (),
        categories: Sequence[str] = (),
        tags: Sequence[str] = (),
        since: int | None = None,
        until: int | None = None,
        dated_since: int | None = None,
        dated_until: int | None = None,
    ) -> set[int]:
        """Chunk keys whose document passes the filters (any-of within each kind;
        ``since``/``until`` bound when it was indexed, ``dated_since``/``dated_until`` its
        own date, which a document without one never passes)."""
        sql, args = self._matching(sources=sources, kinds=kinds, categories=categories,
                                   tags=tags, since=since, until=until,
                                   dated_since=dated_since, dated_until=dated_until)
        with self._lock:
            return {int(r[0]) for r in self._db.execute(
                "SELECT c.key FROM chunks c JOIN documents d ON d.id = c.doc_id"  # noqa: S608 - placeholders only
                + (f" WHERE {sql}" if sql else ""), args)}

    def entries_matching(self, f: Filters) -> dict[int, int]:
        """Entry key -> the holder a search under ``f`` shows, for the entries some holder
        of which ``f`` admits (``doc_ids`` aside: the dates are read here)."""
        return self.entries_admitted(*self._matching(
            sources=f.sources, kinds=f.kinds, categories=f.categories, tags=f.tags,
            since=f.since, until=f.until, dated_since=f.dated_since,
            dated_until=f.dated_until))

    @staticmethod
    def _matching(*, sources: Sequence[str], kinds: Sequence[str], categories: Sequence[str],
                  tags: Sequence[str], since: int | None, until: int | None,
                  dated_since: int | None, dated_until: int | None,
                  ) -> tuple[str, list[object]]:
        """The condition on ``d`` (a chunk's document) of :meth:`keys_matching`, and its
        arguments."""
        where: list[str] = []
        args: list[object] = []
        for column, values in (("d.source_id", sources), ("d.kind", kinds),
                               ("d.category", categories)):
            if values:
                where.append(f"{column} IN ({','.join('?' * len(values))})")
                args.extend(values)
        if tags:
            where.append("EXISTS (SELECT 1 FROM json_each(d.tags) t WHERE t.value IN "  # noqa: S608 - placeholders only
                         f"({','.join('?' * len(tags))}))")
            args.extend(tags)
        bounded(where, args, ("d.indexed_at >= ?", since), ("d.indexed_at <= ?", until),
                ("d.document_date >= ?", dated_since), ("d.document_date <= ?", dated_until))
        return " AND ".join(where), args

    # -- stats -------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._lock:
            docs = {str(r[0]): int(r[1]) for r in self._db.execute(
                "SELECT state, COUNT(*) FROM documents GROUP BY state")}
            chunks = int(self._db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])
            sources = int(self._db.execute("SELECT COUNT(*) FROM sources").fetchone()[0])
        return {"sources": sources, "chunks": chunks, **{f"documents_{k}": v
                                                         for k, v in docs.items()}}

