"""What generation, chat, embedding and tokenizing calls return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

ChatRole: TypeAlias = Literal["system", "user", "assistant", "tool"]
"""Who says a chat message (or a turn of Ask's history, which has no ``tool``)."""

ToolChoice: TypeAlias = Literal["auto", "none", "required"] | str
"""OpenAI's ``tool_choice``: ``auto`` (the default), ``none``, ``required``, or the name of
one of the call's tools, which the model must call."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of a tool the assistant made: ``arguments`` is JSON text (an object), as the
    model wrote it; a ``tool`` message answering it names ``id``."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call as it streams: the first piece of call ``index`` has its
    ``id`` and ``name``; the later ones more of its ``arguments``."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call (``Client.chat(tools=...)``; a mapping in OpenAI's
    ``{"type": "function", "function": {...}}`` shape is taken too).

    Attributes:
        name: letters, digits, ``_`` and ``-``, at most 64 characters.
        description: what it does, for the model.
        parameters: its parameters' JSON Schema (a mapping or JSON text; None: none).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message (or one turn of Ask's history).

    An ``assistant`` message may carry the ``tool_calls`` it made (its content may then be
    empty); a ``tool`` message is the result of one of them and names it in
    ``tool_call_id``.
    """

    role: ChatRole
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


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
    model_name: str = ""
    """The catalog name of the model that served the call (``model`` is its file name)."""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A whole generation: the concatenated text, why it ended, its usage, and every
    token's logprobs when the call asked for them."""

    text: str
    model: str
    finish_reason: str
    usage: Usage
    logprobs: tuple[TokenLogprobs, ...] = ()
    model_name: str = ""
    """The catalog name of the model that served the call (``model`` is its file name)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The tools the model called (``finish_reason`` is then ``tool_calls``), each joined
    from its pieces."""


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One vector per input text, in order."""

    vectors: tuple[tuple[float, ...], ...]
    model: str
    dimension: int
    prompt_tokens: int
    model_name: str = ""
    """The catalog name of the model that served the call (``model`` is its file name)."""


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token ids of a text, from the chosen model's own tokenizer."""

    ids: tuple[int, ...]
    count: int
    model: str
    model_name: str = ""
    """The catalog name of the model that served the call (``model`` is its file name)."""
