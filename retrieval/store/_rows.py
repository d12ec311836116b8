"""The rows both stores speak: sources, documents and chunks as every backend returns them
(the embedded store, :mod:`retrieval.store._metadata`, and the PostgreSQL one,
:mod:`retrieval.postgres._store`), and what a document's replacement changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SourceRow:
    """A source: a directory scanned, pushed documents, or history records."""

    id: str
    kind: str
    root: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    created_at: int = 0
    last_scan: int | None = None
    last_error: str = ""
    disabled: bool = False          # kept, but neither searched nor rescanned
    review_required: bool = False   # every new version waits in review_required
    max_age_days: int = 0           # history retention (0: unlimited)
    max_items: int = 0
    pruned: int = 0                 # records deleted by retention, ever
    exclude: tuple[str, ...] = ()   # a directory source's gitignore-style patterns
    excluded: int = 0               # files and directories its last scan left out by them


@dataclass(frozen=True)
class DocumentRow:
    """A document as stored: the searchable version's metadata and its state (a version
    held for review is read apart: ``held_version``)."""

    id: str
    source_id: str
    path: str = ""
    title: str = ""
    kind: str = "text"
    category: str = ""
    tags: tuple[str, ...] = ()
    content_hash: str = ""
    mtime_ns: int = 0
    size: int = 0
    state: str = "pending"
    error: str = ""
    indexed_at: int = 0
    redactions: int = 0
    document_date: int | None = None  # the document's own date, unix seconds
    review_note: str = ""


@dataclass(frozen=True)
class ChunkRow:
    """A chunk to store (``key`` is assigned by the store)."""

    chunk_id: str
    ordinal: int
    heading: str
    text: str
    content_hash: str


@dataclass(frozen=True)
class StoredChunk:
    """A stored chunk joined with its document, as search hits need it."""

    key: int
    chunk_id: str
    doc_id: str
    ordinal: int
    heading: str
    text: str
    content_hash: str
    title: str
    source_id: str
    path: str
    kind: str
    category: str
    tags: tuple[str, ...]
    indexed_at: int
    mtime_ns: int = 0               # the file's modification time (0: a pushed document)
    document_date: int | None = None  # the document's own date, unix seconds


@dataclass
class Replacement:
    """What a document replacement changed, for the derived indexes."""

    removed: list[int] = field(default_factory=list)
    added: list[StoredChunk] = field(default_factory=list)


@dataclass(frozen=True)
class PendingWrite:
    """A document ready to commit: its chunks and their vectors."""

    doc: DocumentRow
    rows: list[ChunkRow]
    model: str                          # the embedding model of the vectors ("" none)
    cached: dict[str, np.ndarray]       # by content hash, from the embedding cache
    fresh: dict[str, np.ndarray]        # embedded now; cached by this commit

    @property
    def has_vectors(self) -> bool:
        return bool(self.model and (self.cached or self.fresh))
