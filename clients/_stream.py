"""Server streams as iterators that cancel their RPC when abandoned.

A stream cancels its gRPC call (``call.cancel()``) when it ends in any way: exhausted,
failed, ``close()``/``aclose()``, leaving its ``with`` block, a ``break`` out of the loop
that was its only reference, or being garbage collected. The daemon sees the
cancellation and stops the work (a generation stops in the child at once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc

from . import _tools
from ._types import AskEvent, AskResult, GenerateChunk, GenerateResult, Usage
from .errors import Cancelled, from_rpc_error

T = TypeVar("T")


def _iterate(call: Any, convert: Callable[[Any], T | None]) -> Generator[T, None, None]:
    try:
        for msg in call:
            item = convert(msg)
            if item is not None:
                yield item
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from exc
    finally:
        # Runs on exhaustion, error, close() and garbage collection (a `break` out of a
        # for loop drops the last reference at once in CPython): the daemon stops working.
        call.cancel()


class Stream(Generic[T]):
    """An iterator over a server stream (sync). Closing it cancels the call.

    Iterating raises a :class:`~clients.errors.LlamadError` when the call fails. Use it in
    a ``with`` block (or call :meth:`close`) when you keep a reference and stop early;
    :meth:`cancel` may be called from another thread to interrupt a blocked iteration.
    """

    def __init__(self, call: Any, convert: Callable[[Any], T | None]) -> None:
        self._call = call
        self._items = _iterate(call, convert)

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def cancel(self) -> None:
        """Cancel the call (thread-safe); a blocked iteration raises ``Cancelled``."""
        self._call.cancel()

    def close(self) -> None:
        """Cancel the call (if still running) and end the iteration."""
        self._call.cancel()
        self._items.close()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _generate_result(chunks: list[GenerateChunk]) -> GenerateResult:
    last = chunks[-1] if chunks else None
    return GenerateResult(
        text="".join(c.text for c in chunks),
        model=last.model if last else "",
        finish_reason=(last.finish_reason if last else None) or "unspecified",
        usage=(last.usage if last else None) or Usage(),
        logprobs=tuple(entry for c in chunks for entry in c.logprobs),
        model_name=next((c.model_name for c in reversed(chunks) if c.model_name), ""),
        tool_calls=_tools.joined(d for c in chunks for d in c.tool_calls),
    )


class TextStream(Stream[GenerateChunk]):
    """A Generate or Chat stream: :class:`GenerateChunk` s as the model produces them."""

    def collect(self) -> GenerateResult:
        """Read the rest of the stream and return the whole text with its usage."""
        with self:
            return _generate_result(list(self))


class AskStream(Stream[AskEvent]):
    """An Ask stream: :class:`AskText` events, then one :class:`AskSources`, then one
    :class:`AskDone`."""

    def collect(self) -> AskResult:
        """Read the rest of the stream and return the whole answer and its sources."""
        with self:
            return AskResult.of(self)


class AsyncStream(Generic[T]):
    """An async iterator over a server stream. Closing it cancels the call.

    ``aclose()``, leaving ``async with``, or dropping the last reference (``break`` out of
    ``async for``) cancels the call at once; iterating raises a
    :class:`~clients.errors.LlamadError` when the call fails. Cancelling the task that
    iterates cancels the call too.
    """

    def __init__(self, call: Any, convert: Callable[[Any], T | None]) -> None:
        self._call = call
        self._convert = convert

    def __aiter__(self) -> AsyncStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            while True:
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    raise StopAsyncIteration
                item = self._convert(msg)
                if item is not None:
                    return item
        except grpc.RpcError as exc:
            self._call.cancel()
            raise from_rpc_error(exc) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._call.cancelled() and (task is None or not task.cancelling()):
                # cancel() was called on the stream, not on this task: a call error.
                raise Cancelled("the call was cancelled", code="CANCELLED") from None
            self._call.cancel()  # this task is being cancelled: so is the RPC
            raise
        except BaseException:
            # StopAsyncIteration (done: cancel is a no-op), or anything else.
            self._call.cancel()
            raise

    def cancel(self) -> None:
        """Cancel the call; a pending read raises ``Cancelled``."""
        self._call.cancel()

    async def aclose(self) -> None:
        """Cancel the call (if still running)."""
        self._call.cancel()

    def __del__(self) -> None:
        # An async generator's finaliser would only run later on the loop; cancelling
        # here stops the daemon's work as soon as the stream is dropped.
        call = getattr(self, "_call", None)
        if call is not None:
            with contextlib.suppress(Exception):  # the loop may be gone at interpreter exit
                call.cancel()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class AsyncTextStream(AsyncStream[GenerateChunk]):
    """An async Generate or Chat stream of :class:`GenerateChunk` s."""

    async def collect(self) -> GenerateResult:
        """Read the rest of the stream and return the whole text with its usage."""
        async with self:
            return _generate_result([c async for c in self])


class AsyncAskStream(AsyncStream[AskEvent]):
    """An async Ask stream: text events, then one AskSources, then one AskDone."""

    async def collect(self) -> AskResult:
        """Read the rest of the stream and return the whole answer and its sources."""
        async with self:
            return AskResult.of([e async for e in self])
