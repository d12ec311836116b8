"""The retriever's links to the rest of the daemon: its limits from the configuration, the
embedding role as its ``Embedder``, and the schedules that rescan sources and backfill
vectors.

:class:`ChildEmbedder` adapts the embedding role — a supervised child or an external
endpoint — to the retriever's ``Embedder`` protocol. The retriever asks for it on every
use, so it follows the role: when the role is down, disabled, or its endpoint has no
embeddings API, the provider returns None and search is BM25-only, saying why. Vectors
are tagged with the embedding model's identity (file name and SHA-256 for a child, model
id and URL for an endpoint), so a swap or a switch never mixes vector spaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import structlog

from retrieval import (
    ExtractLimits,
    PgOptions,
    RetrievalLimits,
    Retriever,
    SourceWatcher,
    Vector,
    scan_source,
)
from supervisor import ChildRequestError, State, SupervisorError, TokenizeUnavailableError

from ..config import Config, InferenceMode, Role
from ..config._retrieval import RetrievalSettings
from ..errors import RequestError
from ..models import lanes
from ..models.backend import InferenceBackend
from ..models.children import ManagedChild
from ..models.lanes import Lane
from ..models.router import InferenceRouter


def limits_from(config: Config) -> RetrievalLimits:
    r = config.settings.retrieval
    return RetrievalLimits(
        chunk_size=r.chunk_size, chunk_overlap=r.chunk_overlap, chunk_unit=r.chunk_unit,
        max_chunk_chars=r.max_chunk_chars, embed_batch=r.embed_batch,
        embed_concurrency=r.embed_concurrency, ingest_workers=r.ingest_workers,
        ingest_inflight_bytes=r.ingest_inflight_mb * 1024 * 1024,
        max_commit_batch=r.max_commit_batch, max_pending=r.max_pending_upserts,
        query_embed_timeout=r.query_embed_timeout,
        text_candidates=r.text_candidates, vector_candidates=r.vector_candidates,
        rrf_k=r.rrf_k, fusion=r.fusion, default_k=r.default_k, max_k=r.max_k,
        max_query_chars=r.max_query_chars, max_document_chars=r.max_document_chars,
        max_candidates=r.max_candidates, text_weight=r.text_weight,
        max_also_in=r.max_also_in, search_threads=r.search_threads,
        vector_weight=r.vector_weight,
        max_files_per_source=r.max_files_per_source,
        max_bytes_per_source=r.max_source_mb * 1024 * 1024,
        redact_hostnames=r.redact_hostnames, redact_ips=r.redact_ips,
        refuse_hard_links=r.refuse_hard_links, exclude_defaults=r.exclude_defaults,
        max_exclude_patterns=r.max_exclude_patterns, max_exclude_chars=r.max_exclude_chars,
        retention_interval=r.retention_interval, retention_batch=r.retention_batch,
        extract=ExtractLimits(max_bytes=r.max_file_mb * 1024 * 1024,
                              pdf_timeout=r.pdf_timeout,
                              pdf_max_pages=r.pdf_max_pages,
                              html_max_depth=r.html_max_depth,
                              pdf_max_memory=r.pdf_max_memory_mb * 1024 * 1024,
                              pdf_max_output=r.pdf_max_output_mb * 1024 * 1024),
    )


def postgres_from(config: Config) -> PgOptions | None:
    """How to reach the PostgreSQL store (``retrieval.store = postgres``); None for the
    embedded store."""
    r = config.settings.retrieval
    return pg_options(r) if r.store == "postgres" else None


def pg_options(r: RetrievalSettings, *, max_connections: int | None = None) -> PgOptions:
    """The PostgreSQL store's connection settings of ``[retrieval]`` (``max_connections``
    instead of ``postgres_max_connections`` when given)."""
    return PgOptions(
        r.postgres_dsn, password_file=r.postgres_password_file,
        password_env=r.postgres_password_env, connect_timeout=r.postgres_connect_timeout,
        max_connections=(r.postgres_max_connections if max_connections is None
                         else max_connections),
        statement_timeout_ms=round(r.postgres_statement_timeout * 1000),
        ef_search=r.postgres_ef_search, max_scan_tuples=r.postgres_max_scan_tuples,
        lexical_ranker=r.postgres_lexical_ranker,
        bm25_candidates_per_term=r.postgres_bm25_candidates,
        commits_in_flight=r.postgres_commits_in_flight)


_embedded: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "llamad_embedded_tokens", default=None)


@contextlib.contextmanager
def counting_tokens() -> Iterator[list[int]]:
    """Count the tokens the body's embeddings cost (a Search's query, for its token's
    ``tpm``): the box's one item, the embedding child's own count, with no call of its
    own; the tasks the body starts add to it too."""
    box = [0]
    token = _embedded.set(box)
    try:
        yield box
    finally:
        _embedded.reset(token)


class ChildEmbedder:
    """The embedding role's current backend (a child or an endpoint) as a
    ``retrieval.Embedder``; made afresh by the provider for each use, so its identity and
    context are those of what serves the role at that moment."""

    def __init__(self, router: InferenceRouter, backend: InferenceBackend) -> None:
        self._router = router
        self._backend = backend
        self.model_id: Final = backend.identity
        self.context: Final = backend.context_tokens or 512

    async def embed(self, texts: Sequence[str]) -> Sequence[Vector]:
        # in_flight: an ingest or search already running when a shutdown begins is let
        # finish by the drain; refused embeddings would leave its documents without
        # vectors for good (nothing embeds them later), its search BM25-only.
        # The lane: a search's query embedding runs in its caller's (set around the
        # retriever's search); everything else the retriever embeds (ingest, backfill,
        # Reprocess, re-embedding after review) is background work.
        lane = lanes.current(Lane.BACKGROUND)
        async with self._router.admit(Role.EMBEDDING, None, in_flight=True,
                                      lane=lane) as backend:
            if backend.identity != self.model_id:
                # Swapped or switched since: these vectors would carry the wrong identity.
                raise ChildRequestError("the embedding model changed; retry")
            result = await backend.embed(list(texts))
        if (box := _embedded.get()) is not None:
            box[0] += result.prompt_tokens
        return list(result.matrix)  # float32 rows, as the index stores them

    async def count_tokens(self, text: str) -> int:
        try:
            return len(await self._backend.tokenize(text, add_special=True))
        except TokenizeUnavailableError:
            # Only an endpoint lacks a tokenizer: a conservative estimate (an English
            # BPE/WordPiece token averages about 4 characters) splits chunks a little
            # more often than needed, never less.
            return estimate_tokens(text)


def estimate_tokens(text: str) -> int:
    """A conservative token count for endpoints without a tokenizer (never for a child)."""
    return len(text) // 3 + 1


def make_provider(router: InferenceRouter, children: dict[str, ManagedChild]
                  ) -> Callable[[], ChildEmbedder | None]:
    """The embedder provider the retriever calls: None unless the embedding role is ready
    and what serves it has a known identity (a child's model SHA-256, an endpoint's model
    id and URL)."""
    child = children.get(Role.EMBEDDING)

    def provider() -> ChildEmbedder | None:
        if child is None or child.supervisor.state is not State.RUNNING:
            return None
        try:
            backend = router.backend(Role.EMBEDDING, in_flight=True)
        except (RequestError, SupervisorError):
            return None
        return ChildEmbedder(router, backend) if backend.identity else None

    return provider


def make_lookup(provider: Callable[[], ChildEmbedder | None]
                ) -> Callable[[str], ChildEmbedder | None]:
    """The retriever's embedder of a given model (``retrieval.EmbedderLookup``): while the
    vector index is rebuilt for a new embedding model, queries are embedded by the
    previous one through it if it is still available. One embedding model is resident at
    a time today, so it answers only for the embedding role's current model; a pool of
    resident embedding models answers here for any of them."""
    def embedder_for(model_id: str) -> ChildEmbedder | None:
        embedder = provider()
        return embedder if embedder is not None and embedder.model_id == model_id else None

    return embedder_for


def unavailable_reason(children: dict[str, ManagedChild]) -> Callable[[], str]:
    """Why the embedder provider has nothing (for search warnings)."""
    def reason() -> str:
        child = children.get(Role.EMBEDDING)
        if child is None or child.mode.kind is InferenceMode.DISABLED:
            return "embedding is disabled"
        where = ("the embedding endpoint" if child.mode.kind is InferenceMode.ENDPOINT
                 else "the embedding child")
        error = child.last_error or (child.supervisor.last_exit.message
                                     if child.supervisor.last_exit else "")
        state = child.supervisor.state.value
        return f"{where} is unavailable ({state}{': ' + error[:200] if error else ''})"

    return reason


def _no_roots() -> tuple[str, ...]:
    return ()


async def rescan_loop(retriever: Retriever, interval: float,
                      allowed_roots: Callable[[], tuple[str, ...]] = _no_roots) -> None:
    """Rescan every directory source each ``interval`` seconds (a source scanned more
    recently, e.g. by an operator's Reindex, waits its turn). Runs until cancelled; a
    failing source (one outside ``allowed_roots()`` too) is logged and retried next
    round."""
    while True:
        await asyncio.sleep(min(interval, 60.0))
        now = time.time()
        for source in await retriever.sources():
            if source.kind != "directory" or source.disabled \
                    or now - (source.last_scan or 0) < interval:
                continue
            try:
                await scan_source(retriever, source.id, allowed_roots=allowed_roots())
            except Exception as exc:
                structlog.get_logger("llamad.retrieval").warning(
                    "scheduled rescan failed", source=source.id, error=str(exc)[:200])


async def backfill_loop(retriever: Retriever, interval: float) -> None:
    """Every ``interval`` seconds, start the background embedding of chunks without a
    vector of the current embedding model, if there are any and an embedder is available
    (:meth:`retrieval.Retriever.backfill_soon`: the check runs in a worker thread). Runs
    until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await retriever.backfill_soon()
        except Exception as exc:
            structlog.get_logger("llamad.retrieval").warning(
                "backfill check failed", error=str(exc)[:200])


async def watch_sources(retriever: Retriever, settings: RetrievalSettings,
                        allowed_roots: Callable[[], Sequence[str]] = _no_roots) -> None:
    """Live change detection (``retrieval.watch``): scan each directory source once its
    changes settle (:class:`retrieval.SourceWatcher`). Runs until cancelled; without
    inotify it logs why and returns, leaving the scheduled rescan."""
    await SourceWatcher(retriever, allowed_roots, debounce=settings.watch_debounce,
                        max_delay=settings.watch_max_delay, retry=settings.watch_retry,
                        max_dirs=settings.watch_max_dirs).run()
