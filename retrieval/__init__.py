"""Hybrid retrieval: BM25 and HNSW lists fused by RRF, over a store backend: embedded
(SQLite + tantivy + hnswlib) or PostgreSQL + pgvector (``PgOptions``), shared by nodes.

This package never imports gRPC; the daemon maps :mod:`retrieval.errors` to status codes.
Everything the daemon uses is here: the :class:`Retriever` facade and its limits, status
and hits; directory scans; extraction of pushed files (:func:`extract_bytes`,
:class:`ExtractLimits`); the redactor (:func:`redact`, also applied before prompt
assembly); document kinds; errors and id rules. See docs/retrieval.md for the design.
"""

from ._embedder import Embedder, EmbedderLookup, current_only
from ._limits import RetrievalLimits
from ._migrate import Migration, MigrationRefused, migrate_store
from ._retriever import Retriever
from ._scan import check_root, scan_source
from ._scan_report import ScanReport
from ._status import BackfillStatus, RetrievalStatus, VectorRebuild
from ._watch import SourceWatcher
from .errors import (
    Busy,
    EmbeddingModelMismatch,
    ExtractionError,
    IndexCorrupt,
    InvalidDocument,
    NotFound,
    NotSupported,
    RetrievalError,
    SchemaTooNew,
    SourceChanged,
    SourceDisabled,
    SourceNotAllowed,
    StorageFull,
    StoreUnavailable,
    VectorUnavailable,
    WrongState,
    is_storage_full,
    validate_document_id,
    validate_source_id,
)
from .extraction._confine import SourceRoot, protected_hardlinks
from .extraction._exclude import DEFAULT_EXCLUDES, ExcludeError
from .extraction._exclude import check_patterns as check_exclude_patterns
from .extraction._extract import Extracted, ExtractLimits, extract_bytes, extract_file
from .extraction._kinds import KINDS, kind_for
from .postgres._connect import PgOptions, check_dsn
from .redaction._redactor import PLACEHOLDER_PREFIX, Redacted, redact
from .search._search import MODES, Hit, Query, SearchMode, SearchResult, snippet
from .store._bm25 import Filters
from .store._group import Vector
from .store._rows import DocumentRow, SourceRow

__all__ = [
    "DEFAULT_EXCLUDES",
    "KINDS",
    "MODES",
    "PLACEHOLDER_PREFIX",
    "BackfillStatus",
    "Busy",
    "DocumentRow",
    "Embedder",
    "EmbedderLookup",
    "EmbeddingModelMismatch",
    "ExcludeError",
    "ExtractLimits",
    "Extracted",
    "ExtractionError",
    "Filters",
    "Hit",
    "IndexCorrupt",
    "InvalidDocument",
    "Migration",
    "MigrationRefused",
    "NotFound",
    "NotSupported",
    "PgOptions",
    "Query",
    "Redacted",
    "RetrievalError",
    "RetrievalLimits",
    "RetrievalStatus",
    "Retriever",
    "ScanReport",
    "SchemaTooNew",
    "SearchMode",
    "SearchResult",
    "SourceChanged",
    "SourceDisabled",
    "SourceNotAllowed",
    "SourceRoot",
    "SourceRow",
    "SourceWatcher",
    "StorageFull",
    "StoreUnavailable",
    "Vector",
    "VectorRebuild",
    "VectorUnavailable",
    "WrongState",
    "check_dsn",
    "check_exclude_patterns",
    "check_root",
    "current_only",
    "extract_bytes",
    "extract_file",
    "is_storage_full",
    "kind_for",
    "migrate_store",
    "protected_hardlinks",
    "redact",
    "scan_source",
    "snippet",
    "validate_document_id",
    "validate_source_id",
]
