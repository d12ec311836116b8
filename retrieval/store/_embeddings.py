"""The metadata store's embedding cache: vectors by embedding model and content hash.

A text is embedded once per model: ingest, the backfill and a rebuild of the vector index
for another model read the vectors here (:meth:`EmbeddingCache.cached_vectors`) before
asking the embedding model. Kept apart from :mod:`retrieval.store._metadata` (its size):
these are its methods, on its connection and under its lock.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable

import numpy as np


class EmbeddingCache:
    """The ``embeddings`` table, for :class:`retrieval.store._metadata.Store` (which
    provides the connection and its lock)."""

    _db: sqlite3.Connection
    _lock: threading.RLock

    def cached_vectors(self, model: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        wanted = list(set(hashes))
        out: dict[str, np.ndarray] = {}
        with self._lock:
            for i in range(0, len(wanted), 500):
                part = wanted[i:i + 500]
                marks = ",".join("?" * len(part))
                for h, blob in self._db.execute(
                        f"SELECT content_hash, vector FROM embeddings WHERE model = ? "  # noqa: S608 - placeholders only
                        f"AND content_hash IN ({marks})", [model, *part]):
                    out[str(h)] = np.frombuffer(blob, dtype=np.float32)
        return out

    def put_vectors(self, model: str, vectors: dict[str, np.ndarray]) -> None:
        with self._lock:
            self._put_vectors(model, vectors)

    def _put_vectors(self, model: str, vectors: dict[str, np.ndarray]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO embeddings(model, content_hash, vector) VALUES (?, ?, ?)",
            [(model, h, np.asarray(v, dtype=np.float32).tobytes())
             for h, v in vectors.items()])

    # -- counts ------------------------------------------------------------------------

    def vector_models(self) -> dict[str, int]:
        """Embedding model -> how many vectors of it are cached."""
        with self._lock:
            return {str(m): int(n) for m, n in self._db.execute(
                "SELECT model, COUNT(*) FROM embeddings GROUP BY model")}

    def embedded_chunks(self, model: str) -> int:
        """Chunks whose text has a cached vector for ``model``."""
        with self._lock:
            return int(self._db.execute(
                "SELECT COUNT(*) FROM chunks c JOIN embeddings e ON e.content_hash = "
                "c.content_hash AND e.model = ?", (model,)).fetchone()[0])
