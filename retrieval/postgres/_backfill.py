"""Vectors for every chunk on the PostgreSQL store: the backfill, and the switch of the
shared corpus to another embedding model.

The embedded store's backfill (:mod:`retrieval._backfill`), over a database several nodes
share:

- **Backfill**: chunks without a vector of the corpus's model (ingested while no embedding
  model ran, or its embedding failed) are embedded in pages of ``embed_batch`` chunks and
  stored, each page in one transaction (:meth:`~retrieval.postgres._vectors.PgVectors.
  add_vectors`: a chunk deleted or replaced meanwhile is skipped). Before the corpus has
  a model, the first vectors set it.
- **Switching the embedding model**: a node whose model is not the corpus's neither
  writes nor searches vectors (it says so, naming both), as before. A ``Reprocess`` on it
  asks for the switch (``corpus_switch``: the newest request wins), and from then on
  every node embedding with the target model carries it out: every chunk gets a vector
  of the target's space while the corpus's keeps answering searches (on a node that
  embeds with the target model, through the previous model if it is still resident:
  :data:`~retrieval._embedder.EmbedderLookup`; otherwise BM25-only, saying so). When
  none lacks one, one transaction makes the target the corpus's space
  (:meth:`~retrieval.postgres._vectors.PgVectors.finish_switch`); documents written
  meanwhile by nodes of either model are either in that check or wait for it.
- **One node at a time per model**: a run holds the session advisory lock of its model
  (:func:`~retrieval.postgres._locks.backfill_lock_key`, on the scan-lock session): a second
  node does not start one (its :meth:`PgBackfill.start` says False), and the server
  releases the lock when the holder dies, so the next run (any node's) resumes. No chunk
  is embedded by two nodes, and none is lost: a run sweeps the chunks in key order, then
  once more from the start for those committed behind it, until a sweep finds none.

Bounded (one embedding request at a time), resumable (each page is committed; a stopped
run loses at most the page in flight) and visible (:class:`BackfillStatus`), as the
embedded one; a text the model refuses even alone is left BM25-only and counted.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import structlog

from .._backfill import BackfillRun, embed_refusing
from .._embedder import EmbedderLookup, EmbedderProvider
from .._limits import RetrievalLimits
from .._status import NO_REBUILD, VectorRebuild
from ._indexes import PgIndexes
from ._locks import backfill_lock_key, backfill_lock_name
from ._vectors import Space

_log = structlog.get_logger("llamad.retrieval")

SWITCH_ROUNDS = 3
"""Sweeps a run makes for the chunks written while it switched the model, before it
leaves the switch to the next run (ingest that never pauses cannot hold a run forever)."""


class _Superseded(Exception):
    """The space a run embeds for is no longer wanted (the corpus was switched away from
    it, or a switch to another model was asked for)."""


class PgBackfill(BackfillRun):
    """Embeds the chunks without a vector of this node's model, in the background, on the
    PostgreSQL store (see the module's docstring). ``_switching``: the run under way
    embeds for a switch of the corpus."""

    def __init__(self, indexes: PgIndexes, embedder: EmbedderProvider,
                 limits: RetrievalLimits, embedder_for: EmbedderLookup | None = None) -> None:
        """Args: ``indexes``, the stores; the others as
        :class:`~retrieval._backfill.BackfillRun`'s."""
        super().__init__(embedder, limits, embedder_for)
        self._indexes = indexes
        self._locked = ""                # the model whose backfill lock this node holds

    def _skip(self, model: str) -> list[str]:
        return sorted(self._failed) if self._failed_model == model else []

    def _space(self, model: str) -> tuple[Space | None, bool]:
        """The space a run for ``model`` fills (None: not made yet, or not asked for) and
        whether the run switches the corpus to it. Blocking."""
        corpus, switch = self._indexes.spaces_sync()
        if corpus is None or corpus.model == model:
            return corpus, False
        return (switch if switch is not None and switch.model == model else None), True

    def needed(self) -> bool:
        """Whether some chunk lacks a vector of this node's model where one is wanted:
        the corpus's (or the first, before it has one), or the space it is being switched
        to. False while no embedder is available, or its model is another than both.
        Blocking (one query)."""
        embedder = self._embedder()
        store = self._indexes.store
        if embedder is None or store is None:
            return False
        model = embedder.model_id
        space, switching = self._space(model)
        if space is None:
            return not switching and store.chunk_count() > 0
        return store.any_missing(space.id, self._skip(model))

    def rebuild(self, chunks: int, embedded: int) -> VectorRebuild:
        """Where the switch of the corpus to this node's model stands (:data:`NO_REBUILD`
        unless one was asked for, or a run carries one out). ``serving_model`` is the
        corpus's model when an embedder of it is available here (searches use its
        vectors), else "".

        Args:
            chunks: chunks in the store; embedded: those with a vector of this node's
                model (the progress reported while no run is under way).
        """
        corpus = self._indexes.vector_model
        current = self._embedder()
        if self.running and self._switching:
            model, pending, done = self._model, self._pending, self._done
        elif current is not None and current.model_id == self._indexes.switch_model:
            model, pending, done = current.model_id, max(0, chunks - embedded), embedded
        else:
            return NO_REBUILD
        serving = corpus if corpus and self._embedder_for(corpus) is not None else ""
        return VectorRebuild(self.running and self._switching, model, serving, pending, done)

    def _start(self, model: str, only: set[int] | None) -> bool:
        """Start a run unless another node runs one for ``model`` (its lock). Blocking:
        one short query, after :meth:`start`'s :meth:`needed` unless ``needed`` or
        ``only`` was given (it reads every chunk's key: about 30 ms at 100k chunks; the
        daemon asks it in a worker thread, :meth:`retrieval.Retriever.backfill_soon`).
        ``only`` (a Reprocess's scope), given on a node whose model is not the corpus's,
        asks for the corpus to be switched to it: the run embeds every chunk."""
        store = self._indexes.require()
        if not store.try_lock(backfill_lock_name(model), backfill_lock_key(model)):
            _log.debug("vector backfill under way on another node", model=model)
            return False
        self._locked = model
        self._model, self._pending, self._done = model, 0, 0
        self._switching = bool(self._indexes.vector_model) and \
            self._indexes.vector_model != model
        self.task = asyncio.create_task(self._run(model, only), name="vector-backfill")
        return True

    def on_other_model(self) -> bool:
        """Nothing: the shared corpus's model changes only when a switch is asked for
        (a ``Reprocess``, :meth:`start` with ``only``), never because one node embeds
        with another model."""
        return False

    def refusal(self, node_model: str, serving: str) -> str:
        """The switch of the corpus to ``node_model`` under way, if it was asked for;
        else that the node embeds with another model than the corpus's (logged once)."""
        if self._indexes.switch_model == node_model:
            return self.rebuilding(serving, node_model)
        self._indexes.model_mismatch(node_model, serving)
        return (f"this node embeds with {node_model} but the shared corpus is embedded "
                f"with {serving}: vectors of two models are not comparable")

    def missing(self, keys: set[int]) -> set[int]:
        """Those of ``keys`` without a vector of this node's model where one is wanted;
        every chunk when this node's model is another than the corpus's (a Reprocess
        then switches the whole corpus). Blocking."""
        embedder = self._embedder()
        store = self._indexes.require()
        if embedder is None:
            return set(keys)
        space, switching = self._space(embedder.model_id)
        if switching:
            return store.chunk_keys() if space is None else \
                store.missing_keys(space.id, store.chunk_keys())
        return set(keys) if space is None else store.missing_keys(space.id, keys)

    async def close(self) -> None:
        """Stop a run (what it stored stays; the next run, any node's, resumes) and
        release its lock."""
        await self._cancel()
        self._unlock()

    def _unlock(self) -> None:
        store = self._indexes.store
        if self._locked and store is not None:
            store.release_lock(backfill_lock_name(self._locked),
                               backfill_lock_key(self._locked))
        self._locked = ""

    async def _run(self, model: str, only: set[int] | None) -> None:
        try:
            await self._sweeps(model, only)
        except _Superseded:
            _log.info("vector backfill stopped: its model's vectors are no longer wanted "
                      "(the corpus was switched, or a switch to another model was asked "
                      "for)", model=model)
        except Exception as exc:
            self._last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            _log.warning("vector backfill interrupted; the next run resumes",
                         model=model, done=self._done, error=self._last_error)
        finally:
            self._unlock()

    async def _sweeps(self, model: str, only: set[int] | None) -> None:
        store = self._indexes.require()
        if self._failed_model != model:
            self._failed, self._failed_model = set(), model
        space, switching = await asyncio.to_thread(self._space, model)
        if switching and space is None and only is None:
            return  # another model's corpus, no switch asked for: this node says so
        scope = sorted(only) if only is not None and not switching else None
        self._switching, self._last_error, self._done = switching, "", 0
        self._pending = await asyncio.to_thread(
            store.missing_count, space.id if space is not None else 0,
            self._skip(model), scope)
        began = time.monotonic()
        _log.info("vector backfill started", model=model, chunks=self._pending,
                  switch=switching, corpus=self._indexes.vector_model or None)
        for _ in range(SWITCH_ROUNDS):
            space = await self._sweep(model, space, switching, scope)
            if not switching or space is None:
                break
            outcome = await asyncio.to_thread(store.finish_switch, space.id,
                                              self._skip(model))
            if outcome == "gone":
                raise _Superseded
            if outcome == "done":
                await asyncio.to_thread(self._indexes.spaces_sync)
                _log.info("the shared corpus now uses embedding model", model=model,
                          store=store.target)
                break
        _log.info("vector backfill done", model=model, chunks=self._done,
                  refused=len(self._failed), seconds=round(time.monotonic() - began, 1))

    async def _sweep(self, model: str, space: Space | None, switching: bool,
                     scope: list[int] | None) -> Space | None:
        """Embed the chunks lacking a vector of ``space`` in key order, then once more
        from the start for those committed behind the cursor, until a sweep finds none;
        return the space (made by the first vectors when there was none)."""
        store = self._indexes.require()
        step = max(1, self.limits.embed_batch)  # one embedding request per page at most
        after, found = 0, False
        while True:
            page = await asyncio.to_thread(
                store.missing_chunks, space.id if space is not None else 0, after=after,
                limit=step, skip=self._skip(model), scope=scope)
            if not page:
                if not found:
                    return space
                after, found = 0, False
                continue
            found, after = True, page[-1][0]
            space = await self._embed_page(page, model, space, switching)
            self._done += len(page)
            self._pending = max(0, self._pending - len(page))

    async def _embed_page(self, page: list[tuple[int, str, str]], model: str,
                          space: Space | None, switching: bool) -> Space | None:
        """Embed a page (reusing vectors of ``model`` stored for the same texts) and store
        its vectors in one transaction; return the space (made now if there was none)."""
        store = self._indexes.require()
        texts = {h: t for _, h, t in page}
        cached = await asyncio.to_thread(store.cached_vectors, model, texts)
        todo = [(h, t) for h, t in texts.items() if h not in cached and h not in self._failed]
        fresh = await embed_refusing(self._current, todo, model, self._failed) if todo else {}
        by_hash = {**cached, **fresh}
        if not by_hash:
            return space
        if space is None:
            dim = len(next(iter(by_hash.values())))
            space = await asyncio.to_thread(self._make_space, model, dim, switching)
        vectors = {k: np.asarray(by_hash[h], dtype=np.float32).reshape(-1)
                   for k, h, _ in page if h in by_hash}
        if await asyncio.to_thread(store.add_vectors, space, vectors) is None:
            raise _Superseded
        return space

    def _make_space(self, model: str, dim: int, switching: bool) -> Space:
        """The space of the first vectors: the corpus's (the first model sets it), or
        the target of the switch this run asks for. Blocking.

        Raises:
            EmbeddingModelMismatch: another node set the corpus's model first.
        """
        store = self._indexes.require()
        if switching:
            _log.warning("switching the shared corpus to another embedding model",
                         model=model, corpus=self._indexes.vector_model,
                         store=store.target)
            space = store.request_switch(model, dim)
        else:
            space = Space(store.use_embedding_model(model, dim), model, dim)
        self._indexes.spaces_sync()
        return space
