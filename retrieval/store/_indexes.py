"""The three stores and their crash consistency: invariant 7 lives here.

Invariant 7 (ARCHITECTURE.md): *acknowledged writes survive a crash; indexes on disk
are never left half-written.* SQLite (:mod:`retrieval.store._metadata`, ``synchronous=FULL``) is the
truth; tantivy (:mod:`retrieval.store._bm25`) and hnswlib (:mod:`retrieval.store._vectors`) are
derived from it. Every write follows one order, under one writer lock (tantivy allows one
writer per index directory):

1. SQLite transaction: the acknowledgement point (a group of documents, or a delete);
2. tantivy commit (durable and atomic: its ``meta.json`` is replaced in one rename);
3. hnswlib, in memory; saved on :meth:`Indexes.flush` and at close, written to a
   temporary file and renamed, so the file on disk is always a whole index.

A crash between those steps leaves SQLite ahead of the derived indexes: opening
(:meth:`Indexes.open_sync`) reconciles them from SQLite (whatever is missing is re-added
from stored text and cached vectors, whatever is extra is removed) and logs what it
repaired. A write that SQLite took and tantivy or hnswlib failed to (a full disk, say)
marks the indexes *behind*: the next write first runs the same reconciliation
(:meth:`Indexes.catch_up`).

Vectors of two embedding models never share an index: switching models
(:meth:`Indexes.use_vector_model_sync`) builds a fresh index of one model from the cached
vectors of every chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import structlog

from .._status import RetrievalStatus, documents_by_state
from ..errors import (
    EmbeddingModelMismatch,
    NotFound,
    StorageFull,
    StoreHolder,
    is_storage_full,
    opened,
)
from ._bm25 import Filters, IndexedChunk, TextIndex
from ._entries import TEXT_FORMAT
from ._history import dated_documents
from ._metadata import Store
from ._rows import DocumentRow, PendingWrite, Replacement
from ._vectors import VectorIndex

_log = structlog.get_logger("llamad.retrieval")


PAGE = 4096
"""Chunks read from SQLite at a time when an index is rebuilt or repaired: memory stays
flat as the corpus grows (all at once, 100k chunks held about 1 GB)."""
_PAGES_PER_COMMIT = 4
"""A start-up repair commits tantivy every this many pages, rather than once at the end."""


class Indexes(StoreHolder[Store]):
    """SQLite, tantivy and hnswlib in one directory (``root``), kept in agreement: the
    embedded backend of the store interface (:class:`retrieval._interface.StoreBackend`).

    Methods named ``*_sync`` block (call them from a worker thread with :attr:`write`
    held); the coroutines take :attr:`write` themselves unless they say otherwise.
    """

    kind = "embedded"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.write = asyncio.Lock()     # the one writer: every mutation of the indexes
        self.commits_in_flight = 1      # tantivy and hnswlib have one writer each
        self.store: Store | None = None
        self.text: TextIndex | None = None
        self.vectors: VectorIndex | None = None
        self.vector_model = ""          # the embedding model of ``vectors``
        self.disabled_sources: frozenset[str] = frozenset()  # kept, not searched
        self.vectors_dirty = False      # ``vectors`` has changes not saved yet
        self.repaired: dict[str, int] = {}   # what open() repaired (for Status)
        # Entries of texts several chunks hold: only their hits need resolving to a
        # holder a filter admits (a single holder's filter fields are exact in tantivy).
        self.shared: set[int] = set()
        # SQLite holds a write that tantivy or hnswlib failed to take (a full disk, say):
        # the next write first brings them in line (see catch_up).
        self.behind = False

    # -- life cycle --------------------------------------------------------------------

    def open_sync(self) -> None:
        """Open (or create) the stores and reconcile the derived ones from SQLite."""
        self.root.mkdir(parents=True, exist_ok=True)
        store = Store(self.root / "meta.sqlite3")
        rebuild = store.get_meta("text_format") != TEXT_FORMAT
        if rebuild:  # a text index of a chunk per copy (before entries): made anew
            shutil.rmtree(self.root / "bm25", ignore_errors=True)
        text = TextIndex(self.root / "bm25")
        self.vector_model = store.get_meta("vector_model") or ""
        self.disabled_sources = frozenset(s.id for s in store.sources() if s.disabled)
        dim = int(store.get_meta("vector_dim") or 0)
        vectors = VectorIndex(self.root / "vectors.hnsw", dim) if dim else None
        self.store, self.text, self.vectors = store, text, vectors
        self.repaired = self._reconcile()
        if rebuild:
            store.set_meta("text_format", TEXT_FORMAT)

    def _reconcile(self) -> dict[str, int]:
        """Make tantivy and hnswlib agree with SQLite (one entry per text, the holders of
        every text whose holders changed rewritten); log and return what was repaired."""
        store, text = self.require(), self._text()
        truth = store.entry_keys()
        in_text = text.keys()
        extra, missing = in_text - truth, truth - in_text
        if extra:
            text.delete_keys(extra)
        dirty = store.dirty_hashes()
        hashes = sorted(set(store.chunk_hashes(missing).values()) | set(dirty))
        for i in range(0, len(hashes), PAGE):  # page by page: texts held per page only
            text.add(list(store.entries(hashes[i:i + PAGE]).values()))
            if (i // PAGE) % _PAGES_PER_COMMIT == _PAGES_PER_COMMIT - 1:
                # Commit as it goes: tantivy's writer otherwise fills its whole memory
                # budget before flushing (~40 MB more at 100k chunks, measured).
                text.commit()
        if extra or hashes:
            text.commit()
        store.applied(dirty)
        self.shared = store.shared_entries()
        repaired = {"text_removed": len(extra), "text_added": len(missing)}
        if self.vectors is not None:
            in_vec = self.vectors.keys()
            v_extra = in_vec - truth
            if v_extra:
                self.vectors.delete(v_extra)
            v_missing = truth - in_vec
            added = self.add_cached_vectors(v_missing) if v_missing else 0
            if v_extra or added:
                self.vectors.save()
            repaired |= {"vectors_removed": len(v_extra), "vectors_added": added}
        repaired = {k: v for k, v in repaired.items() if v}
        if repaired:
            _log.warning("indexes repaired from SQLite", **repaired)
        return repaired

    def add_cached_vectors(self, keys: Iterable[int]) -> int:
        """Add to the vector index the cached vectors (of its model) of the chunks of
        ``keys``; return how many it added. Page by page: only ``page`` chunks' hashes
        and vectors are held at once, whatever the corpus size (no chunk text is read).
        ``PAGE`` chunks at a time.
        Blocking; the caller holds the writer lock (or is the start-up)."""
        store = self.require()
        if self.vectors is None or not self.vector_model:
            return 0
        ordered = sorted(keys)
        added = 0
        for i in range(0, len(ordered), PAGE):
            hashes = store.entry_hashes(ordered[i:i + PAGE])  # a text's vector: once
            cached = store.cached_vectors(self.vector_model, hashes.values())
            pairs = [(k, cached[h]) for k, h in hashes.items() if h in cached]
            if pairs:
                self.vectors.add([k for k, _ in pairs], np.stack([v for _, v in pairs]))
                added += len(pairs)
        return added

    def close_sync(self) -> None:
        """Close every store, each even if another fails (a full disk must not turn a
        clean shutdown into a crash). An unsaved vector index is no loss: the previous
        file is intact, and the next start re-adds what it lacks from SQLite's cache."""
        for what, close in (
                ("vector index not saved; the next start re-adds its vectors from SQLite",
                 self._save_vectors),
                ("text index not closed cleanly", self._text_close),
                ("metadata store not closed cleanly", self._store_close)):
            try:
                close()
            except Exception as exc:
                _log.warning(what, error=str(exc)[:300])
        self.store = self.text = self.vectors = None

    def _save_vectors(self) -> None:
        if self.vectors is not None and self.vectors_dirty:
            self.vectors.save()

    def _text_close(self) -> None:
        if self.text is not None:
            self.text.close()

    def _store_close(self) -> None:
        if self.store is not None:
            self.store.close()

    def _text(self) -> TextIndex:
        return opened(self.text)

    def storage_full(self) -> StorageFull:
        """The error for a write refused by a full disk, saying what to do."""
        return StorageFull(f"no space left on the disk holding the retrieval indexes "
                           f"({self.root}): free space, then retry; documents indexed "
                           "before are intact")

    async def flush(self) -> None:
        """Persist the vector index now (it is also saved on close).

        Waits for the writer lock; a cancelled caller may leave the save running in its
        thread (it completes, whole, or leaves the previous file).
        """
        async with self.write:
            if self.vectors is not None and self.vectors_dirty:
                await asyncio.to_thread(self.vectors.save)
                self.vectors_dirty = False

    # -- catching up -------------------------------------------------------------------

    def catch_up_sync(self) -> None:
        """After a failed write left SQLite ahead: bring tantivy and hnswlib in line (the
        start-up reconciliation, run again; :attr:`repaired` keeps the start-up's counts)."""
        self._reconcile()
        self.behind = False

    async def catch_up(self) -> None:
        """If a failed write left the indexes behind SQLite, reconcile them now (under the
        writer lock), before a new write is compared with what is indexed.

        Raises:
            StorageFull: the disk is still full.
        """
        if not self.behind:
            return
        async with self.write:
            try:
                if self.behind:
                    await asyncio.to_thread(self.catch_up_sync)
            except Exception as exc:
                if is_storage_full(exc):
                    raise self.storage_full() from exc
                raise

    # -- writing -----------------------------------------------------------------------

    async def commit(self, batch: list[PendingWrite]) -> list[DocumentRow]:
        """Commit documents together (the caller holds :attr:`write`): one SQLite
        transaction, one tantivy commit, one round of hnswlib updates.

        Returns the documents as committed (state ``indexed``) once SQLite has them. If
        tantivy or hnswlib then fail, the error is raised and the indexes are marked
        behind: SQLite keeps the batch, and the next write (or start) indexes it.
        Cancellation does not stop a step already running in its thread.
        """
        if self.behind:
            await asyncio.to_thread(self.catch_up_sync)
        now = int(time.time())
        docs = [dataclasses.replace(p.doc, state="indexed", indexed_at=now) for p in batch]
        replacements = await asyncio.to_thread(self._store_batch, docs, batch)
        try:
            await asyncio.to_thread(self._apply_batch, replacements, batch)
        except Exception:
            # SQLite (the truth) has the batch and tantivy or hnswlib does not: searches
            # may miss it until the next write has caught them up.
            self.behind = True
            raise
        return docs

    def _store_batch(self, docs: list[DocumentRow],
                     batch: list[PendingWrite]) -> list[Replacement]:
        store = self.require()
        fresh: dict[str, dict[str, np.ndarray]] = {}
        for p in batch:
            if p.fresh:
                fresh.setdefault(p.model, {}).update(p.fresh)
        replacements = store.replace_documents(
            [(d, p.rows) for d, p in zip(docs, batch, strict=True)], sorted(fresh.items()))
        if self.vectors is None:
            first = next((p for p in batch if p.has_vectors), None)
            if first is not None:
                dim = len(next(iter({**first.cached, **first.fresh}.values())))
                self.use_vector_model_sync(first.model, dim)
        return replacements

    def _apply_batch(self, replacements: list[Replacement],
                     batch: list[PendingWrite]) -> None:
        """The derived indexes follow SQLite: the chunks every replacement removed leave
        them, the texts whose holders changed are rewritten (:meth:`_apply`)."""
        removed = {key for r in replacements for key in r.removed}
        vectors: dict[str, np.ndarray] = {}
        for pending in batch:
            if pending.model == self.vector_model:
                vectors.update(pending.cached)
                vectors.update(pending.fresh)
        self._apply(sorted(removed), vectors)

    def _apply(self, removed: Sequence[int], vectors: dict[str, np.ndarray]) -> None:
        """After a SQLite write: drop the ``removed`` chunks from tantivy and hnswlib and
        rewrite each text whose holders changed (``entry_dirty``): its entry, keyed by
        its indexed holder, with every holder's filter fields; a text with no holder
        left is gone with its last chunk. ``vectors`` (by content hash) spare reading
        the cache. Blocking; the caller holds the writer lock."""
        store, text = self.require(), self._text()
        dirty = store.dirty_hashes()
        if removed:
            text.delete_keys(removed)
        entries: dict[str, IndexedChunk] = {}
        for i in range(0, len(dirty), PAGE):
            part = store.entries(dirty[i:i + PAGE])
            text.add(list(part.values()))  # replaces an entry of the same key
            entries.update(part)
        text.commit()
        self.shared.difference_update(removed)
        for e in entries.values():
            if len(e.also) > 1:
                self.shared.add(e.key)
            else:
                self.shared.discard(e.key)
        if self.vectors is not None:
            self.vectors.delete(removed)
            wanted = self.vectors.missing(e.key for e in entries.values())
            lacking = [h for h, e in entries.items() if e.key in wanted and h not in vectors]
            if lacking and self.vector_model:
                vectors = {**vectors, **store.cached_vectors(self.vector_model, lacking)}
            pairs = [(e.key, vectors[h]) for h, e in entries.items()
                     if e.key in wanted and h in vectors]
            if pairs:
                self.vectors.add([k for k, _ in pairs], np.stack([v for _, v in pairs]))
            self.vectors_dirty = True
        store.applied(dirty)

    def use_vector_model_sync(self, model: str, dim: int) -> None:
        """Make the vector index ``model``'s: a fresh index built from the cached vectors
        of every chunk (vectors of two models never share an index)."""
        store = self.require()
        if self.vectors is not None and self.vector_model == model:
            return
        path = self.root / "vectors.hnsw"
        for stale in (path, path.with_suffix(".hnsw.json")):
            stale.unlink(missing_ok=True)
        self.vectors = VectorIndex(path, dim)
        self.vector_model = model
        self.add_cached_vectors(store.entry_keys())
        self.vectors.save()
        store.set_meta("vector_model", model)
        store.set_meta("vector_dim", str(dim))

    def _drop_keys(self, keys: Sequence[int]) -> None:
        if keys:
            self._apply(keys, {})

    async def delete_document(self, doc_id: str) -> bool:
        """Remove a document from SQLite, then tantivy and hnswlib; False if it did not
        exist. Once SQLite's delete returned, a cancelled caller no longer stops it."""
        store = self.require()
        async with self.write:
            keys = await asyncio.to_thread(store.delete_document, doc_id)
            if keys is None:
                return False
            await asyncio.to_thread(self._drop_keys, keys)
        return True

    async def withdraw(self, change: Callable[[], list[int]]) -> list[int]:
        """Run ``change``, a SQLite transaction that removes chunks and returns their
        keys, then drop those keys from tantivy and hnswlib (the order of
        :meth:`delete_document`, under the writer lock); returns the keys."""
        self.require()
        async with self.write:
            keys = await asyncio.to_thread(change)
            await asyncio.to_thread(self._drop_keys, keys)
        return keys

    async def delete_source(self, source_id: str) -> list[int]:
        """Remove a source and its documents (as :meth:`delete_document`); return the
        chunk keys removed.

        Raises:
            NotFound: the source does not exist.
        """
        store = self.require()
        async with self.write:
            if await asyncio.to_thread(store.source, source_id) is None:
                raise NotFound(f"no source {source_id!r}")
            keys = await asyncio.to_thread(store.delete_source, source_id)
            self.disabled_sources -= {source_id}
            await asyncio.to_thread(self._drop_keys, keys)
        return keys

    async def set_source_disabled(self, source_id: str, disabled: bool) -> bool:
        """Disable or enable a source in SQLite, and in the set searches leave out
        (:meth:`disabled`); False when there is no such source."""
        store = self.require()
        if not await asyncio.to_thread(store.set_source_disabled, source_id, disabled):
            return False
        ids = self.disabled_sources
        self.disabled_sources = ids | {source_id} if disabled else ids - {source_id}
        return True

    async def disabled(self, named: Sequence[str]) -> frozenset[str]:
        """The disabled sources a search leaves out itself: here every one of them (the
        text and vector indexes do not know which are), whatever ``named``."""
        return self.disabled_sources

    def try_scan_lock_sync(self, source_id: str) -> bool:
        """Always True: one node owns an embedded store (the per-retriever scan lock of
        :mod:`retrieval._scan` serialises its own scans)."""
        return True

    def release_scan_lock_sync(self, source_id: str) -> None:
        """Nothing to release (see :meth:`try_scan_lock_sync`)."""

    @contextlib.asynccontextmanager
    async def review_turn(self, doc_id: str) -> AsyncIterator[None]:
        """Nothing to take: one node owns an embedded store (:mod:`retrieval._review`
        serialises its own review operations of a document)."""
        yield

    def narrow(self, filters: Filters) -> Filters:
        """``filters`` with bounds on the documents' own dates turned into the documents
        that pass them (tantivy does not index those dates). Blocking."""
        if filters.dated_since is None and filters.dated_until is None:
            return filters
        ids = dated_documents(self.require(), filters.dated_since, filters.dated_until)
        return dataclasses.replace(filters, doc_ids=frozenset(ids))

    def text_ranked(self, query: str, filters: Filters, limit: int
                    ) -> list[tuple[int, float]]:
        """The BM25 list (tantivy), filters applied inside: ``(key, score)``, each text
        once, under the holder the filters admit (:meth:`Store.resolve`). Blocking."""
        text = self._text()
        if filters == Filters():
            return text.search(query, filters=filters, limit=limit)
        # A quarter more when texts are shared: a hit whose holders pass the filters only
        # together (one the source, another the kind) is dropped, and seldom more.
        fetch = limit + limit // 4 if self.shared else limit
        while True:
            hits = text.search(query, filters=filters, limit=fetch)
            shared = self.shared
            shown = self.require().resolve([k for k, _ in hits if k in shared], filters)
            out = [(shown.get(key, key), score) for key, score in hits
                   if key in shown or key not in shared]
            # More were dropped: search deeper for what they displaced.
            if len(out) >= limit or len(hits) < fetch or fetch >= 8 * limit:
                return out[:limit]
            fetch *= 2

    def serving_model(self) -> str:
        """The model of the vector index ("" while there is none)."""
        return self.vector_model if self.vectors is not None else ""

    def vector_ranked(self, model: str, vector: np.ndarray, filters: Filters, limit: int
                      ) -> list[tuple[int, float]]:
        """The HNSW list of ``model``'s index, filters applied inside (as the keys of the
        chunks SQLite finds passing them): ``(key, cosine distance)``. Blocking.

        Raises:
            EmbeddingModelMismatch: the index is not ``model``'s (it was replaced since
                the query was embedded).
        """
        store = self.require()
        # Entry -> the holder shown: the entries some holder of which passes the filters.
        shown = None if filters == Filters() else store.entries_matching(filters)
        index = self.vectors
        if index is None or self.vector_model != model:
            raise EmbeddingModelMismatch("the vector index was replaced during the search")
        if shown is None:
            return index.search(vector, limit)
        return [(shown[key], dist)
                for key, dist in index.search(vector, limit, shown.__contains__)]

    # -- status ------------------------------------------------------------------------

    async def sizes(self) -> tuple[int, int]:
        """``(entries in the text index, live vectors in the vector index)``: tantivy's
        document count and the HNSW index's, read in memory (no SQLite)."""
        text, vectors = self.text, self.vectors
        return (text.count() if text is not None else 0,
                vectors.count() if vectors is not None else 0)

    async def status(self, model: str, processing: int, pending: int = 0) -> RetrievalStatus:
        """Counts from SQLite and the vector index (reads only; no writer lock).

        Args:
            model: the embedding model whose cached vectors ``embedded_chunks`` counts.
            processing: documents being processed now (SQLite keeps their last committed
                version): shown as state ``processing`` when there are any.
            pending: documents accepted to index in the background, not started yet.
        """
        store = self.require()
        counts = await asyncio.to_thread(store.counts)
        embedded = await asyncio.to_thread(store.embedded_chunks, model) if model else 0
        by_state = documents_by_state(counts, processing, pending)
        return RetrievalStatus(
            sources=counts["sources"], chunks=counts["chunks"], documents_by_state=by_state,
            embedding_model=self.vector_model, embedded_chunks=embedded,
            vectors=self.vectors.count() if self.vectors is not None else 0,
            disk_bytes=await asyncio.to_thread(self.disk_bytes),
            repaired=dict(self.repaired))

    def disk_bytes(self) -> int:
        """Bytes of every file under ``root``. Blocking.

        An ingest changes the directory while this reads it (tantivy merges segments and
        deletes the merged ones, SQLite's journals come and go): a file or directory gone
        between its listing and its size is not counted, never an error (Status polled
        during an ingest once failed INTERNAL with FileNotFoundError)."""
        return directory_bytes(self.root)


def directory_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (symbolic links not followed); files and
    directories removed while it walks are skipped (:func:`os.walk` ignores a directory
    it cannot list)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue  # removed since it was listed
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
