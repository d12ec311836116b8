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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")

CommitFn = Callable[[list[T]], Awaitable[Sequence["R | BaseException"]]]

Vector = Sequence[float] | np.ndarray[Any, np.dtype[np.float32]]
"""One embedding: a row of float32s as the embedding child answered it, or numbers."""


class GroupCommitter(Generic[T, R]):
    """Batches concurrent :meth:`submit` calls into calls of ``commit``.

    ``commit(items)`` runs with ``lock`` held (the writer lock other mutations also
    take), one batch at a time, and returns one result per item, in order: a value, or
    an exception for that writer alone. If it raises, every writer of the batch gets the
    exception.
    """

    def __init__(self, commit: CommitFn[T, R], lock: asyncio.Lock, *,
                 max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._commit = commit
        self._lock = lock
        self._max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.commits = 0            # batches committed (for tests and benchmarks)

    async def submit(self, item: T) -> R:
        """Queue ``item`` and return its result once its batch is committed."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="group-commit")
        return await future

    async def close(self) -> None:
        """Wait for the commits under way (and those queued) to finish."""
        if self._runner is not None:
            await asyncio.shield(self._runner)

    async def _run(self) -> None:
        while self._waiting:
            async with self._lock:
                batch = self._waiting[:self._max_batch]
                del self._waiting[:self._max_batch]
                try:
                    results = await self._commit([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"commit returned {len(results)} results "
                                           f"for {len(batch)} items")
                except Exception as exc:  # every writer of the batch learns why
                    results = [exc] * len(batch)
                except BaseException as exc:  # cancelled (shutdown): nobody waits forever
                    for _, future in batch + self._waiting:
                        if not future.done():
                            future.set_exception(RuntimeError(f"ingest stopped: {exc!r}"))
                    self._waiting.clear()
                    raise
                self.commits += 1
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # the writer stopped waiting (its RPC was cancelled)
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)


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
