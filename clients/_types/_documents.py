"""What the knowledge-base calls return: documents, sources, reindex progress, search hits
and the retrieval index's status."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias

SearchMode: TypeAlias = Literal["hybrid", "text", "vector"]
"""Which indexes a search asks: both (fused), BM25 only or vectors only."""

DocumentState: TypeAlias = Literal["pending", "processing", "indexed", "failed",
                                   "review_required", "rejected"]
"""A document's state (:meth:`Client.list_documents` filters by it)."""


@dataclass(frozen=True, slots=True)
class Document:
    """A document in the retrieval index; ``state`` is ``pending``, ``processing``,
    ``indexed``, ``failed`` (then ``error`` says why), ``review_required`` (held until
    approved; a version indexed before stays searchable meanwhile) or ``rejected``."""

    id: str
    source_id: str
    title: str
    kind: str
    category: str
    tags: tuple[str, ...]
    state: str
    error: str
    indexed_at: datetime | None
    path: str
    redactions: int
    review_note: str = ""
    """The reviewer's note on this version (approve_document / reject_document)."""
    document_date: datetime | None = None
    """The document's own date: a history record's time, the caller's, a front-matter or
    metadata date (None when it has none)."""


@dataclass(frozen=True, slots=True)
class Source:
    """A source of documents: a ``directory`` to scan, ``push`` for pushed documents or
    ``history`` for pushed time-ordered records (kept within ``max_age_days`` and
    ``max_items``, 0: unlimited; ``pruned`` counts the records retention removed)."""

    id: str
    kind: str
    path: str
    category: str
    tags: tuple[str, ...]
    last_scan: datetime | None
    last_error: str
    documents: int
    disabled: bool = False
    """Kept, but neither searched nor rescanned."""
    review_required: bool = False
    """Every new or changed document waits in ``review_required`` until approved."""
    max_age_days: int = 0
    max_items: int = 0
    pruned: int = 0
    exclude: tuple[str, ...] = ()
    """A directory source's exclude patterns (gitignore-style)."""
    excluded: int = 0
    """Files and directories its last complete scan left out by them and the defaults."""


@dataclass(frozen=True, slots=True)
class FileIssue:
    """A file a reindex could not index (failed) or chose not to (skipped), and why."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class ReindexProgress:
    """Counts of a directory source's rescan so far; ``done`` on its last message.

    ``failed`` and ``skipped`` list the first files only (at most 100 each, so a message
    stays small); ``failed_total`` and ``skipped_total`` count them all. ``limit_reached``
    is non-empty when new files were not added because the source is at
    ``retrieval.max_files_per_source`` (or ``retrieval.max_source_mb``): it says which and
    how many; documents indexed before are all kept. ``excluded`` counts the files and
    directories the exclude patterns and the built-in defaults left out, unopened.
    """

    source_id: str
    seen: int
    added: int
    changed: int
    unchanged: int
    deleted: int
    failed: tuple[FileIssue, ...]
    skipped: tuple[FileIssue, ...]
    done: bool
    failed_total: int = 0
    skipped_total: int = 0
    limit_reached: str = ""
    excluded: int = 0


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One retrieved chunk. ``chunk_id`` (``"<document id>#<n>"``) is its citation key;
    ``search_source`` says which index found it: ``text``, ``vector`` or ``hybrid``.
    Ranks are 1-based; a rank and score are None when that index did not find it."""

    chunk_id: str
    document_id: str
    title: str
    source_id: str
    path: str
    heading: str
    text: str
    snippet: str
    search_source: str
    fused_score: float
    text_rank: int | None
    text_score: float | None
    vector_rank: int | None
    vector_score: float | None
    indexed_at: datetime | None
    score: float = 0.0
    """``fused_score`` normalised to [0, 1] (the cosine similarity in vector mode)."""
    kind: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    ordinal: int = 0
    """The chunk's place in its document, from 1."""
    modified_at: datetime | None = None
    """The file's modification time (None for a pushed document)."""
    other_chunk_ids: tuple[str, ...] = ()
    """With ``group_by_document``: the document's other matching chunks."""
    document_date: datetime | None = None
    """The document's own date (None when it has none)."""
    also_in: tuple[str, ...] = ()
    """The other documents that hold this text (the same text under several ids is one
    hit), best first, among those the search's filters admit."""


@dataclass(frozen=True, slots=True)
class SearchStats:
    """What a search did. ``text_chunks``/``vector_chunks``: what each list ranked among
    (the text index's chunks, the vector index's vectors; counted at most every 10 s);
    ``*_depth``: candidates asked of each list (0: it did not run); ``*_candidates``:
    those it gave; ``fused``: after fusion; ``stages_ms``: milliseconds by stage
    (``filters``, ``text``, ``embed``, ``vector``, ``fuse``, ``fetch``, ``total``)."""

    text_chunks: int = 0
    vector_chunks: int = 0
    text_depth: int = 0
    vector_depth: int = 0
    text_candidates: int = 0
    vector_candidates: int = 0
    fused: int = 0
    stages_ms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits, best first. ``mode`` is ``hybrid`` (BM25 and vectors), ``text`` (BM25 only:
    asked for, or e.g. with the embedding child down; ``warnings`` then says so) or
    ``vector`` (asked for)."""

    hits: tuple[SearchHit, ...]
    mode: str
    warnings: tuple[str, ...]
    vector_model: str = ""
    """The embedding model whose vectors answered ("" when no vector search ran): the
    previous model's while a rebuild for a new one runs and it is still available."""
    stats: SearchStats = field(default_factory=SearchStats)
    """How much it searched and how long it took."""


@dataclass(frozen=True, slots=True)
class VectorBackfill:
    """The background embedding of chunks without a vector of the current embedding
    model: whether it runs, for which model, chunks pending and done in the current (or
    last) run, chunks the model refused, and why the last run stopped early."""

    running: bool
    model: str
    pending: int
    done: int
    failed: int
    last_error: str


@dataclass(frozen=True, slots=True)
class VectorRebuild:
    """The vector index rebuilt after an embedding-model change (``model`` "" when none
    is due): whether a run rebuilds it now, the model it is rebuilt for, the previous
    model still answering searches meanwhile ("" : they are BM25-only), and chunks pending
    and done."""

    running: bool = False
    model: str = ""
    serving_model: str = ""
    pending: int = 0
    done: int = 0


@dataclass(frozen=True, slots=True)
class Reprocessed:
    """What a Reprocess started: the chunks its run embeds (0: none started, ``reason``
    says why)."""

    chunks: int
    reason: str


@dataclass(frozen=True, slots=True)
class RetrievalStatus:
    """Size and health of the retrieval index."""

    sources: int
    chunks: int
    documents_by_state: Mapping[str, int]
    embedded_chunks: int
    vectors: int
    embedding_model: str
    disk_bytes: int
    repaired: Mapping[str, int]
    source_list: tuple[Source, ...]
    backfill: VectorBackfill
    rebuild: VectorRebuild = VectorRebuild()
    pruned: int = 0
    """History records removed by retention since the daemon started."""
    store: str = "embedded"
    """The store backend: ``embedded`` (the daemon's own) or ``postgres`` (shared)."""
    lexical_ranking: str = ""
    """How the lexical list ranks: ``bm25`` (embedded) or ``ts_rank_cd`` (postgres)."""
    store_target: str = ""
    """postgres: the database, ``user@host:port/dbname`` (never a password)."""
