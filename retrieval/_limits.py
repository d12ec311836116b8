"""Every limit of retrieval, named: what one document, query, scan or commit may cost.

The daemon's config sets them (``retrieval.*`` options); error messages name the option.
The defaults here are those options' defaults: tests/unit/test_config_retrieval_limits.py
fails when one side changes alone, or when a limit has no option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .extraction._extract import ExtractLimits


@dataclass(frozen=True)
class RetrievalLimits:
    """Every limit of retrieval, named (the daemon's config sets them)."""

    chunk_size: int = 1200
    chunk_overlap: int = 200
    max_chunk_chars: int = 2000
    chunk_unit: str = "characters"  # characters | tokens (retrieval._sizing.CHUNK_UNITS)
    embed_batch: int = 32
    embed_concurrency: int = 2      # embedding requests ingest keeps in flight
    ingest_workers: int = 128       # documents of a directory scan in flight at once
    ingest_inflight_bytes: int = 64 * 1024**2  # ... and their file bytes, at most
    max_commit_batch: int = 256     # documents per group commit
    max_pending: int = 1000         # upserts accepted to index in the background, waiting
    # 100/100: +0.011 mean nDCG@10 over 25/25 on 4 of 4 BEIR collections; no other depth
    # generalises, left one collection out. DBSF 0.4/0.6: chosen on three collections, it
    # beats plain RRF on each held-out one (+0.0004 to +0.005, +0.003 on the folds' mean,
    # nDCG@10 averaged over five ingest orders); a short BM25 list is fused as what it is,
    # so a word only one document holds stays first or second (bench/RESULTS.md, Fusion by
    # leaving one collection out)
    text_candidates: int = 100
    vector_candidates: int = 100
    max_candidates: int = 200       # most candidates a search may ask each index for
    rrf_k: int = 60
    fusion: str = "dbsf"            # rrf | dbsf | convex (search._score_fusion)
    text_weight: float = 0.4        # the lists' weights in the fusion (rrf, 1 and 1: plain RRF)
    vector_weight: float = 0.6
    max_also_in: int = 50           # copies of a hit's text read to name its other holders
    search_threads: int = 4         # threads of its own for a search's reads (search._reads)
    default_k: int = 5
    max_k: int = 20
    max_query_chars: int = 2000
    max_document_chars: int = 5_000_000
    max_files_per_source: int = 20_000
    max_bytes_per_source: int = 2 * 1024**3
    query_embed_timeout: float = 5.0
    redact_hostnames: bool = False
    redact_ips: bool = False
    refuse_hard_links: bool = False  # files with more than one link (see _confine)
    exclude_defaults: bool = True   # key and credential files out of directory sources
    max_exclude_patterns: int = 256  # a source's exclude patterns, at most
    max_exclude_chars: int = 16384  # ... and their characters in all
    retention_interval: float = 60.0  # seconds between history retention passes (0: off)
    retention_batch: int = 500      # most records one retention pass removes
    extract: ExtractLimits = field(default_factory=ExtractLimits)
