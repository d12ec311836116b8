"""The store interface: everything the retriever does with documents goes through it.

Two backends answer it (``retrieval.store``):

* ``embedded`` (the default): :class:`~retrieval.store._indexes.Indexes`, SQLite as the truth
  with tantivy (BM25) and hnswlib (HNSW) derived from it, reconciled at open;
* ``postgres``: :class:`~retrieval.postgres._indexes.PgIndexes`, PostgreSQL + pgvector as the
  truth and the index in one transactional store, shared by several nodes.

Both offer the same calls, and the same rows come out of both stores
(:class:`~retrieval.store._metadata.SourceRow`, :class:`~retrieval.store._metadata.DocumentRow`,
:class:`~retrieval.store._metadata.StoredChunk`):

* life cycle: ``open_sync``, ``close_sync``, ``require`` (the document store), ``flush``,
  ``catch_up``, ``storage_full``; ``write`` (this node's writer lock);
* writes: ``commit`` (a batch of documents with their chunks and vectors, atomically),
  ``delete_document``, ``delete_source``, ``withdraw``;
* the two ranked lists, filters applied inside both: ``text_ranked`` (BM25, or
  ``ts_rank_cd`` on Postgres) and the vector list (hnswlib through ``vectors``, or
  ``vector_ranked`` on Postgres);
* sources and documents with their ingest states (through the document store), and
  ``status``.

Fusion (RRF, modes, weights; :mod:`retrieval.search._fusion`) stays above the interface, in
:mod:`retrieval.search._search`, and works on the ranks only: every backend fuses the same way.
The background backfill (and a switch of embedding model) is each backend's own
(:func:`backfill_for`: :mod:`retrieval._backfill`, :mod:`retrieval.postgres._backfill`), with
the same calls, and so are review holds (``review_turn``: one review operation of a
document at a time) and history retention (the stores' ``expired_records`` and
``prune_records``).
"""

from __future__ import annotations

from pathlib import Path

from ._backfill import Backfill
from ._embedder import EmbedderLookup, EmbedderProvider
from ._limits import RetrievalLimits
from .postgres._backfill import PgBackfill
from .postgres._connect import PgOptions
from .postgres._indexes import PgIndexes
from .store._indexes import Indexes

Backend = Indexes | PgIndexes
"""A store backend (see the module's docstring)."""

STORES = ("embedded", "postgres")
"""The values of ``retrieval.store``."""


def backend(root: Path, postgres: PgOptions | None) -> Backend:
    """The embedded backend in ``root``, or the PostgreSQL one when ``postgres`` is given
    (not opened yet: call ``open_sync``)."""
    return Indexes(root) if postgres is None else PgIndexes(root, postgres)


def backfill_for(store: Backend, embedder: EmbedderProvider, limits: RetrievalLimits,
                 embedder_for: EmbedderLookup | None = None) -> Backfill | PgBackfill:
    """The background backfill of ``store``'s backend (the same calls on both)."""
    if isinstance(store, Indexes):
        return Backfill(store, embedder, limits, embedder_for)
    return PgBackfill(store, embedder, limits, embedder_for)
