"""What the client returns: frozen dataclasses, not protobuf messages.

Enumerations become short lower-case strings (``"running"``, ``"hybrid"``,
``"generation"``); an enum value this client does not know becomes ``"unknown(N)"``
rather than an error, so an older client keeps working against a newer daemon.
Timestamps become timezone-aware :class:`datetime.datetime` objects, or None when unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    from ._models import ModelInfo

__all__ = [
    "AskDone",
    "AskEvent",
    "AskResult",
    "AskSources",
    "AskText",
    "ChildStatus",
    "Citation",
    "DaemonStatus",
    "Document",
    "DocumentState",
    "Embeddings",
    "ExitCause",
    "FileIssue",
    "GenerateChunk",
    "GenerateResult",
    "LogLine",
    "Message",
    "Mode",
    "ReindexProgress",
    "Reprocessed",
    "RetrievalStatus",
    "Role",
    "SearchHit",
    "SearchMode",
    "SearchResult",
    "Source",
    "SwapInfo",
    "SwapProgress",
    "Task",
    "TokenLogprob",
    "TokenLogprobs",
    "Tokens",
    "Usage",
    "VectorBackfill",
    "VectorRebuild",
]

Role: TypeAlias = Literal["generation", "embedding"]
"""A supervised child: the generation or the embedding model."""

ChatRole: TypeAlias = Literal["system", "user", "assistant"]

Mode: TypeAlias = Literal["embedded", "endpoint", "disabled"]
"""Where a role's inference runs: a supervised llama.cpp child, an external
OpenAI-compatible endpoint, or nowhere."""

Task: TypeAlias = Literal["answer", "explain_output", "diagnose", "summarize"]
SearchMode: TypeAlias = Literal["hybrid", "text", "vector"]
"""What :meth:`Client.ask` should do with the question (and attachment)."""
DocumentState: TypeAlias = Literal["pending", "processing", "indexed", "failed",
                                   "review_required", "rejected"]
"""A document's state (:meth:`Client.list_documents` filters by it)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message (or one turn of Ask's history)."""

    role: ChatRole
    content: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and speed of one generation, measured by the daemon."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    time_to_first_token_ms: float = 0.0
    tokens_per_second: float = 0.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token and its log-probability (natural log); ``id`` when the runtime reports
    it (llama.cpp does)."""

    token: str
    logprob: float
    bytes: bytes = b""
    id: int | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A generated token (``chosen``) and the likeliest alternatives (``top``, at most
    ``top_logprobs`` of them, likeliest first)."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    """A piece of generated text, as the model produced it.

    The last chunk of a stream has ``finish_reason`` (``"stop"`` or ``"length"``) and
    ``usage``; earlier ones have None for both. ``logprobs`` has the chunk's tokens when
    the call asked for them (``logprobs=True``).
    """

    text: str
    tokens: int
    model: str
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A whole generation: the concatenated text, why it ended, its usage, and every
    token's logprobs when the call asked for them."""

    text: str
    model: str
    finish_reason: str
    usage: Usage
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One vector per input text, in order."""

    vectors: tuple[tuple[float, ...], ...]
    model: str
    dimension: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token ids of a text, from the chosen model's own tokenizer."""

    ids: tuple[int, ...]
    count: int
    model: str


@dataclass(frozen=True, slots=True)
class ExitCause:
    """Why a child process ended (``kind`` is e.g. ``crash``, ``oom``, ``model_error``)."""

    kind: str
    message: str = ""
    exit_code: int | None = None
    signal: str = ""
    permanent: bool = False
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SwapInfo:
    """The last model swap of a child."""

    from_model: str
    to_model: str
    at: datetime | None
    reason: str
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class ChildStatus:
    """A snapshot of one role's child (or endpoint).

    ``state`` is one of ``idle``, ``starting``, ``running``, ``backoff``, ``failed``,
    ``stopped``; ``breaker`` is ``closed`` or ``open``; ``mode`` is ``embedded``,
    ``endpoint`` or ``disabled`` (in endpoint mode no process is described: pid, socket and
    the model fields are empty, ``runtime`` is ``endpoint``). ``socket`` is the child's
    private UNIX socket (``port`` is always 0: no child listens on TCP). ``last_error`` is the
    role's latest failure in words (empty once it serves again after a switch).
    ``chat_template`` (generation children) says which chat template Chat and Ask are
    formatted with and why: the model's own, a known one, or ``none: ...`` (refused).
    ``in_flight`` counts calls sent to the child: up to ``slots`` running plus
    ``queue_ahead`` waiting in the child's own queue; ``queued`` wait in llamad.
    """

    role: str
    state: str
    enabled: bool
    pid: int
    model_path: str
    model_sha256: str
    runtime: str
    port: int
    uptime_seconds: float
    restarts: int
    breaker: str
    consecutive_failures: int
    last_exit: ExitCause | None
    model_architecture: str
    model_context_length: int
    previous_model_path: str
    last_swap: SwapInfo | None
    in_flight: int
    queued: int
    slots: int
    mode: str = "embedded"
    endpoint_url: str = ""
    endpoint_model: str = ""
    last_error: str = ""
    queue_ahead: int = 0
    chat_template: str = ""
    socket: str = ""


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """Every child's status, the daemon's version and uptime, and whether it drains (for
    shutdown) or is drained (by :meth:`~clients.Client.set_draining`)."""

    children: tuple[ChildStatus, ...]
    version: str
    uptime_seconds: float
    draining: bool
    drained: bool = False
    models: tuple[ModelInfo, ...] = ()  # every catalog model, as ListModels lists them

    def child(self, role: str) -> ChildStatus | None:
        """The child with this role (``"generation"`` or ``"embedding"``), or None."""
        return next((c for c in self.children if c.role == role), None)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One output line of a child, from the daemon's ring buffer."""

    role: str
    pid: int
    stream: str
    text: str
    time: datetime | None
    seq: int


@dataclass(frozen=True, slots=True)
class SwapProgress:
    """One stage of a swap: ``validating``, ``launching``, ``loading``, ``probing``,
    ``swapping``, ``draining``, ``done`` or ``failed`` (then ``cause`` says why)."""

    stage: str
    message: str
    elapsed_seconds: float
    cause: ExitCause | None = None


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
    how many; documents indexed before are all kept.
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


@dataclass(frozen=True, slots=True)
class Citation:
    """A source an answer was given, labelled ``S1``, ``S2``, ... in rank order."""

    label: str
    chunk_id: str
    document_id: str
    title: str
    path: str
    score: float
    snippet: str
    search_source: str = ""
    """Which index found it: ``text``, ``vector`` or ``hybrid``."""
    indexed_at: datetime | None = None
    document_date: datetime | None = None
    """The document's own date (None when it has none)."""
    kind: str = ""
    source_id: str = ""


@dataclass(frozen=True, slots=True)
class AskText:
    """A piece of the answer, as generated."""

    text: str


@dataclass(frozen=True, slots=True)
class AskSources:
    """The sources the answer was grounded on (sent after the text)."""

    citations: tuple[Citation, ...]
    retrieval_mode: str
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AskDone:
    """The end of an answer: usage, the prompt's SHA-256, cache and budget facts."""

    usage: Usage
    prompt_sha256: str
    cached: bool
    no_context: bool
    finish_reason: str
    chunks_dropped: int
    attachment_clipped: bool
    template_version: str
    model_name: str = ""  # the catalog name of the model that answered ("": none ran)


AskEvent: TypeAlias = AskText | AskSources | AskDone
"""What an Ask stream yields: text events, then one AskSources, then one AskDone."""


@dataclass(frozen=True, slots=True)
class AskResult:
    """A whole answer: its text, the sources it cites, and the summary."""

    answer: str
    sources: AskSources | None
    done: AskDone | None

    @property
    def citations(self) -> tuple[Citation, ...]:
        """The cited sources (empty when nothing relevant was retrieved)."""
        return self.sources.citations if self.sources is not None else ()
