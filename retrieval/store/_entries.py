"""A text held by several documents is indexed once (issue 30): its *entry*.

Each document keeps its own chunk rows (id, ordinal, heading, metadata, review state);
the derived indexes (tantivy's BM25, hnswlib's vectors) hold one entry per content hash,
keyed by the chunk key of its *indexed holder*: the oldest chunk holding the text (the
smallest key; keys only grow). ``chunks.entry`` names it on every holder, kept by two
SQLite triggers in the transaction that inserts or deletes a chunk: a new holder takes
the existing entry, and deleting the indexed holder promotes the next oldest (or leaves
no holder). The same triggers record every content hash whose holders changed in
``entry_dirty``; after each write :class:`~retrieval.store._indexes.Indexes` rewrites
those entries in tantivy and hnswlib, and a crash before that leaves them dirty for the
reconciliation at open. Applied hashes are cleared at the start of the next write
transaction (no extra fsync per commit).

The tantivy entry carries the filter fields of *every* holder (multi-valued: sources,
kinds, categories, tags, dates, ids), so a filter that admits any holder finds the text;
the hit is then resolved to an admitted holder (:meth:`EntryStore.resolve`): the indexed
holder if the filter admits it, else the oldest holder it admits (both lists resolve
alike, so fusion sees one key). A multi-valued match can admit an entry no single holder
passes (one holder has the source, another the kind): :meth:`EntryStore.resolve` checks
each holder and drops it. BM25 statistics (document frequency, lengths) count the text
once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence

from ._bm25 import Filters, Holder, IndexedChunk
from ._rows import StoredChunk

ENTRY_SCHEMA = """
CREATE TABLE IF NOT EXISTS entry_dirty (content_hash TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS chunks_entry ON chunks(entry);
CREATE TRIGGER IF NOT EXISTS chunks_entry_insert AFTER INSERT ON chunks BEGIN
    UPDATE chunks SET entry = (SELECT min(key) FROM chunks
                               WHERE content_hash = new.content_hash)
        WHERE key = new.key;
    INSERT OR IGNORE INTO entry_dirty VALUES (new.content_hash);
END;
CREATE TRIGGER IF NOT EXISTS chunks_entry_delete AFTER DELETE ON chunks BEGIN
    UPDATE chunks SET entry = (SELECT min(key) FROM chunks
                               WHERE content_hash = old.content_hash)
        WHERE content_hash = old.content_hash AND entry = old.key;
    INSERT OR IGNORE INTO entry_dirty VALUES (old.content_hash);
END;
"""
"""Run after ``chunks.entry`` exists (a store made before it gains the column first)."""

ENTRY_BACKFILL = ("UPDATE chunks SET entry = (SELECT min(c.key) FROM chunks c "
                  "WHERE c.content_hash = chunks.content_hash) WHERE entry IS NULL")
"""A store made before entries: each chunk's entry is its text's oldest holder."""

TEXT_FORMAT = "2"
"""``meta.text_format``: the tantivy index holds one entry per text. A store whose index
holds a document per chunk (before) has it rebuilt at open: deleting the copies from it
would leave them in tantivy's statistics until its segments merge."""

_PART = 500  # SQLite's bound on placeholders, with room


def admits(f: Filters, c: StoredChunk) -> bool:
    """Whether ``f`` lets ``c`` be found (as both lists apply it inside)."""
    dated = c.document_date
    return ((not f.sources or c.source_id in f.sources)
            and (not f.kinds or c.kind in f.kinds)
            and (not f.categories or c.category in f.categories)
            and (not f.tags or any(t in f.tags for t in c.tags))
            and (f.since is None or c.indexed_at >= f.since)
            and (f.until is None or c.indexed_at <= f.until)
            and (f.dated_since is None or (dated is not None and dated >= f.dated_since))
            and (f.dated_until is None or (dated is not None and dated <= f.dated_until))
            and (f.doc_ids is None or c.doc_id in f.doc_ids))


def _parts(values: Iterable[object]) -> Iterator[list[object]]:
    wanted = list(values)
    for i in range(0, len(wanted), _PART):
        yield wanted[i:i + _PART]


def _marks(part: Sequence[object]) -> str:
    return ",".join("?" * len(part))


class EntryStore:
    """Entries' queries, for :class:`retrieval.store._metadata.Store` (which provides the
    connection, its lock, the row readers and the write transaction)."""

    _db: sqlite3.Connection
    _lock: threading.RLock
    _CHUNK_SELECT: str
    _applied: set[str]

    @staticmethod
    def _chunk(r: sqlite3.Row) -> StoredChunk:
        raise NotImplementedError

    @staticmethod
    def _tags_of(raw: str) -> tuple[str, ...]:
        raise NotImplementedError

    # -- keeping the indexes in line -------------------------------------------------

    def dirty_hashes(self) -> list[str]:
        """The texts whose holders changed since the indexes last took them."""
        with self._lock:
            return [str(r[0]) for r in self._db.execute(
                "SELECT content_hash FROM entry_dirty ORDER BY content_hash")]

    def applied(self, hashes: Iterable[str]) -> None:
        """The indexes took these texts: they leave ``entry_dirty`` with the next write
        transaction (:meth:`_clear_applied`), or stay dirty if none comes (the next open
        rewrites them again, which changes nothing)."""
        with self._lock:
            self._applied.update(hashes)

    def _clear_applied(self) -> None:
        """In a write transaction, before its own changes (which may dirty them again)."""
        if not self._applied:
            return
        for part in _parts(self._applied):
            self._db.execute(
                f"DELETE FROM entry_dirty WHERE content_hash IN ({_marks(part)})",  # noqa: S608 - placeholders only
                part)
        self._applied.clear()

    def entries(self, hashes: Iterable[str]) -> dict[str, IndexedChunk]:
        """The index entry of each text of ``hashes`` that has a holder: its indexed
        holder's key, title, heading and text, with every holder's filter fields."""
        holders: dict[str, list[Holder]] = {}
        keys: dict[str, int] = {}
        with self._lock:
            for part in _parts(hashes):
                for r in self._db.execute(
                        "SELECT c.content_hash, c.entry, c.doc_id, d.source_id, d.kind, "  # noqa: S608 - placeholders only
                        "d.category, d.tags, d.indexed_at FROM chunks c "
                        "JOIN documents d ON d.id = c.doc_id "
                        f"WHERE c.content_hash IN ({_marks(part)}) ORDER BY c.key", part):
                    digest = str(r[0])
                    keys.setdefault(digest, int(r[1]))
                    holders.setdefault(digest, []).append(
                        (r[2], r[3], r[4], r[5], self._tags_of(r[6]), int(r[7])))
            texts = {int(r[0]): self._chunk(r) for part in _parts(keys.values())
                     for r in self._db.execute(
                         f"{self._CHUNK_SELECT} WHERE c.key IN ({_marks(part)})", part)}
        out = {}
        for digest, key in keys.items():
            c = texts.get(key)
            if c is None:  # cannot happen in one read; skipped rather than indexed wrong
                continue
            out[digest] = IndexedChunk(
                key, c.doc_id, c.source_id, c.kind, c.category, c.tags, c.indexed_at,
                c.title, c.heading, c.text, also=tuple(holders[digest]))
        return out

    def entry_keys(self) -> set[int]:
        """Every entry's key (the indexed holders' chunk keys)."""
        with self._lock:
            return {int(r[0]) for r in self._db.execute(
                "SELECT key FROM chunks WHERE entry = key")}

    def shared_entries(self) -> set[int]:
        """The entries of texts more than one chunk holds."""
        with self._lock:
            return {int(r[0]) for r in self._db.execute(
                "SELECT entry FROM chunks GROUP BY entry HAVING count(*) > 1")}

    def entry_count(self) -> int:
        """Distinct texts stored (index entries)."""
        with self._lock:
            return int(self._db.execute(
                "SELECT COUNT(*) FROM chunks WHERE entry = key").fetchone()[0])

    def entry_hashes(self, keys: Iterable[int]) -> dict[int, str]:
        """Key -> content hash of those of ``keys`` that are entries."""
        with self._lock:
            return {int(k): str(h) for part in _parts(keys) for k, h in self._db.execute(
                "SELECT key, content_hash FROM chunks "  # noqa: S608 - placeholders only
                f"WHERE entry = key AND key IN ({_marks(part)})", part)}

    def entries_of(self, keys: Iterable[int]) -> set[int]:
        """The entries holding the texts of these chunks."""
        with self._lock:
            return {int(r[0]) for part in _parts(keys) for r in self._db.execute(
                f"SELECT DISTINCT entry FROM chunks WHERE key IN ({_marks(part)})",  # noqa: S608 - placeholders only
                part)}

    # -- search ------------------------------------------------------------------------

    def resolve(self, entries: Sequence[int], filters: Filters) -> dict[int, int]:
        """Entry key -> the holder a search under ``filters`` shows: the indexed holder
        if ``filters`` admit it, else the oldest holder they admit (entries no holder
        passes are left out). Texts are not read."""
        admitted: dict[int, int] = {}
        with self._lock:
            for part in _parts(entries):
                for r in self._db.execute(
                        f"{self._HOLDER_SELECT} WHERE c.entry IN ({_marks(part)}) "
                        "ORDER BY c.key", part):
                    entry, c = int(r[16]), self._chunk(r)
                    if admits(filters, c) and (entry not in admitted or c.key == entry):
                        admitted[entry] = c.key
        return admitted

    _HOLDER_SELECT = (
        "SELECT c.key, c.chunk_id, c.doc_id, c.ordinal, '', '', c.content_hash, "
        "'', d.source_id, d.path, d.kind, d.category, d.tags, d.indexed_at, d.mtime_ns, "
        "d.document_date, c.entry FROM chunks c JOIN documents d ON d.id = c.doc_id")

    def entries_admitted(self, where: str, args: Sequence[object]) -> dict[int, int]:
        """As :meth:`resolve`, for the chunks ``where`` selects (a condition on
        ``c`` and ``d``; every chunk when empty): entry key -> the holder shown."""
        sql = "SELECT c.entry, c.key FROM chunks c JOIN documents d ON d.id = c.doc_id"
        if where:
            sql += f" WHERE {where}"
        admitted: dict[int, int] = {}
        with self._lock:
            for entry, key in self._db.execute(sql, list(args)):
                shown = admitted.get(entry)  # the entry itself, else the oldest holder
                if shown is None or key == entry or (shown != entry and key < shown):
                    admitted[int(entry)] = int(key)
        return admitted
