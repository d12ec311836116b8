"""The PostgreSQL backend behind the store interface (``retrieval.store = postgres``).

:class:`PgIndexes` answers the store interface (:class:`retrieval._interface.StoreBackend`),
as :class:`~retrieval.store._indexes.Indexes` does for the embedded backend, over one
:class:`~retrieval.postgres._store.PostgresStore`. Postgres is both the truth and the index:
there is no tantivy or hnswlib beside it, nothing to reconcile at open and nothing to
catch up after a failed write (a write is one transaction: all of it or none). Several
nodes may share the database: a document written through one is found by every other's
next search, a delete through one is gone for all.

The corpus is embedded with one model; a node embedding with another is refused with
:class:`~retrieval.errors.EmbeddingModelMismatch` (its searches are BM25-only) until the
corpus is switched to its model (:mod:`retrieval.postgres._backfill`: the backfill of chunks
without vectors, and the switch). Review holds are the store's
(:mod:`retrieval.postgres._review`; one review operation of a document at a time across
the nodes: :meth:`PgIndexes.review_turn`), and so is history retention
(:mod:`retrieval.postgres._history`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import structlog

from .._status import RetrievalStatus, documents_by_state
from ..errors import (
    EmbeddingModelMismatch,
    NotFound,
    NotSupported,
    StorageFull,
    StoreHolder,
)
from ..store._bm25 import Filters
from ..store._rows import DocumentRow, PendingWrite
from ._connect import PgOptions
from ._locks import review_lock_key, review_lock_name
from ._store import PgInfo, PostgresStore
from ._vectors import Space

BACKEND = "postgres"
REVIEW_LOCK_POLL = 0.05
"""Seconds between tries of a document's review lock another node holds."""

_log = structlog.get_logger("llamad.retrieval")


class PgDocumentStore(PostgresStore):
    """:class:`PostgresStore` with the few read calls the retriever makes of any store
    that the PostgreSQL store has no use of its own for."""

    def disabled_among(self, source_ids: Sequence[str]) -> frozenset[str]:
        """Those of ``source_ids`` that are disabled now (by any node)."""
        with self._conn() as conn:
            return frozenset(str(r[0]) for r in conn.execute(
                "SELECT id FROM sources WHERE disabled AND id = ANY(%s)", (list(source_ids),)))

    def chunk_ids(self, keys: Iterable[int]) -> dict[int, str]:
        """Chunk key -> chunk id (the citation key), for the keys that exist."""
        return {k: c.chunk_id for k, c in self.chunks_by_keys(keys).items()}


def not_supported(what: str) -> NotSupported:
    """The refusal of something the PostgreSQL backend cannot do yet."""
    return NotSupported(f"{what} is not supported with retrieval.store = postgres yet "
                        "(use the embedded store for it)")


class PgIndexes(StoreHolder[PgDocumentStore]):
    """The PostgreSQL store as the retriever's backend.

    Methods named ``*_sync`` block (call them from a worker thread); the coroutines run
    the store's calls in worker threads. :attr:`write` serialises this node's writes (the
    group committer batches under it); other nodes' writes are serialised by Postgres.
    """

    kind = BACKEND

    def __init__(self, root: Path, options: PgOptions) -> None:
        self.root = root
        self.options = options
        self.write = asyncio.Lock()
        # Postgres orders concurrent writers (as it does other nodes'): several batches
        # at once, each on its own connection, without the writer lock.
        self.commits_in_flight = max(1, options.commits_in_flight)
        self.store: PgDocumentStore | None = None
        self.vector_model = ""          # the corpus's embedding model once checked
        self.switch_model = ""          # the model the corpus is being switched to
        self.repaired: dict[str, int] = {}        # nothing is ever repaired
        self.behind = False
        self._info: PgInfo | None = None
        self._warned: set[tuple[str, str]] = set()  # (node model, corpus model) logged

    async def set_source_disabled(self, source_id: str, disabled: bool) -> bool:
        """Disable or enable a source, for every node (nothing is kept here: a disabled
        source is left out inside the SQL of both lists, as another node may disable it,
        or enable it again, at any moment); False when there is no such source."""
        store = self.require()
        return await asyncio.to_thread(store.set_source_disabled, source_id, disabled)

    async def disabled(self, named: Sequence[str]) -> frozenset[str]:
        """The disabled sources a search leaves out itself: those of ``named`` (the
        sources a search asked for by name) disabled now, by any node, so that it can say
        so. Every other disabled source is left out inside the SQL of both lists."""
        if not named:
            return frozenset()
        store = self.require()
        return await asyncio.to_thread(store.disabled_among, named)

    # -- life cycle --------------------------------------------------------------------

    def open_sync(self) -> None:
        """Connect, migrate, and read the corpus's embedding model.

        Raises:
            StoreUnavailable: the server cannot be used (the message says why).
            SchemaTooNew: the database was migrated by a newer llamad.
        """
        store = PgDocumentStore.open(self.options)
        self.store = store
        self._info = store.info()
        self.vector_model = self._info.corpus_model
        self.switch_model = self._info.switch_model

    def close_sync(self) -> None:
        """Release the scan locks and close the connections."""
        if self.store is not None:
            self.store.close()
        self.store = None

    def storage_full(self) -> StorageFull:
        """The error for a write refused by a full disk."""
        return StorageFull("the PostgreSQL server is out of disk space: free space on it, "
                           "then retry; documents indexed before are intact")

    async def flush(self) -> None:
        """Nothing to persist: Postgres has every acknowledged write."""

    async def catch_up(self) -> None:
        """Nothing to catch up: a write is one transaction."""

    # -- writing -----------------------------------------------------------------------

    async def commit(self, batch: list[PendingWrite]) -> list[DocumentRow]:
        """Commit documents together, their chunks and vectors in one transaction (the
        caller holds :attr:`write`); returns them as committed (state ``indexed``).

        Raises:
            EmbeddingModelMismatch: vectors of another model than the corpus's (nothing
                written; the message names both models).
            StoreUnavailable: the server was lost (nothing written).
        """
        now = int(time.time())
        docs = [dataclasses.replace(p.doc, state="indexed", indexed_at=now) for p in batch]
        await asyncio.to_thread(self._store_batch, docs, batch)
        return docs

    def _store_batch(self, docs: list[DocumentRow], batch: list[PendingWrite]) -> None:
        store = self.require()
        vectors: dict[str, dict[str, np.ndarray]] = {}
        for p in batch:
            if p.has_vectors:
                vectors.setdefault(p.model, {}).update(p.cached)
                vectors[p.model].update(p.fresh)
        for model, by_hash in sorted(vectors.items()):
            if model in (self.vector_model, self.switch_model):
                continue
            dim = len(next(iter(by_hash.values())))
            corpus, switch = self.spaces_sync()
            if switch is not None and switch.model == model:
                continue  # the model the corpus is being switched to: its space takes them
            try:
                store.use_embedding_model(model, dim)  # the first sets the corpus's
            except EmbeddingModelMismatch:
                self.model_mismatch(model, corpus.model if corpus is not None else "")
                raise
            self.vector_model = model
        try:
            store.replace_documents([(d, p.rows) for d, p in zip(docs, batch, strict=True)],
                                    sorted(vectors.items()))
        except EmbeddingModelMismatch:  # the corpus was switched meanwhile (by any node)
            corpus, _ = self.spaces_sync()
            for model in vectors:
                self.model_mismatch(model, corpus.model if corpus is not None else "")
            raise

    def spaces_sync(self) -> tuple[Space | None, Space | None]:
        """The corpus's vector space and the one it is being switched to, read now (and
        remembered in :attr:`vector_model` and :attr:`switch_model`). Blocking."""
        store = self.require()
        corpus, switch = store.spaces()
        self.vector_model = corpus.model if corpus is not None else ""
        self.switch_model = switch.model if switch is not None else ""
        return corpus, switch

    async def delete_document(self, doc_id: str) -> bool:
        """Delete a document with its chunks and vectors; False if it did not exist."""
        store = self.require()
        return await asyncio.to_thread(store.delete_document, doc_id) is not None

    async def withdraw(self, change: Callable[[], list[int]]) -> list[int]:
        """Run ``change`` (a transaction removing chunks); return the keys it removed."""
        self.require()
        return await asyncio.to_thread(change)

    async def delete_source(self, source_id: str) -> list[int]:
        """Remove a source and its documents; return the chunk keys removed.

        Raises:
            NotFound: the source does not exist.
        """
        store = self.require()
        if await asyncio.to_thread(store.source, source_id) is None:
            raise NotFound(f"no source {source_id!r}")
        return await asyncio.to_thread(store.delete_source, source_id)

    def model_mismatch(self, node_model: str, corpus_model: str) -> None:
        """Log, once per pair, that this node embeds with another model than the
        corpus's (its vectors are neither written nor searched)."""
        if (node_model, corpus_model) in self._warned:
            return
        self._warned.add((node_model, corpus_model))
        _log.warning("this node's embedding model is not the shared corpus's: its writes "
                     "are refused and its searches are BM25-only",
                     node_model=node_model, corpus_model=corpus_model,
                     store=self._info.target if self._info is not None else "")

    # -- one scanner per source ----------------------------------------------------------

    def try_scan_lock_sync(self, source_id: str) -> bool:
        """Take the source's scan lock unless another node holds it (released by
        :meth:`release_scan_lock_sync`, at close, or by this node's death). Blocking."""
        store = self.require()
        return store.try_scan_lock(source_id)

    def release_scan_lock_sync(self, source_id: str) -> None:
        store = self.require()
        store.release_scan_lock(source_id)

    @contextlib.asynccontextmanager
    async def review_turn(self, doc_id: str) -> AsyncIterator[None]:
        """One review operation (hold, approve, reject) of a document at a time across
        the nodes, for the block: its session advisory lock, polled every
        :data:`REVIEW_LOCK_POLL` seconds while another node holds it (released after the
        block, or by the server when this node dies)."""
        store = self.require()
        name, key = review_lock_name(doc_id), review_lock_key(doc_id)
        # Polled: the holder is another process, which no event here can announce.
        while True:
            if await asyncio.to_thread(store.try_lock, name, key):
                break
            await asyncio.sleep(REVIEW_LOCK_POLL)
        try:
            yield
        finally:
            # Released at once, on the event loop (one short statement): awaiting a
            # thread here would let a caller see the operation's document between the
            # states it had (a background push shown pending again after processing).
            store.release_lock(name, key)

    # -- the ranked lists --------------------------------------------------------------

    def narrow(self, filters: Filters) -> Filters:
        """``filters`` unchanged: both lists filter on the documents' dates in SQL."""
        return filters

    def text_ranked(self, query: str, filters: Filters, limit: int
                    ) -> list[tuple[int, float]]:
        """The lexical list (``ts_rank_cd``), filters inside the SQL. Blocking."""
        store = self.require()
        return store.text_search(query, filters=filters, limit=limit)

    def serving_model(self) -> str:
        """The corpus's embedding model, read now ("" before the first vector; the model
        it is being switched to is read too: :attr:`switch_model`). Blocking."""
        self.spaces_sync()
        return self.vector_model

    def vector_ranked(self, model: str, vector: np.ndarray, filters: Filters, limit: int
                      ) -> list[tuple[int, float]]:
        """The vector list of ``model``'s space (the corpus's), filters inside the SQL:
        ``(key, cosine distance)``. Blocking.

        Raises:
            EmbeddingModelMismatch: ``model`` is not the corpus's.
        """
        store = self.require()
        return store.vector_search(model, vector, filters=filters, limit=limit)

    # -- status ------------------------------------------------------------------------

    async def sizes(self) -> tuple[int, int]:
        """``(chunks, the corpus model's vectors)``, cheaply (``PostgresStore.sizes``)."""
        return await asyncio.to_thread(self.require().sizes)

    async def status(self, model: str, processing: int, pending: int = 0) -> RetrievalStatus:
        """Counts from Postgres (as the embedded backend's; ``vectors`` counts the
        corpus model's, ``disk_bytes`` is 0: the server's disk is not this node's)."""
        store = self.require()
        counts = await asyncio.to_thread(store.counts)
        info = await asyncio.to_thread(store.info)
        self.vector_model, self.switch_model = info.corpus_model, info.switch_model
        embedded = await asyncio.to_thread(store.embedded_chunks, model) if model else 0
        vectors = (embedded if model == info.corpus_model else await asyncio.to_thread(
            store.embedded_chunks, info.corpus_model)) if info.corpus_model else 0
        by_state = documents_by_state(counts, processing, pending)
        return RetrievalStatus(
            sources=counts["sources"], chunks=counts["chunks"], documents_by_state=by_state,
            embedding_model=info.corpus_model, embedded_chunks=embedded, vectors=vectors,
            disk_bytes=0, repaired={}, store=BACKEND, lexical_ranking=info.lexical_ranking,
            store_target=info.target)
