"""The factory of store backends: the one place that chooses a backend (``retrieval.store``)
and knows the classes behind the store interface (:mod:`retrieval._interface`).

It builds the store, the backfill that embeds its chunks in the background (each
backend's own: :mod:`retrieval._backfill`, :mod:`retrieval.postgres._backfill`) and, for the
embedded store, a handle on its indexes for tests and benches that look inside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._backfill import Backfill, BackfillRun
from ._embedder import EmbedderLookup, EmbedderProvider
from ._interface import StoreBackend
from ._limits import RetrievalLimits
from .postgres._backfill import PgBackfill
from .postgres._connect import PgOptions
from .postgres._indexes import PgIndexes
from .store._indexes import Indexes


@dataclass(frozen=True)
class Backend:
    """A store backend as the factory built it."""

    store: StoreBackend
    backfill: BackfillRun
    embedded: Indexes | None   # the embedded store's indexes (None: another backend)


def backend(root: Path, postgres: PgOptions | None, embedder: EmbedderProvider,
            limits: RetrievalLimits, embedder_for: EmbedderLookup | None = None) -> Backend:
    """The embedded backend in ``root``, or the PostgreSQL one when ``postgres`` is given
    (not opened yet: call ``open_sync``), with its backfill."""
    if postgres is None:
        indexes = Indexes(root)
        return Backend(indexes, Backfill(indexes, embedder, limits, embedder_for), indexes)
    shared = PgIndexes(root, postgres)
    return Backend(shared, PgBackfill(shared, embedder, limits, embedder_for), None)
