"""Hybrid retrieval: tantivy BM25 + hnswlib HNSW fused by RRF, over a SQLite source of truth.

This package never imports gRPC; the daemon maps :mod:`retrieval.errors` to status codes.
See docs/retrieval.md for the design.
"""

from ._bm25 import Filters
from ._embedder import Embedder
from ._group import Vector
from ._indexes import RetrievalStatus
from ._kinds import KINDS, kind_for
from ._limits import RetrievalLimits
from ._retriever import Retriever
from ._scan import ScanReport, check_root, scan_source
from ._search import Hit, SearchResult, snippet
from ._store import DocumentRow, SourceRow
from .errors import (
    ExtractionError,
    IndexCorrupt,
    InvalidDocument,
    NotFound,
    RetrievalError,
    SourceNotAllowed,
    StorageFull,
    is_storage_full,
    validate_document_id,
)

__all__ = [
    "KINDS",
    "DocumentRow",
    "Embedder",
    "ExtractionError",
    "Filters",
    "Hit",
    "IndexCorrupt",
    "InvalidDocument",
    "NotFound",
    "RetrievalError",
    "RetrievalLimits",
    "RetrievalStatus",
    "Retriever",
    "ScanReport",
    "SearchResult",
    "SourceNotAllowed",
    "SourceRow",
    "StorageFull",
    "Vector",
    "check_root",
    "is_storage_full",
    "kind_for",
    "scan_source",
    "snippet",
    "validate_document_id",
]
