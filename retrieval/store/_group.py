"""Group commit: writers that arrive together share one commit.

Each acknowledged write costs fsyncs (SQLite's WAL, tantivy's segment and meta files).
One at a time, a burst of N small documents pays N commits; here, while one commit runs,
the writes that arrive queue up and the next commit takes them all, so the burst pays
about one commit per batch, and each writer still returns only once *its* write is
durable.

The commits run in a task of their own, not in a writer's: a writer whose RPC is
cancelled stops waiting, but a commit that has begun is never abandoned halfway.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")

CommitFn = Callable[[list[T]], Awaitable[Sequence["R | BaseException"]]]

Vector = Sequence[float] | np.ndarray[Any, np.dtype[np.float32]]
"""One embedding: a row of float32s as the embedding child answered it, or numbers."""


class GroupCommitter(Generic[T, R]):
    """Batches concurrent :meth:`submit` calls into calls of ``commit``.

    ``commit(items)`` returns one result per item, in order: a value, or an exception for
    that writer alone. If it raises, every writer of the batch gets the exception.

    With ``in_flight`` 1 (the default) each commit runs with ``lock`` held (the writer
    lock other mutations also take), one batch at a time. A store that orders concurrent
    writers itself (PostgreSQL: each batch one transaction, as another node's would be)
    can take up to ``in_flight`` batches at once, each on its own connection, without
    ``lock``: while one batch waits on the server another is written. Then ``key`` (a
    document's id) keeps two versions of one document out of concurrent batches: an item
    waits while a batch under way holds its key, so its versions commit in the order
    they were submitted.
    """

    def __init__(self, commit: CommitFn[T, R], lock: asyncio.Lock, *,
                 max_batch: int = 256, in_flight: int = 1,
                 key: Callable[[T], Hashable] | None = None) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        if in_flight > 1 and key is None:
            raise ValueError("concurrent batches need a key")
        self._commit = commit
        self._lock = lock
        self._max_batch = max_batch
        self._in_flight = in_flight
        self._key = key
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._busy: set[Hashable] = set()   # the keys of the batches under way
        self.commits = 0            # batches committed (for tests and benchmarks)

    async def submit(self, item: T) -> R:
        """Queue ``item`` and return its result once its batch is committed."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._start()
        return await future

    async def close(self) -> None:
        """Wait for the commits under way (and those queued) to finish."""
        while self._running:
            await asyncio.shield(asyncio.gather(*self._running, return_exceptions=True))

    def _start(self) -> None:
        """Start batches of the waiting items while a slot is free."""
        while self._waiting and len(self._running) < self._in_flight:
            batch = self._take()
            if not batch:
                return  # every waiting item's document is in a batch under way
            task = asyncio.create_task(self._run(batch), name="group-commit")
            self._running.add(task)
            # A done callback, not the task's own finally: a task cancelled before it
            # first ran (a loop shutting down) never runs its finally.
            task.add_done_callback(functools.partial(self._ended, batch))

    def _ended(self, batch: list[tuple[T, asyncio.Future[R]]],
               task: asyncio.Task[None]) -> None:
        """A batch's task is done: free its slot and keys, then start the next batch;
        stopped (cancelled, or a BaseException), fail its writers and those waiting:
        nobody waits forever."""
        self._running.discard(task)
        if self._key is not None:
            self._busy -= {self._key(item) for item, _ in batch}
        stopped: BaseException | None = (asyncio.CancelledError() if task.cancelled()
                                          else task.exception())
        if stopped is None:
            self._start()  # the items that came meanwhile, or waited for a key
            return
        for _, future in batch + self._waiting:
            if not future.done():
                future.set_exception(RuntimeError(f"ingest stopped: {stopped!r}"))
        self._waiting.clear()

    def _take(self, room: int | None = None) -> list[tuple[T, asyncio.Future[R]]]:
        """The next batch: the oldest items, at most ``room`` (``max_batch``), none whose
        key a batch under way holds (those wait, with every later item of their key)."""
        room = self._max_batch if room is None else room
        if self._key is None:
            batch = self._waiting[:room]
            del self._waiting[:room]
            return batch
        batch, kept, keys = [], [], set()
        for entry in self._waiting:
            key = self._key(entry[0])
            if key in self._busy or len(batch) >= room:
                kept.append(entry)
            else:
                batch.append(entry)
                keys.add(key)
        self._waiting = kept
        self._busy |= keys
        return batch

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        if self._in_flight == 1:
            async with self._lock:
                # The items that came while another mutation held the lock join (the
                # list is the one _ended gets).
                batch += self._take(self._max_batch - len(batch))
                results = await self._results(batch)
        else:
            results = await self._results(batch)
        self.commits += 1
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # the writer stopped waiting (its RPC was cancelled)
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _results(self, batch: list[tuple[T, asyncio.Future[R]]]
                       ) -> Sequence[R | BaseException]:
        """``commit``'s results for the batch; its exception as every item's."""
        try:
            results = await self._commit([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"commit returned {len(results)} results "
                                   f"for {len(batch)} items")
            return results
        except Exception as exc:  # every writer of the batch learns why
            return [exc] * len(batch)


class EmbedBatcher:
    """Embeds texts from concurrent ingests together: requests of up to ``batch`` texts,
    at most ``concurrency`` in flight, each gathering whatever texts are waiting (several
    documents' chunks in one request: the embedding child's best case).

    Bound to one embedder: the retriever makes a new batcher when the embedder changes.
    """

    def __init__(self, embed: Callable[[list[str]], Awaitable[Sequence[Vector]]], *,
                 batch: int, concurrency: int) -> None:
        self._embed = embed
        self._batch = max(1, batch)
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._waiting: list[tuple[str, asyncio.Future[Vector]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self.requests = 0           # embedding requests sent (for tests and benchmarks)

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        """One vector per text, in order; raises what the embedder raised."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Vector]] = []
        for text in texts:
            future: asyncio.Future[Vector] = loop.create_future()
            self._waiting.append((text, future))
            futures.append(future)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="embed-batcher")
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for future in futures:
                future.cancel()  # still queued ones are dropped by the runner
            raise

    async def _run(self) -> None:
        while self._waiting:
            await self._slots.acquire()
            batch: list[tuple[str, asyncio.Future[Vector]]] = []
            while self._waiting and len(batch) < self._batch:
                text, future = self._waiting.pop(0)
                if not future.done():
                    batch.append((text, future))
            if not batch:
                self._slots.release()
                continue
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[str, asyncio.Future[Vector]]]) -> None:
        try:
            self.requests += 1
            vectors = await self._embed([text for text, _ in batch])
            if len(vectors) != len(batch):
                raise RuntimeError(f"{len(vectors)} vectors for {len(batch)} texts")
        except Exception as exc:
            if len(batch) > 1:
                # One bad text must not fail the other documents' texts sent with it.
                for text, future in batch:
                    await self._send_alone(text, future)
            else:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
        else:
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.done():
                    future.set_result(vector)
        finally:
            self._slots.release()

    async def _send_alone(self, text: str, future: asyncio.Future[Vector]) -> None:
        if future.done():
            return
        try:
            self.requests += 1
            vectors = await self._embed([text])
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(vectors[0])
