"""``[retrieval]``: the options of the retrieval core (limits, schedules) and of its store
(``store = embedded`` or ``postgres`` with its connection), a section of
:class:`~daemon.config._sections.Settings` declared apart to keep that module short.

The limits' defaults are also :class:`retrieval.RetrievalLimits`' (the core does not import
the daemon); tests/unit/test_config_retrieval_limits.py ties the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from retrieval import StoreUnavailable, check_dsn

from ._options import ConfigError, Reload, setting

STORES = ("embedded", "postgres")
FUSIONS = ("rrf", "dbsf", "convex")  # retrieval.search._score_fusion.FUSIONS
CHUNK_UNITS = ("characters", "tokens")  # retrieval._sizing.CHUNK_UNITS
LEXICAL_RANKERS = ("auto", "pg_textsearch", "pg_search", "bm25-sql")  # retrieval.postgres._rankers
"""The values of ``retrieval.store``."""


@dataclass(frozen=True)
class RetrievalSettings:
    """``[retrieval]``: its limits apply to the ingests, scans and searches that start
    after a reload; the embedding batcher, the group commit and the rescan and backfill
    schedules keep theirs until a restart."""

    RELOAD: ClassVar[Reload] = "apply"

    enabled: bool = setting(True, reload="restart", help="""
        Serve RetrievalService (ingest and search).""")
    allowed_roots: tuple[str, ...] = setting((), help="""
        Absolute directories that directory sources must lie under (symlinks and .. resolved);
        several are separated by ':' in a flag or env. Empty: directory sources are refused.""")
    chunk_size: int = setting(1200, minimum=200, help="Target chunk size, in chunk_unit.")
    chunk_overlap: int = setting(200, minimum=0, help="Overlap between chunks, in chunk_unit.")
    chunk_unit: str = setting("characters", choices=CHUNK_UNITS, help="""
        What chunk_size and chunk_overlap count: characters, or tokens of the embedding model
        (counted by its tokenizer; a chunk then has at most chunk_size tokens, and
        max_chunk_chars is raised to the size in characters where it is below). Applies to
        documents indexed afterwards.""")
    max_chunk_chars: int = setting(2000, minimum=200, help="Hard cap of a chunk, characters.")
    embed_batch: int = setting(32, minimum=1, reload="restart", help="Texts per embedding request.")
    embed_concurrency: int = setting(2, minimum=1, reload="restart", help="""
        Embedding requests ingest keeps in flight (the embedding child's slots).""")
    ingest_workers: int = setting(128, minimum=1, help="""
        Files of a directory scan in flight at once (their chunks share embedding requests of up
        to embed_batch texts, their writes share commits): enough small files that embedding
        requests fill up.""")
    ingest_inflight_mb: int = setting(64, minimum=1, help="""
        File bytes a directory scan has in flight at once, MiB (bounds its memory whatever
        ingest_workers is; one file larger than this goes alone).""")
    max_pending_upserts: int = setting(1000, minimum=1, help="""
        Documents pushed with wait=false that may wait to be indexed at once; beyond,
        UpsertDocument is RESOURCE_EXHAUSTED.""")
    max_commit_batch: int = setting(256, minimum=1, reload="restart", help="""
        Most documents one group commit writes (concurrent ingests share commits).""")
    query_embed_timeout: float = setting(5.0, minimum=0.1, help="""
        Seconds a search waits for its query's embedding before answering BM25-only.""")
    # 100/100 beats 25/25 by +0.011 mean nDCG@10 (bench/RESULTS.md, Fusion weights and depth);
    # dbsf 0.4/0.6 beats plain RRF on every collection left out, nDCG@10 averaged over five
    # ingest orders (Fusion by leaving one collection out; retrieval/_limits.py)
    text_candidates: int = setting(100, minimum=1, help="BM25 candidates fused per search.")
    vector_candidates: int = setting(100, minimum=1, help="HNSW candidates fused per search.")
    max_candidates: int = setting(200, minimum=1, help="""
        Most candidates a search may ask each index for (SearchRequest.candidates).""")
    search_threads: int = setting(4, minimum=1, reload="restart", help="""
        Threads a search's index and store reads run on, its own: a search never waits in
        a queue behind an ingest's thread work (chunking, file reads, commits).""")
    max_also_in: int = setting(50, minimum=0, help="""
        The same text under several documents is one search hit naming the others (also_in):
        at most this many copies of a hit's text are read to name them (those the search's
        filters admit are named).""")
    rrf_k: int = setting(60, minimum=1, help="Reciprocal Rank Fusion constant k.")
    fusion: str = setting("dbsf", choices=FUSIONS, help="""
        How a hybrid search fuses its two lists: rrf (reciprocal ranks), dbsf (each list's
        scores normalised by its mean and 3 standard deviations, then summed) or convex (min-max
        normalised scores, summed); text_weight and vector_weight weigh the lists in each.""")
    text_weight: float = setting(0.4, minimum=0, help="""
        Weight of the BM25 list in the fusion (with rrf, 1 and 1: plain RRF).""")
    vector_weight: float = setting(0.6, minimum=0, help="""
        Weight of the vector list in the fusion.""")
    default_k: int = setting(5, minimum=1, help="Hits returned when a search asks for none.")
    max_k: int = setting(20, minimum=1, help="""
        Most hits a search returns (a larger top_k is clamped to it, with a warning).""")
    max_query_chars: int = setting(2000, minimum=1, help="Longest search query, characters.")
    max_document_chars: int = setting(5_000_000, minimum=1, help="""
        Longest document text (after extraction), characters.""")
    max_file_mb: int = setting(20, minimum=1, help="Largest file a scan reads, MiB.")
    max_files_per_source: int = setting(20000, minimum=1, help="""
        Documents a directory source holds: past it a scan adds no new file (and says so); none
        indexed is dropped, and skipped files take no room.""")
    max_source_mb: int = setting(2048, minimum=1, help="""
        File bytes a directory source holds, MiB: past it a scan adds no new file (and says so);
        none indexed is dropped.""")
    pdf_timeout: float = setting(30.0, minimum=1, help="Seconds to extract one PDF.")
    pdf_max_pages: int = setting(2000, minimum=1, help="Most pages a PDF may have.")
    pdf_max_memory_mb: int = setting(1024, minimum=64, help="""
        Address space of the process that parses a PDF, MiB (bounds decompression bombs).""")
    pdf_max_output_mb: int = setting(64, minimum=1, help="Most text one PDF may yield, MiB.")
    html_max_depth: int = setting(500, minimum=1, help="""
        Deepest nesting of HTML elements a page may have.""")
    rescan_interval: float = setting(3600.0, minimum=0, reload="restart", help="""
        Seconds between scheduled rescans of directory sources; 0: on demand only.""")
    watch: bool = setting(True, reload="restart", help="""
        Watch directory sources for changes (inotify) and scan a source once its changes settle:
        a saved file is searchable within seconds; the scheduled rescan stays the safety
        net.""")
    watch_debounce: float = setting(0.5, minimum=0.01, reload="restart", help="""
        Seconds without a new change before a changed source is scanned (a burst of changes is
        one scan).""")
    watch_max_delay: float = setting(5.0, minimum=0.01, reload="restart", help="""
        Seconds from a source's first unscanned change to its scan at the latest, however busy
        its directory stays.""")
    watch_retry: float = setting(5.0, minimum=0.1, reload="restart", help="""
        Seconds between looks for added or removed sources and for a source root that was
        renamed or removed (watched again once it is back).""")
    watch_max_dirs: int = setting(8192, minimum=1, reload="restart", help="""
        Most directories watched over all sources (each an inotify watch, also bounded by the
        kernel's fs.inotify.max_user_watches); past it the rest is rescanned on schedule, with a
        warning.""")
    search_audit_log: str = setting("", reload="restart", help="""
        Audit log of Search calls (JSON lines: the redacted query, filters, mode, the whole
        fused candidate list with both ranks, latency; rotated like answer.audit_log); empty:
        off.""")
    refresh_min_interval: float = setting(600.0, minimum=0, help="""
        A Search rescans, in the background, each directory source it covers whose last scan is
        older than this many seconds (at most once per interval); 0: no refresh on search.""")
    backfill_interval: float = setting(30.0, minimum=0, reload="restart", help="""
        Seconds between checks for chunks without a vector of the current embedding model
        (indexed while it was unavailable), which are then embedded in the background; 0: on
        demand only (RetrievalService/Reprocess).""")
    retention_interval: float = setting(60.0, minimum=0, help="""
        Seconds between passes of history retention: each removes the records of history sources
        past their max_age_days or beyond their max_items; 0: none.""")
    retention_batch: int = setting(500, minimum=1, help="""
        Most history records one retention pass removes (the rest go in the next passes).""")
    redact_hostnames: bool = setting(False, help="Also redact hostnames (FQDNs) at ingest.")
    redact_ips: bool = setting(False, help="Also redact IP addresses at ingest.")
    refuse_hard_links: bool = setting(False, help="""
        Refuse files of directory sources that have more than one hard link (a hard link inside
        a root may be a file from outside it).""")
    exclude_defaults: bool = setting(True, help="""
        Leave key and credential files out of every directory source (*.pem, *.key, id_rsa*,
        .env, *.kdbx, ...: docs/knowledge-base.md lists them), before they are opened; a
        source's own patterns can include one again with !pattern.""")
    max_exclude_patterns: int = setting(256, minimum=0, help="""
        Most exclude patterns a directory source may have.""")
    max_exclude_chars: int = setting(16384, minimum=0, help="""
        Most characters of a directory source's exclude patterns, in all.""")
    store: str = setting("embedded", choices=STORES, reload="restart", help="""
        Where documents, chunks and vectors live: embedded (SQLite, tantivy and hnswlib in the
        state directory, this node's own) or postgres (a PostgreSQL + pgvector database at
        postgres_dsn, shared by every node configured with it; no review holds or history
        sources there yet).""")
    postgres_dsn: str = setting("", reload="restart", help="""
        With store = postgres: the database, as a libpq URI or key=value string without a
        password (postgresql://llamad@db.example.net:5432/kb).""")
    postgres_password_file: str = setting("", reload="restart", help="""
        With store = postgres: a file whose first line is the password (read at each connection;
        never logged). Empty: postgres_password_env, else none (peer or certificate
        authentication).""")
    postgres_password_env: str = setting("", reload="restart", help="""
        With store = postgres: the name of an environment variable holding the password, when
        postgres_password_file is empty (never logged).""")
    postgres_connect_timeout: float = setting(10.0, minimum=1, reload="restart", help="""
        Seconds to wait for a connection to the PostgreSQL store.""")
    postgres_max_connections: int = setting(8, minimum=1, reload="restart", help="""
        Connections this node opens to the PostgreSQL store at most (plus one for scan
        locks).""")
    postgres_statement_timeout: float = setting(30.0, minimum=0, reload="restart", help="""
        Seconds the PostgreSQL server lets one statement of llamad run before cancelling it; 0:
        no limit.""")
    postgres_ef_search: int = setting(100, minimum=1, reload="restart", help="""
        HNSW candidates a PostgreSQL vector search examines (hnsw.ef_search; at least the
        candidates asked for).""")
    postgres_max_scan_tuples: int = setting(20000, minimum=1, reload="restart", help="""
        How far a filtered PostgreSQL vector search walks the HNSW graph for enough hits
        (hnsw.max_scan_tuples).""")
    postgres_lexical_ranker: str = setting(
        "auto", choices=LEXICAL_RANKERS, reload="restart", help="""
        How the PostgreSQL store ranks the lexical list: auto (a BM25 extension the server
        offers, pg_textsearch then pg_search, else BM25 in plain SQL), or one by name (the store
        refuses to open without it).""")
    postgres_commits_in_flight: int = setting(2, minimum=1, reload="restart", help="""
        Group commits this node writes to the PostgreSQL store at once, each one transaction
        on its own connection (a document's versions never in two at once): while one waits
        on the server (pgvector's HNSW insertion is most of an ingest's cost) the next is
        written. 1: one at a time, as the embedded store does. Counts against
        postgres_max_connections.""")
    postgres_bm25_candidates: int = setting(1000, minimum=1, reload="restart", help="""
        With the plain-SQL BM25 ranker: postings read per query term, highest impact first, when
        a search has no filter (bounds a query's cost; rarer terms are read whole).""")


def check_store(r: RetrievalSettings) -> None:
    """Refuse a store configuration that cannot work, before anything starts: postgres
    without a DSN, a DSN that cannot be parsed or holds a password (never echoed), both
    password sources at once, a relative password file. The ``postgres_*`` options are
    ignored while ``store`` is ``embedded`` (so each option can be changed alone).

    Raises:
        ConfigError: says which option and what to do.
    """
    if r.store != "postgres":
        return
    if not r.postgres_dsn.strip():
        raise ConfigError("retrieval.store = postgres needs retrieval.postgres_dsn (the "
                          "database, e.g. postgresql://llamad@db.example.net:5432/kb)")
    try:
        check_dsn(r.postgres_dsn)
    except StoreUnavailable as exc:
        raise ConfigError(f"retrieval.postgres_dsn: {exc}") from None
    if r.postgres_password_file and r.postgres_password_env:
        raise ConfigError("retrieval.postgres_password_file and retrieval.postgres_password_env "
                          "are both set: keep one")
    if r.postgres_password_file and not r.postgres_password_file.startswith("/"):
        raise ConfigError(f"retrieval.postgres_password_file: {r.postgres_password_file!r} "
                          "is not an absolute path")

