"""The store interface: everything the retriever does with documents goes through it.

Two backends answer it, chosen in one place (:func:`retrieval._backend.backend`, from
``retrieval.store``):

* ``embedded`` (the default): :class:`~retrieval.store._indexes.Indexes`, SQLite as the truth
  with tantivy (BM25) and hnswlib (HNSW) derived from it, reconciled at open;
* ``postgres``: :class:`~retrieval.postgres._indexes.PgIndexes`, PostgreSQL + pgvector as the
  truth and the index in one transactional store, shared by several nodes.

:class:`StoreBackend` is the interface; :meth:`StoreBackend.require` gives its rows, a
:class:`DocumentStore`. The same rows come out of both
(:mod:`retrieval.store._rows`), and one contract suite (tests/integration/
test_store_contract.py) runs every member against both backends. Nothing above this
interface asks which backend it has.

Fusion (RRF, modes, weights; :mod:`retrieval.search._fusion`) stays above the interface, in
:mod:`retrieval.search._search`, and works on the ranks only: every backend fuses the same
way. The background backfill is each backend's own, behind one base class
(:class:`retrieval._backfill.BackfillRun`), built by the same factory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np

from ._status import RetrievalStatus
from .errors import StorageFull
from .store._bm25 import Filters
from .store._rows import DocumentRow, PendingWrite, SourceRow, StoredChunk

Ranked = list[tuple[int, float]]
"""A ranked list: ``(chunk key, score)`` best first (BM25 score; cosine distance)."""


class DocumentStore(Protocol):
    """The rows of a store: sources, documents (with versions held for review and history
    records), chunks and the embedding cache. Every call blocks (call it from a worker
    thread); a write is one transaction."""

    # -- sources

    def upsert_source(self, source: SourceRow) -> None:
        """Add a source, or update its settings (its documents stay)."""

    def source(self, source_id: str) -> SourceRow | None:
        """One source, or None."""

    def sources(self) -> list[SourceRow]:
        """Every source, by id."""

    def mark_scanned(self, source_id: str, error: str = "", excluded: int | None = None,
                     ) -> None:
        """Record that a source was scanned now (with the scan's error, if any, and, when
        given, how much its exclude patterns left out)."""

    # -- documents

    def document(self, doc_id: str) -> DocumentRow | None:
        """One document as stored (the searchable version's row), or None."""

    def documents(self, source_id: str | None = None) -> list[DocumentRow]:
        """Documents by id (of one source)."""

    def document_counts(self, leaving_out: Sequence[str] = ()) -> dict[str, int]:
        """Documents per source id, as :meth:`documents` holds them, but for the ids of
        ``leaving_out``; a source without any is left out. Counted by the database in
        one statement (one snapshot), not read row by row."""

    def set_state(self, doc: DocumentRow, state: str, error: str = "") -> None:
        """Record a document's state (making its row if it has none); chunks kept."""

    # -- chunks

    def chunks_by_keys(self, keys: Iterable[int]) -> dict[int, StoredChunk]:
        """The chunks of ``keys`` that exist, with their documents' fields."""

    def chunk_ids(self, keys: Iterable[int]) -> dict[int, str]:
        """Chunk key -> chunk id (the citation key), for the keys that exist."""

    def chunk_keys(self) -> set[int]:
        """Every chunk's key."""

    def document_chunk_keys(self, doc_id: str) -> set[int]:
        """The chunk keys of one document."""

    def keys_matching(self, *, sources: Sequence[str] = ()) -> set[int]:
        """The chunk keys of these sources' documents (every chunk's when none given)."""

    def copies_of(self, hashes: Sequence[str], limit: int) -> dict[str, list[StoredChunk]]:
        """The chunks holding each of these texts (content hashes), with their documents'
        fields, at most ``limit`` a text (by document id): the copies of a text under
        several documents (:mod:`retrieval.search._dedup`)."""

    def cached_vectors(self, model: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Vectors of ``model`` stored for these content hashes (those it has)."""

    # -- review: versions held for a reviewer (retrieval._review)

    def hold_document(self, doc: DocumentRow, text: str) -> None:
        """Hold a version with its text; the document shows ``review_required``."""

    def held_document(self, doc_id: str) -> tuple[DocumentRow, str] | None:
        """The version held for review with its text, or None."""

    def held_version(self, doc_id: str) -> DocumentRow | None:
        """The document as a reader sees it while a version is held, or None."""

    def held_documents(self, source_id: str | None = None) -> dict[str, DocumentRow]:
        """Every held version (of one source), by document id, as :meth:`held_version`."""

    def release_held(self, doc_id: str) -> None:
        """Drop the held version: the document is ``indexed`` as it was."""

    def reject_document(self, doc_id: str, note: str) -> list[int]:
        """Reject the held version: the document leaves search and shows ``rejected``;
        returns its chunk keys removed (for :meth:`StoreBackend.withdraw`)."""

    # -- history records (retrieval._retention)

    def expired_records(self, source_id: str, *, before: int | None, keep: int,
                        limit: int) -> list[str]:
        """Ids of a history source's records dated before ``before`` or beyond the
        newest ``keep`` (0: no bound), oldest first, at most ``limit``."""

    def prune_records(self, source_id: str, ids: list[str]) -> tuple[int, list[int]]:
        """Delete these records (counted in the source's ``pruned``); returns how many
        were deleted and their chunk keys (for :meth:`StoreBackend.withdraw`)."""


class StoreBackend(Protocol):
    """A store backend: its life cycle, its writes, its two ranked lists and its status.

    Methods named ``*_sync`` (and the ranked lists, :meth:`narrow` and
    :meth:`serving_model`) block: call them from a worker thread. :attr:`write` is this
    node's writer lock (the group committer batches under it)."""

    @property
    def kind(self) -> str:
        """``embedded`` or ``postgres`` (Status reports it)."""

    @property
    def write(self) -> asyncio.Lock:
        """This node's writer lock: the caller of :meth:`commit` holds it."""

    @property
    def commits_in_flight(self) -> int:
        """Group commits written at once: 1 (under :attr:`write`), or more for a store
        that orders concurrent writers itself, without :attr:`write`."""

    @property
    def repaired(self) -> dict[str, int]:
        """What the last open repaired, by kind (empty when nothing was)."""

    @property
    def vector_model(self) -> str:
        """The embedding model of the store's vectors as last seen ("" none yet)."""

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open_sync` ran and :meth:`close_sync` did not since."""

    # -- life cycle

    def open_sync(self) -> None:
        """Open (or create) the store."""

    def close_sync(self) -> None:
        """Close the store (each part even if another fails)."""

    def require(self) -> DocumentStore:
        """The rows.

        Raises:
            RetrievalError: the store is not open.
        """

    def storage_full(self) -> StorageFull:
        """The error for a write refused by a full disk, saying what to do."""

    async def flush(self) -> None:
        """Persist what is held in memory (the store stays consistent without it)."""

    async def catch_up(self) -> None:
        """Bring whatever a failed write left behind in line, before a new write."""

    # -- writes

    async def commit(self, batch: list[PendingWrite]) -> list[DocumentRow]:
        """Commit documents with their chunks and vectors together (the caller holds
        :attr:`write` when :attr:`commits_in_flight` is 1); returns them as committed
        (state ``indexed``)."""

    async def delete_document(self, doc_id: str) -> bool:
        """Remove a document from every index; False if it did not exist."""

    async def delete_source(self, source_id: str) -> list[int]:
        """Remove a source and its documents; returns the chunk keys removed.

        Raises:
            NotFound: the source does not exist.
        """

    async def withdraw(self, change: Callable[[], list[int]]) -> list[int]:
        """Run ``change`` (a transaction of the rows removing chunks, returning their
        keys), then remove those chunks from every index; returns the keys."""

    async def set_source_disabled(self, source_id: str, disabled: bool) -> bool:
        """Disable a source (kept, not searched) or enable it; False if unknown."""

    async def disabled(self, named: Sequence[str]) -> frozenset[str]:
        """The disabled sources a search must leave out itself: at least those of
        ``named`` disabled now (a backend may name every disabled source)."""

    # -- turns

    def try_scan_lock_sync(self, source_id: str) -> bool:
        """Take the source's scan turn; False while another node holds it."""

    def release_scan_lock_sync(self, source_id: str) -> None:
        """Give back the scan turn taken by :meth:`try_scan_lock_sync`."""

    def review_turn(self, doc_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """One review operation of a document at a time among the nodes, for the block."""

    # -- the ranked lists

    def narrow(self, filters: Filters) -> Filters:
        """``filters`` as both lists of this backend take them (bounds on documents' own
        dates turned into the documents that pass them where a list cannot read dates)."""

    def text_ranked(self, query: str, filters: Filters, limit: int) -> Ranked:
        """The lexical list, filters applied inside: ``(key, score)`` best first."""

    def serving_model(self) -> str:
        """The embedding model whose vectors :meth:`vector_ranked` searches now ("" none)."""

    def vector_ranked(self, model: str, vector: np.ndarray, filters: Filters,
                      limit: int) -> Ranked:
        """The vector list of ``model``'s vectors, filters applied inside:
        ``(key, cosine distance)`` nearest first.

        Raises:
            EmbeddingModelMismatch: the store's vectors are not ``model``'s (now).
        """

    # -- status

    async def sizes(self) -> tuple[int, int]:
        """``(chunks the lexical list ranks, vectors the vector list searches)``, cheaply
        (no count over every row; what a search's stats show), at most seconds old."""

    async def status(self, model: str, processing: int, pending: int = 0) -> RetrievalStatus:
        """Counts: ``embedded_chunks`` for ``model``; ``processing`` and ``pending``
        documents shown in those states."""
