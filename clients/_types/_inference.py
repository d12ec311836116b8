"""What generation, chat, embedding and tokenizing calls return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

ChatRole: TypeAlias = Literal["system", "user", "assistant"]
"""Who says a chat message (or a turn of Ask's history)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message (or one turn of Ask's history)."""

    role: ChatRole
    content: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and speed of one generation, measured by the daemon."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    time_to_first_token_ms: float = 0.0
    tokens_per_second: float = 0.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token and its log-probability (natural log); ``id`` when the runtime reports
    it (llama.cpp does)."""

    token: str
    logprob: float
    bytes: bytes = b""
    id: int | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A generated token (``chosen``) and the likeliest alternatives (``top``, at most
    ``top_logprobs`` of them, likeliest first)."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    """A piece of generated text, as the model produced it.

    The last chunk of a stream has ``finish_reason`` (``"stop"`` or ``"length"``) and
    ``usage``; earlier ones have None for both. ``logprobs`` has the chunk's tokens when
    the call asked for them (``logprobs=True``).
    """

    text: str
    tokens: int
    model: str
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A whole generation: the concatenated text, why it ended, its usage, and every
    token's logprobs when the call asked for them."""

    text: str
    model: str
    finish_reason: str
    usage: Usage
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One vector per input text, in order."""

    vectors: tuple[tuple[float, ...], ...]
    model: str
    dimension: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token ids of a text, from the chosen model's own tokenizer."""

    ids: tuple[int, ...]
    count: int
    model: str
