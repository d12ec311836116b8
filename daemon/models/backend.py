"""What serves a role's calls: one interface, three implementations.

The servicers (Inference, Answer) and the retrieval bridge call a role through
:class:`InferenceBackend` and never ask what is behind it:

- :class:`ChildBackend`: a child llamad supervises (llama-server or the bundled runtime)
  on loopback; its model facts (context, SHA-256) come from the GGUF file it was launched
  with.
- :class:`EndpointBackend`: an external OpenAI-compatible server; its facts come from
  what the server reports.
- :class:`DisabledBackend`: nothing serves the role; every call is refused with
  FAILED_PRECONDITION, before it queues.

A role's backend is made per call by :meth:`daemon.models.model.Model.backend` (the
one place that maps a mode to an implementation), so a call started before a swap or a
mode switch finishes on what it started with, and the next call gets the new one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from supervisor import (
    LLAMA_CPP,
    Chunk,
    Dialect,
    EmbedResult,
    EndpointClient,
    InferenceClient,
    Message,
    Sampling,
    ToolUse,
    Turn,
    choose_chat_template,
)

from ..errors import Disabled, FailedPrecondition, InvalidArgument, ModelUnloaded, RequestError
from .lanes import texts_per_request

if TYPE_CHECKING:
    from .children import Setup

Messages = Sequence[Message]


class InferenceBackend(Protocol):
    """A role's inference, whatever serves it."""

    @property
    def model_name(self) -> str:
        """The model name callers are told served them."""
        ...

    @property
    def identity(self) -> str:
        """Names what produces the outputs (vectors, cached answers): stable across
        restarts of the same model, different for another model; "" while not known
        yet (a child's SHA-256 is computed after it starts)."""
        ...

    @property
    def provisional_identity(self) -> str:
        """:attr:`identity`, or while it is not known a cheaper stand-in (file name and
        size) good enough for a cache key; "" when nothing serves."""
        ...

    @property
    def context_tokens(self) -> int:
        """Tokens one request may hold (prompt and completion); 0 when unknown."""
        ...

    @property
    def refusal(self) -> RequestError | None:
        """Why no call can be served at all (a disabled role), checked before queueing;
        None when calls go through."""
        ...

    @property
    def dialect(self) -> Dialect:
        """Which generation parameters the runtime takes (the servicers refuse the others
        by name before starting a stream)."""
        ...

    def stream_completion(self, prompt: str, sampling: Sampling) -> AsyncIterator[Chunk]: ...

    def stream_chat(self, messages: Messages, sampling: Sampling,
                    tools: ToolUse | None = None) -> AsyncIterator[Chunk]:
        """The chat's stream; with ``tools``, passed to the model's chat template.

        Raises:
            InvalidArgument: at once, ``tools`` for a model that cannot take them.
        """
        ...

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult: ...

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids from the model's own tokenizer.

        Raises:
            supervisor.TokenizeUnavailableError: the server has no tokenizer (endpoints).
        """
        ...

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids of the model's own tokenizer.

        Raises:
            InvalidArgument: an id outside the model's vocabulary (known for a child).
            supervisor.TokenizeUnavailableError: the server has no tokenizer (endpoints).
        """
        ...

    async def apply_template(self, messages: Messages, tools: ToolUse | None = None) -> str:
        """The prompt the model's chat template renders for a chat (what a chat call
        tokenizes).

        Raises:
            supervisor.TokenizeUnavailableError: the runtime renders no template on
                request (the bundled runtime, endpoints that are not llama-server).
        """
        ...


class _ClientBackend:
    """The calls of a backend that has an HTTP client: passed straight to it."""

    refusal: RequestError | None = None

    def __init__(self, client: InferenceClient) -> None:
        self.client = client

    @property
    def model_name(self) -> str:
        return self.client.model_name

    @property
    def dialect(self) -> Dialect:
        return self.client.dialect

    def stream_completion(self, prompt: str, sampling: Sampling) -> AsyncIterator[Chunk]:
        return self.client.stream_completion(prompt, sampling)

    def stream_chat(self, messages: Messages, sampling: Sampling,
                    tools: ToolUse | None = None) -> AsyncIterator[Chunk]:
        self._check_chat(messages, tools)
        return self.client.stream_chat(messages, sampling, tools)

    def _check_chat(self, messages: Messages, tools: ToolUse | None) -> None:
        """Refuses ``tools`` when the server cannot take them (its chat template renders
        none, or its runtime passes none): never sent to be dropped silently."""
        refusal = self.client.tools_refusal
        if refusal and tools is not None:
            raise InvalidArgument(f"tools: the model {self.model_name!r} cannot take tools: "
                                  f"{refusal}", field="tools")
        if refusal and any(isinstance(m, Turn) for m in messages):
            raise InvalidArgument(f"messages: the model {self.model_name!r} cannot take tool "
                                  f"calls or tool messages: {refusal}", field="messages")

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult:
        per = texts_per_request()  # a batch or background call's share of the child's slots
        if not per or len(texts) <= per:
            return await self.client.embed(texts)
        parts = [await self.client.embed(texts[i:i + per]) for i in range(0, len(texts), per)]
        return EmbedResult(np.concatenate([p.matrix for p in parts]),
                           sum(p.prompt_tokens for p in parts))

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return await self.client.tokenize(text, add_special=add_special)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await self.client.detokenize(tokens)

    async def apply_template(self, messages: Messages, tools: ToolUse | None = None) -> str:
        self._check_chat(messages, tools)
        return await self.client.apply_template(messages, tools)


class ChildBackend(_ClientBackend):
    """A supervised child, launched with ``setup`` (None: no model configured)."""

    def __init__(self, client: InferenceClient, setup: Setup | None) -> None:
        super().__init__(client)
        self._setup = setup

    def _check_chat(self, messages: Messages, tools: ToolUse | None) -> None:
        """A chat (or its template rendered), unless the model has no chat template llamad
        can trust (its GGUF carries none and none is known for it): then
        FAILED_PRECONDITION naming the problem, never a generic template's guess.

        Raises:
            FailedPrecondition: the model has no usable chat template.
        """
        setup = self._setup
        if setup is not None and setup.model.info is not None and not setup.spec.embedding:
            template = choose_chat_template(setup.model.info, setup.spec.chat_template or "")
            if not template.usable:
                raise FailedPrecondition(f"Chat and Ask need a chat template: "
                                         f"{template.reason}")
        super()._check_chat(messages, tools)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """Checks the ids against the GGUF's vocabulary first: llama-server answers an id
        outside it with a 500, which would count against the child."""
        info = self._setup.model.info if self._setup is not None else None
        _check_ids(tokens, info.vocab_size if info is not None else 0)
        return await super().detokenize(tokens)

    @property
    def identity(self) -> str:
        """The GGUF file's name and SHA-256 prefix ("" until it is hashed)."""
        if self._setup is None or not self._setup.model.sha256:
            return ""
        model = self._setup.model
        return f"{model.path.name}@{model.sha256[:16]}"

    @property
    def provisional_identity(self) -> str:
        if self.identity or self._setup is None:
            return self.identity or self.client.model_name
        path = self._setup.model.path
        return f"{path.name}@{path.stat().st_size}"

    @property
    def context_tokens(self) -> int:
        """The configured context, else the model's trained one. An embedding model's
        positions end at its trained context whatever is configured: the smaller one."""
        if self._setup is None:
            return 0
        info, spec = self._setup.model.info, self._setup.spec
        trained = info.context_length if info else 0
        if spec.embedding:
            sizes = [c for c in (trained, spec.ctx_size) if c]
            return min(sizes) if sizes else 0
        return spec.ctx_size or trained


class EndpointBackend(_ClientBackend):
    """An external OpenAI-compatible server."""

    def __init__(self, client: EndpointClient) -> None:
        super().__init__(client)
        self.endpoint = client

    @property
    def identity(self) -> str:
        """The model id and the endpoint's root."""
        return f"endpoint:{self.endpoint.identity}"

    @property
    def provisional_identity(self) -> str:
        return self.identity

    @property
    def context_tokens(self) -> int:
        """What the server reports for the model (0: it does not say)."""
        return self.endpoint.context_length

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """Checks the ids against the vocabulary llama-server reports (``meta.n_vocab``
        of ``/v1/models``) when it does."""
        meta = self.endpoint.model_meta.get("meta")
        size = meta.get("n_vocab") if isinstance(meta, dict) else None
        _check_ids(tokens, size if isinstance(size, int) else 0)
        return await super().detokenize(tokens)


def _check_ids(tokens: Sequence[int], size: int) -> None:
    """Refuses an id outside a vocabulary of ``size`` tokens (0: not known)."""
    bad = next((t for t in tokens if size and not 0 <= t < size), None)
    if bad is not None:
        raise InvalidArgument(f"tokens: {bad} is not a token id of the model (its ids run "
                              f"from 0 to {size - 1})", field="tokens")


class DisabledBackend:
    """A role switched off: every call is refused, naming how to switch it on."""

    model_name = ""
    identity = ""
    provisional_identity = ""
    context_tokens = 0
    dialect = LLAMA_CPP  # never asked: every call is refused first

    def __init__(self, role: str, unloaded: str = "") -> None:
        self.role = role
        self.unloaded = unloaded  # why the model pool unloaded it ("": disabled)

    @property
    def refusal(self) -> RequestError:
        if self.unloaded:
            return ModelUnloaded(
                f"the model was unloaded ({self.unloaded}) while this call waited for it; "
                "calling again loads it")
        return Disabled(
            f"{self.role} is disabled ({self.role}.mode = disabled); ControlService/SetMode "
            "switches it to a supervised child or an endpoint")

    def stream_completion(self, prompt: str, sampling: Sampling) -> AsyncIterator[Chunk]:
        raise self.refusal

    def stream_chat(self, messages: Messages, sampling: Sampling,
                    tools: ToolUse | None = None) -> AsyncIterator[Chunk]:
        raise self.refusal

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult:
        raise self.refusal

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        raise self.refusal

    async def detokenize(self, tokens: Sequence[int]) -> str:
        raise self.refusal

    async def apply_template(self, messages: Messages, tools: ToolUse | None = None) -> str:
        raise self.refusal
