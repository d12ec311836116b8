"""Where retrieval stands, as Status reports it: the same on every store backend.

:class:`RetrievalStatus` is what a backend's ``status`` counts (sources, chunks, documents
by state, vectors, disk), completed by the retriever with where the background backfill
(:class:`BackfillStatus`) and a rebuild for a new embedding model (:class:`VectorRebuild`)
stand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackfillStatus:
    """Where the backfill stands."""

    running: bool
    model: str               # the embedding model it embeds for ("" when idle)
    pending: int             # chunks it still has to embed or index in this run
    done: int                # chunks embedded or indexed so far in this run
    failed: int              # chunks the model refused (left BM25-only)
    last_error: str          # why the last run stopped early ("" when it did not)


IDLE = BackfillStatus(running=False, model="", pending=0, done=0, failed=0, last_error="")


@dataclass(frozen=True)
class VectorRebuild:
    """The vector index rebuilt for a new embedding model: until every chunk has a vector
    of it, the previous model's index serves the searches its model can embed."""

    running: bool            # a backfill run is rebuilding now
    model: str               # the model rebuilt for ("" when no rebuild is due)
    serving_model: str       # the previous model, answering meanwhile ("" : BM25-only)
    pending: int             # chunks still to embed
    done: int                # chunks embedded


NO_REBUILD = VectorRebuild(running=False, model="", serving_model="", pending=0, done=0)


@dataclass(frozen=True)
class RetrievalStatus:
    """What is indexed, and how the three stores stand."""

    sources: int
    chunks: int
    documents_by_state: dict[str, int]  # pending .. rejected (six states) -> count
    embedding_model: str                # the model of the vector index ("" none yet)
    embedded_chunks: int                # chunks with a cached vector of the current model
    vectors: int                        # vectors in the vector index
    disk_bytes: int                     # every file of the indexes' directory
    repaired: dict[str, int]            # what the last open repaired, by kind
    backfill: BackfillStatus = IDLE     # the background embedding of chunks without vectors
    rebuild: VectorRebuild = NO_REBUILD  # after an embedding-model change
    store: str = "embedded"             # the backend: embedded | postgres
    lexical_ranking: str = "bm25"       # the lexical list's ranking (postgres: ts_rank_cd)
    store_target: str = ""              # postgres: user@host:port/db (never a password)


def documents_by_state(counts: dict[str, int], processing: int,
                       pending: int) -> dict[str, int]:
    """Documents by ingest state for Status: the store's ``documents_<state>`` counts,
    plus the ``processing`` ones in flight and the ``pending`` ones queued in memory."""
    by_state = {k.removeprefix("documents_"): v for k, v in counts.items()
                if k.startswith("documents_")}
    if processing:
        by_state["processing"] = processing
    if pending:
        by_state["pending"] = by_state.get("pending", 0) + pending
    return by_state
