"""Hybrid retrieval: tantivy BM25 + hnswlib HNSW fused by RRF, over a SQLite source of truth.

This package never imports gRPC; the daemon maps :mod:`retrieval.errors` to status codes.
Everything the daemon uses is here: the :class:`Retriever` facade and its limits, status
and hits; directory scans; extraction of pushed files (:func:`extract_bytes`,
:class:`ExtractLimits`); the redactor (:func:`redact`, also applied before prompt
assembly); document kinds; errors and id rules. See docs/retrieval.md for the design.
"""

from ._bm25 import Filters
from ._confine import SourceRoot, protected_hardlinks
from ._embedder import Embedder, EmbedderLookup, current_only
from ._extract import Extracted, ExtractLimits, extract_bytes, extract_file
from ._group import Vector
from ._indexes import BackfillStatus, RetrievalStatus, VectorRebuild
from ._kinds import KINDS, kind_for
from ._limits import RetrievalLimits
from ._redact import PLACEHOLDER_PREFIX, Redacted, redact
from ._retriever import Retriever
from ._scan import ScanReport, check_root, scan_source
from ._search import MODES, Hit, Query, SearchResult, snippet
from ._store import DocumentRow, SourceRow
from .errors import (
    Busy,
    ExtractionError,
    IndexCorrupt,
    InvalidDocument,
    NotFound,
    RetrievalError,
    SourceDisabled,
    SourceNotAllowed,
    StorageFull,
    VectorUnavailable,
    WrongState,
    is_storage_full,
    validate_document_id,
    validate_source_id,
)

__all__ = [
    "KINDS",
    "MODES",
    "PLACEHOLDER_PREFIX",
    "BackfillStatus",
    "Busy",
    "DocumentRow",
    "Embedder",
    "EmbedderLookup",
    "ExtractLimits",
    "Extracted",
    "ExtractionError",
    "Filters",
    "Hit",
    "IndexCorrupt",
    "InvalidDocument",
    "NotFound",
    "Query",
    "Redacted",
    "RetrievalError",
    "RetrievalLimits",
    "RetrievalStatus",
    "Retriever",
    "ScanReport",
    "SearchResult",
    "SourceDisabled",
    "SourceNotAllowed",
    "SourceRoot",
    "SourceRow",
    "StorageFull",
    "Vector",
    "VectorRebuild",
    "VectorUnavailable",
    "WrongState",
    "check_root",
    "current_only",
    "extract_bytes",
    "extract_file",
    "is_storage_full",
    "kind_for",
    "protected_hardlinks",
    "redact",
    "scan_source",
    "snippet",
    "validate_document_id",
    "validate_source_id",
]
