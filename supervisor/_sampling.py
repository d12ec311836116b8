"""Generation parameters, and the form each runtime takes them in.

:class:`Sampling` is llamad's one internal representation of a generation request's
controls: the gRPC ``SamplingParams`` are validated into it, and its names and ranges are
OpenAI's where OpenAI has the parameter, so the HTTP API can map a request's JSON onto it
field by field. :meth:`Sampling.to_json` writes it in the form a runtime's API takes, as
described by its :class:`Dialect`:

* :data:`LLAMA_CPP` — llama-server (a child, or an endpoint whose ``/v1/models`` says
  ``owned_by: llamacpp``) takes everything, in its native names: ``n_probs`` for
  logprobs on both routes, ``json_schema`` on ``/v1/completions`` (which ignores
  ``response_format``), ``logit_bias`` as ``[token or text, bias]`` pairs, ``grammar``,
  ``dry_*`` (tools/server/server-schema.cpp, llama.cpp as vendored by llama-cpp-python
  0.3.36).
* :data:`BUNDLED` — ``python -m llama_cpp.server`` takes min_p, the penalties, a grammar
  and logit_bias by token id; its request models ignore unknown fields, so everything
  else is refused rather than sent.
* :data:`OPENAI` — any other endpoint: only OpenAI's own parameters (penalties,
  logit_bias by token id, logprobs, response_format on chat).

A parameter the dialect does not take is never sent and never dropped quietly:
:meth:`Sampling.check` raises :class:`~supervisor.errors.UnsupportedParameterError`
naming it and the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .errors import UnsupportedParameterError

EXTENDED = ("min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
            "frequency_penalty", "logit_bias", "logit_bias_text", "logprobs",
            "response_format", "grammar", "dry_multiplier", "dry_base", "dry_allowed_length",
            "dry_penalty_last_n")
"""The parameters a runtime may lack (``logit_bias_text``: biases given by text). The
others (max_tokens, temperature, top_p, top_k, seed, stop) every runtime takes."""

_NATIVE_SAME_NAME = ("min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
                     "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
                     "dry_penalty_last_n")


@dataclass(frozen=True)
class Dialect:
    """What a runtime's OpenAI-compatible API takes beyond the base parameters.

    Attributes:
        runtime: names the runtime in a refusal ("llama-server", "the endpoint at ...").
        llama_cpp: it takes llama.cpp's native fields (``n_probs``, ``json_schema``,
            ``grammar``, ``dry_*``, logit_bias pairs).
        accepts: the :data:`EXTENDED` parameters it takes.
        chat_only: those of ``accepts`` it takes on chat completions only.
    """

    runtime: str
    llama_cpp: bool
    accepts: frozenset[str]
    chat_only: frozenset[str] = frozenset()

    def named(self, runtime: str) -> Dialect:
        """The same dialect, naming another runtime in refusals."""
        return Dialect(runtime, self.llama_cpp, self.accepts, self.chat_only)


LLAMA_CPP = Dialect("llama-server", True, frozenset(EXTENDED))
BUNDLED = Dialect("the bundled llama-cpp-python runtime (llama-server takes it)", False,
                  frozenset({"min_p", "repeat_penalty", "presence_penalty",
                             "frequency_penalty", "logit_bias", "grammar"}))
OPENAI = Dialect("an OpenAI-compatible endpoint that is not llama.cpp", False,
                 frozenset({"presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
                            "response_format"}),
                 chat_only=frozenset({"response_format"}))


def _takes(dialect: Dialect, name: str, chat: bool) -> bool:
    return name in dialect.accepts and (chat or name not in dialect.chat_only)


@dataclass(frozen=True)
class LogitBias:
    """A bias added to the logit of one token (``token`` an id) or of every token of a
    text (``token`` a string; llama.cpp only)."""

    token: int | str
    bias: float


@dataclass(frozen=True)
class Sampling:
    """Generation parameters, already validated and defaulted (None: the runtime's own).

    ``response_format`` is None (free text), ``"json_object"`` or ``"json_schema"``
    (then ``json_schema`` holds the schema as JSON text, ``schema_name`` its name).
    ``top_logprobs`` counts alternatives per token when ``logprobs`` is set.
    ``defaulted`` names the :data:`EXTENDED` parameters set by llamad's configured
    defaults rather than by the caller (Chat's and Ask's repetition guard): sent to a
    runtime that takes them, left out — not refused — for one that does not.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[LogitBias, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: str | None = None
    json_schema: str | None = None
    schema_name: str = ""
    grammar: str | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    defaulted: frozenset[str] = frozenset()

    def requested(self) -> list[str]:
        """The :data:`EXTENDED` parameters this request sets, in that order (configured
        defaults included)."""
        names = [n for n in _NATIVE_SAME_NAME if getattr(self, n) is not None]
        if any(isinstance(b.token, int) for b in self.logit_bias):
            names.append("logit_bias")
        if any(isinstance(b.token, str) for b in self.logit_bias):
            names.append("logit_bias_text")
        if self.logprobs:
            names.append("logprobs")
        if self.response_format is not None:
            names.append("response_format")
        if self.grammar is not None:
            names.append("grammar")
        return sorted(names, key=EXTENDED.index)

    def check(self, dialect: Dialect, *, chat: bool) -> None:
        """Refuse what ``dialect`` cannot take.

        Raises:
            UnsupportedParameterError: naming each such parameter and the runtime.
        """
        refused = [n for n in self.requested()
                   if not _takes(dialect, n, chat) and n not in self.defaulted]
        if refused:
            where = dialect.runtime if chat or not any(
                n in dialect.chat_only for n in refused) else f"{dialect.runtime} on Generate"
            raise UnsupportedParameterError(refused, where)

    def to_json(self, dialect: Dialect = LLAMA_CPP, *, chat: bool = False) -> dict[str, Any]:
        """The request fields for ``dialect``'s ``/v1/chat/completions`` (``chat``) or
        ``/v1/completions``.

        Raises:
            UnsupportedParameterError: a parameter ``dialect`` cannot take (see
                :meth:`check`).
        """
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if not self._extended():
            return body  # the common case: nothing more to write or check
        self.check(dialect, chat=chat)
        for name in _NATIVE_SAME_NAME:
            value = getattr(self, name)
            if value is not None and (name not in self.defaulted
                                      or _takes(dialect, name, chat)):
                body[name] = value
        if self.logit_bias:
            if dialect.llama_cpp:  # pairs: a text key is tokenized, an id is taken as is
                body["logit_bias"] = [[b.token, b.bias] for b in self.logit_bias]
            else:
                body["logit_bias"] = {str(b.token): b.bias for b in self.logit_bias}
        if self.logprobs:
            if dialect.llama_cpp:
                # n_probs 0 returns no probabilities at all: ask for one and report none
                # of the alternatives when top_logprobs is 0 (OpenAI's meaning).
                body["n_probs"] = max(1, self.top_logprobs)
            elif chat:
                body["logprobs"] = True
                body["top_logprobs"] = self.top_logprobs
            else:
                body["logprobs"] = self.top_logprobs
        if self.response_format is not None:
            schema = orjson.loads(self.json_schema) if self.json_schema else {}
            if chat:
                body["response_format"] = self._openai_format(schema)
            else:  # llama-server's /v1/completions ignores response_format
                body["json_schema"] = schema
        if self.grammar is not None:
            body["grammar"] = self.grammar
        return body

    def _extended(self) -> bool:
        return bool(self.logit_bias or self.logprobs or self.response_format is not None
                    or self.grammar is not None
                    or any(getattr(self, n) is not None for n in _NATIVE_SAME_NAME))

    def _openai_format(self, schema: Any) -> dict[str, Any]:
        if self.response_format == "json_schema":
            return {"type": "json_schema",
                    "json_schema": {"name": self.schema_name or "response", "schema": schema}}
        return {"type": "json_object"}


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log-probability; ``id`` when the runtime reports it."""

    token: str
    logprob: float
    bytes: bytes = b""
    id: int | None = None


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token, with at most ``top_logprobs`` likeliest alternatives."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


def parse_logprobs(value: object, top: int) -> tuple[TokenLogprobs, ...]:
    """The tokens of one stream event's ``choices[i].logprobs``, alternatives cut to
    ``top``: OpenAI's chat form (``{"content": [...]}``, which llama-server sends on both
    routes) or its legacy completions form (``tokens``, ``token_logprobs``,
    ``top_logprobs``). Anything else (null, malformed) is no tokens.
    """
    if not isinstance(value, dict):
        return ()
    content = value.get("content")
    if isinstance(content, list):
        out: list[TokenLogprobs] = []
        for entry in content:
            chosen = _token(entry)
            if chosen is None:
                continue
            alts = entry.get("top_logprobs") or ()
            parsed = [t for t in map(_token, alts if isinstance(alts, list) else ()) if t]
            out.append(TokenLogprobs(chosen, tuple(parsed[:top])))
        return tuple(out)
    tokens, lps = value.get("tokens"), value.get("token_logprobs")
    if not (isinstance(tokens, list) and isinstance(lps, list)):
        return ()
    tops = value.get("top_logprobs")
    tops = tops if isinstance(tops, list) else []
    out = []
    for i, (tok, lp) in enumerate(zip(tokens, lps, strict=False)):
        if not isinstance(lp, int | float):
            continue
        alts_map = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        alts = sorted(((str(t), float(v)) for t, v in alts_map.items()
                       if isinstance(v, int | float)), key=lambda a: -a[1])
        text = str(tok)
        out.append(TokenLogprobs(
            TokenLogprob(text, float(lp), text.encode()),
            tuple(TokenLogprob(t, v, t.encode()) for t, v in alts[:top])))
    return tuple(out)


def _token(entry: object) -> TokenLogprob | None:
    if not isinstance(entry, dict):
        return None
    logprob = entry.get("logprob")
    if not isinstance(logprob, int | float):
        return None
    text = str(entry.get("token") or "")
    raw = entry.get("bytes")
    try:
        data = bytes(raw) if isinstance(raw, list) else text.encode()
    except (TypeError, ValueError):
        data = text.encode()
    tid = entry.get("id")
    return TokenLogprob(text, float(logprob), data,
                        tid if isinstance(tid, int) and tid >= 0 else None)
