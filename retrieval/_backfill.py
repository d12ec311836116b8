"""Vectors for every chunk: the background backfill.

A chunk can be indexed without a vector: it was ingested while the embedding model was
unavailable (or the embedding failed), or the model changed since. Rescans skip it (its
content did not change), so without this module it would stay BM25-only for good. The
backfill embeds, in the background, every chunk that has no vector in the index for the
current embedding model:

- the vector index is the current model's: the missing chunks are embedded (cached by
  content hash: a text is embedded once per model) and added, batch by batch, under the
  writer lock; search uses each batch as soon as it is added;
- there is no vector index yet, or it is another model's: every chunk is embedded into the
  cache first, then the index is rebuilt for the new model in one step. Meanwhile the
  previous model's index keeps serving the searches whose query its model can embed (it
  is still available: :data:`~retrieval._embedder.EmbedderLookup`); when it is not, search
  is BM25-only and says why, with the rebuild's progress (:meth:`Backfill.rebuild`).

It is bounded (pages of ``embed_batch`` chunks, one embedding request at a time: the
embedding child keeps room for queries and ingest), resumable (each page is cached in
SQLite, then indexed; an interrupted run, a restart or a crash loses at most the page in
flight) and visible (:class:`BackfillStatus`). A text the model refuses even alone (longer
than its context, say) is left BM25-only and counted, not retried until the next start or
an explicit :meth:`Backfill.start` with ``retry_failed``.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Sequence

import numpy as np
import structlog

from ._embedder import Embedder, EmbedderLookup, EmbedderProvider, current_only
from ._limits import RetrievalLimits
from ._status import NO_REBUILD, BackfillStatus, VectorRebuild
from .store._indexes import Indexes

_log = structlog.get_logger("llamad.retrieval")


class BackfillRun(abc.ABC):
    """What the two backends' backfills share (:class:`Backfill`,
    :class:`retrieval.postgres._backfill.PgBackfill`): the embedder they embed with, the run's
    task and its progress (:attr:`status`), and the texts the model refused; and the calls
    each answers its own way (the factory, :func:`retrieval._backend.backend`, builds the
    store's)."""

    def __init__(self, embedder: EmbedderProvider, limits: RetrievalLimits,
                 embedder_for: EmbedderLookup | None = None) -> None:
        """Args:
            embedder: gives the current embedder (the model vectors are made for), or None.
            limits: ``embed_batch`` (chunks per page).
            embedder_for: gives an embedder of a named model if available (it says in
                ``rebuild`` whether the previous model still serves); default: the
                current embedder, for its own model only.
        """
        self._embedder = embedder
        self._embedder_for = embedder_for or current_only(embedder)
        self.limits = limits
        self.task: asyncio.Task[None] | None = None
        self._model = ""
        self._switching = False  # the run under way embeds for a new model
        self._pending = 0
        self._done = 0
        self._failed: set[str] = set()   # content hashes the current model refused
        self._failed_model = ""
        self._last_error = ""

    @property
    def status(self) -> BackfillStatus:
        running = self.running
        return BackfillStatus(running, self._model if running else "", self._pending,
                              self._done, len(self._failed), self._last_error)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def _cancel(self) -> None:
        """Stop the run under way, if any (what it stored stays)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def rebuilding(self, previous: str, model: str) -> str:
        """Why a search is BM25-only while the vectors are rebuilt for ``model``: the
        rebuild and its progress (``previous``, the model of the vectors until then, is
        not available to embed the query)."""
        status = self.status
        progress = "starting"
        if status.running and status.model == model and status.pending + status.done:
            progress = f"{status.done} of {status.pending + status.done} chunks embedded"
        return (f"the vector index is being rebuilt for embedding model {model} "
                f"({progress}); its vectors until then are of model {previous}, which is "
                "not available to embed the query")

    @abc.abstractmethod
    def needed(self) -> bool:
        """Whether some chunk lacks a vector of the current embedding model where one is
        wanted (False while no embedder is available). Blocking."""

    @abc.abstractmethod
    def rebuild(self, chunks: int, embedded: int) -> VectorRebuild:
        """Where a rebuild of the vectors for this node's embedding model stands
        (``chunks`` in the store, ``embedded`` of them with its vector)."""

    def start(self, *, retry_failed: bool = False, only: set[int] | None = None,
              needed: bool | None = None) -> bool:
        """Start a run unless one is under way, nothing is missing or no embedder is
        available; True if started.

        Args:
            retry_failed: embed again the texts the model refused before.
            only: the chunk keys to consider (a document's, a source's); None: all.
            needed: what :meth:`needed` answered, when the caller asked it already (in
                a worker thread); None: asked here.
        """
        if self.running:
            return False
        if retry_failed:
            self._failed.clear()
        embedder = self._embedder()
        if embedder is None or (only is None and not (
                self.needed() if needed is None else needed)):
            return False
        return self._start(embedder.model_id, only)

    @abc.abstractmethod
    def _start(self, model: str, only: set[int] | None) -> bool:
        """Start a run for ``model`` (the checks of :meth:`start` passed); True if
        started."""

    @abc.abstractmethod
    def missing(self, keys: set[int]) -> set[int]:
        """Those of ``keys`` a run for the current embedding model would embed. Blocking."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop a run (what it stored stays; the next run resumes)."""

    @abc.abstractmethod
    def on_other_model(self) -> bool:
        """A search or a commit met vectors of another model than this node's embedding
        model (or none yet): start what brings them to this node's model, if this backend
        does that by itself; True if a run started."""

    @abc.abstractmethod
    def refusal(self, node_model: str, serving: str) -> str:
        """Why a query embedded with ``node_model`` cannot search the store's vectors of
        ``serving``, when no embedder of ``serving`` is available here (for a search's
        warnings)."""

    def _current(self, model: str) -> Embedder:
        """The current embedder, still of ``model``.

        Raises:
            RuntimeError: it is gone, or another model's (the run stops).
        """
        embedder = self._embedder()
        if embedder is None:
            raise RuntimeError("the embedding model became unavailable")
        if embedder.model_id != model:
            raise RuntimeError("the embedding model changed")
        return embedder


class Backfill(BackfillRun):
    """Embeds the chunks without a vector for the current model, in the background."""

    def __init__(self, indexes: Indexes, embedder: EmbedderProvider,
                 limits: RetrievalLimits, embedder_for: EmbedderLookup | None = None) -> None:
        """Args: ``indexes``, the stores; the others as :class:`BackfillRun`'s."""
        super().__init__(embedder, limits, embedder_for)
        self._indexes = indexes

    def needed(self) -> bool:
        """Whether some chunk lacks a vector for the current embedding model (a cheap
        check: counts only). False while no embedder is available."""
        embedder = self._embedder()
        indexes = self._indexes
        if embedder is None or indexes.store is None:
            return False
        if indexes.vectors is None or indexes.vector_model != embedder.model_id:
            return indexes.store.chunk_count() > 0
        missing = indexes.store.entry_count() - indexes.vectors.count()  # a text's once
        return missing > len(self._failed) if self._failed_model == embedder.model_id \
            else missing > 0

    def rebuild(self, chunks: int, embedded: int) -> VectorRebuild:
        """Where the rebuild for a new embedding model stands: :data:`NO_REBUILD` unless
        the vector index belongs to another model than the current embedder's (or a run
        rebuilding it is under way). ``serving_model`` is the index's model when an
        embedder of it is available now (search uses its vectors), else "".

        Args:
            chunks: chunks in the store; embedded: those with a cached vector of the
                current model (the progress reported while no run is under way).
        """
        indexes = self._indexes
        previous = indexes.vector_model if indexes.vectors is not None else ""
        current = self._embedder()
        running = self.running and self._switching
        if running:
            model, pending, done = self._model, self._pending, self._done
        elif current is not None and previous and current.model_id != previous:
            model, pending, done = current.model_id, max(0, chunks - embedded), embedded
        else:
            return NO_REBUILD
        serving = previous if previous and self._embedder_for(previous) is not None else ""
        return VectorRebuild(running, model, serving, pending, done)

    def _start(self, model: str, only: set[int] | None) -> bool:
        # What the run will do, known before its first step.
        self._model, self._pending, self._done = model, 0, 0
        self._switching = self._indexes.vectors is not None and \
            self._indexes.vector_model != model
        self.task = asyncio.create_task(self._run(only), name="vector-backfill")
        return True

    def on_other_model(self) -> bool:
        """The index follows this node's embedding model: another model's (or none) is
        rebuilt for it, by a run started now."""
        return self.start()

    def refusal(self, node_model: str, serving: str) -> str:
        """The index is being rebuilt for this node's model (:meth:`on_other_model`)."""
        return self.rebuilding(serving, node_model)

    def missing(self, keys: set[int]) -> set[int]:
        """Those of ``keys`` without a vector of the current embedding model in the
        index (all of them when the index is another model's, or there is none).
        Blocking."""
        embedder = self._embedder()
        vectors = self._indexes.vectors
        if embedder is None or vectors is None or self._indexes.vector_model != \
                embedder.model_id:
            return set(keys)
        return vectors.missing(self._indexes.require().entries_of(keys))

    async def close(self) -> None:
        """Stop a run (what it embedded stays cached; the next start resumes)."""
        await self._cancel()

    async def _run(self, only: set[int] | None = None) -> None:
        embedder = self._embedder()
        if embedder is None:
            return
        indexes = self._indexes
        store = indexes.require()
        model = embedder.model_id
        if self._failed_model != model:
            self._failed, self._failed_model = set(), model
        # Another model's index is replaced only once every chunk has a vector of the
        # new one; with no index at all, the first vectors make one at once.
        switching = indexes.vectors is not None and indexes.vector_model != model
        self._model, self._switching = model, switching
        keys = await asyncio.to_thread(store.entry_keys)  # a text's vector: once
        if only is not None:
            keys &= await asyncio.to_thread(store.entries_of, only)
        if indexes.vectors is not None and not switching:
            keys = indexes.vectors.missing(keys)
        todo = sorted(keys)
        self._model, self._pending, self._done, self._last_error = model, len(todo), 0, ""
        began, dim = time.monotonic(), 0
        _log.info("vector backfill started", model=model, chunks=len(todo),
                  rebuild=switching, previous=indexes.vector_model or None)
        step = max(1, self.limits.embed_batch)  # one embedding request per page at most
        try:
            for i in range(0, len(todo), step):
                page = todo[i:i + step]
                dim = await self._embed_page(page, model) or dim
                if not switching and dim:
                    async with indexes.write:
                        if not await self._index_page(page, model, dim):
                            return  # another model's index appeared meanwhile
                self._done += len(page)
                self._pending -= len(page)
        except Exception as exc:
            self._last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            _log.warning("vector backfill interrupted; the next run resumes",
                         model=model, done=self._done, error=self._last_error)
            return
        if switching and dim:
            async with indexes.write:
                current = self._embedder()
                if current is None or current.model_id != model:
                    return  # the model changed again; the next run starts over
                await asyncio.to_thread(indexes.use_vector_model_sync, model, dim)
        _log.info("vector backfill done", model=model, chunks=self._done,
                  refused=len(self._failed), vectors=indexes.vectors.count()
                  if indexes.vectors else 0, seconds=round(time.monotonic() - began, 1))

    async def _embed_page(self, keys: Sequence[int], model: str) -> int:
        """Cache a vector of ``model`` for each chunk of ``keys`` that has none; return
        the vectors' dimension (0 when nothing was embedded or cached)."""
        store = self._indexes.require()
        chunks = await asyncio.to_thread(store.chunks_by_keys, keys)
        texts = {c.content_hash: c.text for c in chunks.values()}
        cached = await asyncio.to_thread(store.cached_vectors, model, texts)
        todo = [(h, t) for h, t in texts.items() if h not in cached and h not in self._failed]
        dim = len(next(iter(cached.values()))) if cached else 0
        if todo:
            fresh = await self._embed(todo, model)
            if fresh:
                dim = dim or len(next(iter(fresh.values())))
                await asyncio.to_thread(store.put_vectors, model, fresh)
        return dim

    async def _embed(self, part: list[tuple[str, str]], model: str) -> dict[str, np.ndarray]:
        return await embed_refusing(self._current, part, model, self._failed)

    async def _index_page(self, keys: Sequence[int], model: str, dim: int) -> bool:
        """Add the cached vectors of the chunks of ``keys`` the index lacks (a chunk
        deleted or replaced meanwhile is skipped), making the index first if there is
        none. False when the index is another model's. The caller holds the writer lock."""
        indexes = self._indexes
        if indexes.vectors is None:
            await asyncio.to_thread(indexes.use_vector_model_sync, model, dim)
            return True  # made from every cached vector of the model, this page's too
        if indexes.vector_model != model:
            return False
        vectors = indexes.vectors

        def add() -> None:
            missing = vectors.missing(keys)
            if missing and indexes.add_cached_vectors(missing):
                indexes.vectors_dirty = True

        await asyncio.to_thread(add)
        return True


async def embed_refusing(current: Callable[[str], Embedder], part: list[tuple[str, str]],
                         model: str, failed: set[str]) -> dict[str, np.ndarray]:
    """Vectors for ``part`` (``(content hash, text)``) from ``current(model)``, the
    embedder of the moment (it raises when the embedder is gone or another model). A
    batch the model refuses is embedded text by text: the hashes of the texts refused
    alone are added to ``failed``. Raises when nothing of the batch went through (an
    outage more likely than texts the model refuses: the run stops, the next one tries
    these again)."""
    embedder = current(model)
    try:
        got = await embedder.embed([t for _, t in part])
        return {h: np.asarray(v, dtype=np.float32)
                for (h, _), v in zip(part, got, strict=True)}
    except Exception:
        current(model)  # gone or changed: the run stops here
    fresh: dict[str, np.ndarray] = {}
    refused: dict[str, str] = {}
    for h, t in part:
        embedder = current(model)
        try:
            fresh[h] = np.asarray((await embedder.embed([t]))[0], dtype=np.float32)
        except Exception as exc:
            current(model)  # gone or changed: stop the run, not this text
            refused[h] = str(exc)[:200]
    if refused and not fresh:
        raise RuntimeError(f"the embedding model refused every text of a batch "
                           f"({next(iter(refused.values()))})")
    for h, error in refused.items():
        failed.add(h)
        _log.warning("a chunk could not be embedded; it stays BM25-only",
                     model=model, error=error)
    return fresh
