"""A scripted inference backend and a role around it, for unit tests of the servicers
(Inference, Answer) through the real router and admission, with no child process.

:class:`FakeBackend` implements :class:`daemon.models.backend.InferenceBackend`; it records what
it was asked and answers from its script. :class:`FakeRole` is what the router needs of a
role: a real :class:`daemon.models.admission.Admission` and the backend (or the error a role that
is not ready raises).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from daemon.errors import InvalidArgument, RequestError
from daemon.models.admission import Admission
from daemon.models.backend import InferenceBackend
from supervisor import (
    LLAMA_CPP,
    ChildRequestError,
    Chunk,
    Dialect,
    EmbedResult,
    Message,
    Sampling,
    SupervisorError,
    TokenizeUnavailableError,
    TokenLogprobs,
    ToolCallDelta,
    ToolUse,
)


@dataclass
class FakeBackend:
    """Streams ``pieces`` (one token each) then a final chunk; embeds each text (or token
    ids) as ``[len(text), 0, ..., 1]``; tokenizes into words. ``gate``, when set, holds every
    stream before its first piece until the test sets it. ``logprobs``, when set, gives
    each piece's tokens; ``dialect`` is the runtime's. ``tool_calls``, when set, gives
    the pieces of tool calls each piece carries; ``tools_refusal``, when set, refuses a
    chat with tools as a model without a tool template does."""

    model_name: str = "fake-model"
    identity: str = "fake.gguf@0123456789abcdef"
    context_tokens: int = 2048
    pieces: list[str] = field(default_factory=lambda: ["Hello", ",", " world"])
    finish: str = "length"
    prompt_tokens: int = 7
    dimension: int = 4
    fail_embed: ChildRequestError | None = None
    fail_stream_after: int | None = None
    gate: asyncio.Event | None = None
    prompts: list[str] = field(default_factory=list)
    chats: list[list[Message]] = field(default_factory=list)
    tool_uses: list[ToolUse | None] = field(default_factory=list)
    tool_calls: list[tuple[ToolCallDelta, ...]] | None = None
    tools_refusal: str = ""
    samplings: list[Sampling] = field(default_factory=list)
    embedded: list[list[str | Sequence[int]]] = field(default_factory=list)
    tokenized: list[tuple[str, bool]] = field(default_factory=list)
    no_template: str = ""  # set: apply_template raises TokenizeUnavailableError with it
    refusal: RequestError | None = None
    dialect: Dialect = LLAMA_CPP
    logprobs: list[tuple[TokenLogprobs, ...]] | None = None

    @property
    def provisional_identity(self) -> str:
        return self.identity or self.model_name

    def stream_completion(self, prompt: str, sampling: Sampling) -> AsyncIterator[Chunk]:
        self.prompts.append(prompt)
        self.samplings.append(sampling)
        return self._stream()

    def stream_chat(self, messages: Sequence[Message], sampling: Sampling,
                    tools: ToolUse | None = None) -> AsyncIterator[Chunk]:
        if tools is not None and self.tools_refusal:
            raise InvalidArgument(f"tools: the model {self.model_name!r} cannot take "
                                  f"tools: {self.tools_refusal}", field="tools")
        self.chats.append(list(messages))
        self.tool_uses.append(tools)
        self.samplings.append(sampling)
        return self._stream()

    async def _stream(self) -> AsyncIterator[Chunk]:
        if self.gate is not None:
            await self.gate.wait()
        for i, piece in enumerate(self.pieces):
            if self.fail_stream_after is not None and i == self.fail_stream_after:
                raise ChildRequestError("connection dropped by the child")
            probs = self.logprobs[i] if self.logprobs is not None else ()
            calls = self.tool_calls[i] if self.tool_calls is not None else ()
            yield Chunk(piece, 1, logprobs=probs, tool_calls=calls)
        yield Chunk("", 0, self.finish, self.prompt_tokens, len(self.pieces))

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult:
        self.embedded.append(list(texts))
        if self.fail_embed is not None:
            raise self.fail_embed
        matrix = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            matrix[i, 0], matrix[i, -1] = len(text), 1.0
        return EmbedResult(matrix, sum(len(t.split()) if isinstance(t, str) else len(t)
                                       for t in texts))

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        self.tokenized.append((text, add_special))
        words = [len(w) for w in text.split()]
        return [1, *words, 2] if add_special else words

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return " ".join("x" * t for t in tokens)

    async def apply_template(self, messages: Sequence[Message],
                             tools: ToolUse | None = None) -> str:
        if self.no_template:
            raise TokenizeUnavailableError(self.no_template)
        return "".join(f"<{m[0]}>{m[1]}" if isinstance(m, tuple) else f"<{m.role}>{m.content}"
                       for m in messages)


@dataclass
class FakeRole:
    """A role served by ``served`` (a backend), or not ready: ``unready`` is raised."""

    served: InferenceBackend
    admission: Admission = field(default_factory=lambda: Admission("generation", 1, 4))
    unready: SupervisorError | None = None
    serving_pid: int = 4242

    def backend(self) -> InferenceBackend:
        if self.unready is not None:
            raise self.unready
        return self.served
