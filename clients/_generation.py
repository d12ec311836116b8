"""Generation controls: SamplingParams from the clients' keyword arguments, and the
logprobs of a GenerateResponse as :class:`~clients.TokenLogprobs` (shared by the sync and
the asyncio client, and by the CLI).

The keyword arguments are OpenAI's names where OpenAI has the parameter (``logprobs``,
``top_logprobs``, ``logit_bias``, ``response_format``, the penalties), llama.cpp's
otherwise (``min_p``, ``repeat_penalty``, ``grammar``, ``dry_*``). The daemon checks
ranges and refuses, naming it, a control the serving runtime cannot honour.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypedDict

from llamad_protocol.v1 import inference_pb2

from ._types import TokenLogprob, TokenLogprobs

ResponseFormat: TypeAlias = Literal["text", "json_object", "json_schema"]
"""Free text, any JSON object, or JSON matching ``json_schema``."""

_FORMATS: dict[str, inference_pb2.ResponseFormatType.ValueType] = {
    "text": inference_pb2.RESPONSE_FORMAT_TYPE_TEXT,
    "json_object": inference_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT,
    "json_schema": inference_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
}


class GenerationControls(TypedDict, total=False):
    """The generation controls ``generate`` and ``chat`` take (both clients), as keyword
    arguments; each is :func:`sampling`'s parameter of the same name (one left out, or
    None, is the daemon's default)."""

    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: Sequence[str]
    min_p: float | None
    repeat_penalty: float | None
    repeat_last_n: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    logit_bias: Mapping[int | str, float] | None
    logprobs: bool
    top_logprobs: int | None
    response_format: ResponseFormat | None
    json_schema: str | Mapping[str, Any] | None
    grammar: str | None
    dry_multiplier: float | None
    dry_base: float | None
    dry_allowed_length: int | None
    dry_penalty_last_n: int | None


def sampling(
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    min_p: float | None = None,
    repeat_penalty: float | None = None,
    repeat_last_n: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logit_bias: Mapping[int | str, float] | None = None,
    logprobs: bool = False,
    top_logprobs: int | None = None,
    response_format: ResponseFormat | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    schema_name: str = "",
    grammar: str | None = None,
    dry_multiplier: float | None = None,
    dry_base: float | None = None,
    dry_allowed_length: int | None = None,
    dry_penalty_last_n: int | None = None,
) -> inference_pb2.SamplingParams:
    """SamplingParams with only the fields given (unset means the daemon's default).

    ``logit_bias`` maps a token id (int) or a text (str: each of its tokens) to a bias
    in -100..100. ``json_schema`` (a JSON text or a mapping) implies ``response_format``
    ``"json_schema"``.

    Raises:
        ValueError: an unknown ``response_format``, or ``json_schema`` with another one.
    """
    # None leaves an optional field unset: the daemon's default.
    params = inference_pb2.SamplingParams(
        stop=list(stop), logprobs=logprobs, max_tokens=max_tokens, temperature=temperature,
        top_p=top_p, top_k=top_k, seed=seed, min_p=min_p, repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, top_logprobs=top_logprobs,
        dry_multiplier=dry_multiplier, dry_base=dry_base,
        dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n)
    for target, bias in (logit_bias or {}).items():
        entry = (inference_pb2.LogitBias(text=target, bias=bias) if isinstance(target, str)
                 else inference_pb2.LogitBias(token=target, bias=bias))
        params.logit_bias.append(entry)
    if json_schema is not None:
        if response_format not in (None, "json_schema"):
            raise ValueError(f"json_schema needs response_format 'json_schema', not "
                             f"{response_format!r}")
        response_format = "json_schema"
    if response_format is not None:
        if response_format not in _FORMATS:
            raise ValueError(f"response_format must be one of {', '.join(_FORMATS)}, not "
                             f"{response_format!r}")
        text = json_schema if isinstance(json_schema, str) or json_schema is None else (
            json.dumps(json_schema))
        params.response_format.CopyFrom(inference_pb2.ResponseFormat(
            type=_FORMATS[response_format], json_schema=text or "", name=schema_name))
    if grammar is not None:
        params.grammar = grammar
    return params


def token(msg: inference_pb2.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(token=msg.token, logprob=msg.logprob, bytes=msg.bytes,
                        id=msg.id if msg.HasField("id") else None)


def logprobs(msg: inference_pb2.GenerateResponse) -> tuple[TokenLogprobs, ...]:
    """The tokens of one GenerateResponse with their logprobs (empty when not asked)."""
    return tuple(TokenLogprobs(chosen=token(e.chosen),
                               top=tuple(token(t) for t in e.top_logprobs))
                 for e in msg.logprobs)
