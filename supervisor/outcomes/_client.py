"""A child's inference client whose calls are recorded as outcomes (issue 28).

:class:`WatchedClient` is the :class:`~supervisor._client.InferenceClient` of a child
llamad launched: every completion, chat and embedding call on it tells its
:class:`~supervisor.outcomes.Outcomes` how it ended (and when the child spoke), and a
call waiting on a child taken out of service ends at once with
:class:`~supervisor.errors.ChildUnresponsiveError` naming why, instead of hanging until
its deadline. Requests the client makes for itself (health, the readiness and outcome
probes, tokenize) are not calls.

Cost per streamed chunk (the relay's hot path): one generator step and a counter, 0.1-0.9
us (median about 0.6) at load 12 on a 2-core machine, where the relay spends about 9 us
per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from .._client import EmbedResult, InferenceClient
from .._sampling import Sampling
from .._tools import Message, ToolUse
from ..errors import ChildBadRequestError, ChildRequestError
from ..http._events import Chunk
from ._watch import Outcomes

T = TypeVar("T")


class WatchedClient(InferenceClient):
    """:class:`InferenceClient` whose calls are :attr:`outcomes` (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes = Outcomes(self.activity.now)

    def stream_completion(self, prompt: str, sampling: Sampling) -> AsyncIterator[Chunk]:
        return self._watched_stream(super().stream_completion(prompt, sampling))

    def stream_chat(self, messages: Sequence[Message], sampling: Sampling,
                    tools: ToolUse | None = None) -> AsyncIterator[Chunk]:
        return self._watched_stream(super().stream_chat(messages, sampling, tools))

    async def complete(self, prompt: str, sampling: Sampling) -> str:
        return await self._watched(super().complete(prompt, sampling))

    async def complete_chat(self, messages: Sequence[Message], sampling: Sampling) -> str:
        return await self._watched(super().complete_chat(messages, sampling))

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult:
        return await self._watched(super().embed(texts))

    async def probe(self, embedding: bool) -> str | None:
        """The outcome watch's 1-token probe (not counted as a call): None when the child
        answered it, else why it failed."""
        try:
            if embedding:
                await InferenceClient.embed(self, ["ready"])
            else:
                await InferenceClient.complete(self, "Hello",
                                               Sampling(max_tokens=1, temperature=0.0))
        except ChildRequestError as exc:
            return str(exc)
        return None

    async def _watched(self, answer: Awaitable[T]) -> T:
        outcomes = self.outcomes
        try:
            call = outcomes.begin(stream=False)
        except ChildRequestError:
            if asyncio.iscoroutine(answer):
                answer.close()  # never awaited: no "was never awaited" warning
            raise
        call.waiting = True
        try:
            result = await answer
        except asyncio.CancelledError:
            if outcomes.interrupted(call):
                raise outcomes.error() from None
            raise
        except ChildBadRequestError:
            raise  # the request's own fault, not the child's
        except ChildRequestError as exc:
            outcomes.failed(str(exc))
            raise
        finally:
            call.waiting = False
            outcomes.end(call)
        outcomes.heard()
        outcomes.succeeded()
        return result

    async def _watched_stream(self, chunks: AsyncIterator[Chunk]) -> AsyncGenerator[Chunk, None]:
        outcomes = self.outcomes
        call = outcomes.begin(stream=True)
        tokens = 0
        last: Chunk | None = None
        step = chunks.__anext__
        try:
            while True:
                call.waiting = True
                try:
                    chunk = await step()
                except StopAsyncIteration:
                    break
                finally:
                    call.waiting = False
                outcomes.beats += 1  # outcomes.heard(), inline: once per chunk
                tokens += chunk.tokens
                last = chunk
                yield chunk
        except asyncio.CancelledError:
            if outcomes.interrupted(call):
                raise outcomes.error() from None
            raise
        except ChildBadRequestError:
            raise
        except ChildRequestError as exc:
            outcomes.failed(str(exc))
            raise
        finally:
            outcomes.end(call)
            closing = getattr(chunks, "aclose", None)
            if closing is not None:
                await closing()
        if (tokens == 0 and self.dialect.llama_cpp and last is not None
                and last.prompt_tokens is None and not last.completion_tokens):
            # llama-server always reports usage (stream_options.include_usage): an answer
            # with neither a token nor usage is a broken one, not an empty generation.
            outcomes.failed("the stream ended with no token and no usage")
        else:
            outcomes.succeeded()
