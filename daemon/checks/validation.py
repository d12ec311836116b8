"""Request validation: every field checked against a named limit, with a clear message.

Validation happens before anything reaches a child, so a bad request costs nothing and
changes nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from llamad_protocol.v1 import inference_pb2 as pb
from supervisor import LogitBias, Message, Sampling, Turn

from ..config import AnswerConfig, Limits
from ..errors import InvalidArgument
from . import tools
from .grammar import GrammarLimits, GrammarRefused, check_grammar
from .schema import checked_schema

_ROLES = {
    pb.CHAT_ROLE_SYSTEM: "system",
    pb.CHAT_ROLE_USER: "user",
    pb.CHAT_ROLE_ASSISTANT: "assistant",
    pb.CHAT_ROLE_TOOL: "tool",
}


def _check_text(name: str, text: str, limit: int, *, allow_empty: bool = False) -> None:
    if not text and not allow_empty:
        raise InvalidArgument(f"{name} is empty", field=name)
    if len(text) > limit:
        raise InvalidArgument(f"{name} has {len(text)} characters; the limit is {limit} "
                              "(limits.max_prompt_chars)", field=name)
    if "\x00" in text:
        raise InvalidArgument(f"{name} contains a NUL character", field=name)


@dataclass(frozen=True)
class SamplingDefaults:
    """What a call's unset sampling fields take (None: the runtime's own). Chat's come
    from ``limits.chat_*``, Ask's from ``answer.*``; Generate has none (greedy)."""

    temperature: float = 0.0
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    dry_multiplier: float | None = None
    frequency_penalty: float | None = None

    @classmethod
    def configured(cls, temperature: float, top_p: float, min_p: float, *,
                   repeat_penalty: float, dry_multiplier: float,
                   frequency_penalty: float) -> SamplingDefaults:
        """From option values, where the neutral value turns a control off (top_p 1,
        min_p 0, repeat_penalty 1, dry_multiplier 0, frequency_penalty 0)."""
        return cls(temperature, None if top_p >= 1 else top_p, min_p or None,
                   None if repeat_penalty == 1 else repeat_penalty, dry_multiplier or None,
                   frequency_penalty or None)


def chat_defaults(limits: Limits) -> SamplingDefaults:
    """Chat's defaults (``limits.chat_*``)."""
    return SamplingDefaults.configured(
        limits.chat_temperature, limits.chat_top_p, limits.chat_min_p,
        repeat_penalty=limits.chat_repeat_penalty, dry_multiplier=limits.chat_dry_multiplier,
        frequency_penalty=limits.chat_frequency_penalty)


def answer_defaults(answer: AnswerConfig) -> SamplingDefaults:
    """Ask's defaults (``answer.*``)."""
    return SamplingDefaults.configured(
        answer.temperature, answer.top_p, answer.min_p, repeat_penalty=answer.repeat_penalty,
        dry_multiplier=answer.dry_multiplier, frequency_penalty=answer.frequency_penalty)


def ask_sampling(params: pb.SamplingParams, limits: Limits, answer: AnswerConfig) -> Sampling:
    """Ask's sampling, as both APIs check it: ``answer.default_max_tokens`` when
    max_tokens is unset, the ``answer.*`` defaults, and the controls that would break a
    cited answer refused (:func:`sampling` with ``call="Ask"``)."""
    if not params.HasField("max_tokens"):
        filled = pb.SamplingParams()
        filled.CopyFrom(params)
        filled.max_tokens = answer.default_max_tokens
        params = filled
    return sampling(params, limits, call="Ask", defaults=answer_defaults(answer))


def sampling(params: pb.SamplingParams, limits: Limits, *, call: str = "",
             defaults: SamplingDefaults | None = None) -> Sampling:
    """Validate sampling parameters and fill defaults.

    ``call`` "Ask" refuses the controls that would break a cited answer (logprobs, which
    AskResponse does not carry, and structured output). ``defaults`` fill the fields the
    request leaves unset (Chat's and Ask's temperature and repetition guard); the
    controls they add are marked :attr:`~supervisor.Sampling.defaulted`, so a runtime
    that lacks one goes without it rather than refusing the call.
    """
    base = defaults or SamplingDefaults()
    max_tokens = params.max_tokens if params.HasField("max_tokens") else limits.default_max_tokens
    if max_tokens < 1 or max_tokens > limits.max_tokens:
        raise InvalidArgument(
            f"sampling.max_tokens must be in 1..{limits.max_tokens} (limits.max_tokens), "
            f"got {max_tokens}", field="sampling.max_tokens")
    temperature = (params.temperature if params.HasField("temperature")
                   else base.temperature)
    if not math.isfinite(temperature) or not 0.0 <= temperature <= 5.0:
        raise InvalidArgument(f"sampling.temperature must be in 0..5, got {temperature}",
                              field="sampling.temperature")
    top_p = base.top_p
    if params.HasField("top_p"):
        top_p = params.top_p
        if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
            raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {top_p}",
                                  field="sampling.top_p")
    top_k = params.top_k if params.HasField("top_k") else None
    if top_k is not None and top_k > 100_000:
        raise InvalidArgument(f"sampling.top_k must be at most 100000, got {top_k}",
                              field="sampling.top_k")
    seed = params.seed if params.HasField("seed") else None
    if seed is not None and seed >= 2**32:
        raise InvalidArgument("sampling.seed must fit in 32 bits", field="sampling.seed")
    if len(params.stop) > limits.max_stop:
        raise InvalidArgument(
            f"sampling.stop has {len(params.stop)} strings; the limit is {limits.max_stop} "
            "(limits.max_stop)", field="sampling.stop")
    for s in params.stop:
        if not s or len(s) > 256:
            raise InvalidArgument("sampling.stop strings must be 1..256 characters",
                                  field="sampling.stop")
    if call == "Ask":
        _refuse_on_ask(params)
    response_format, schema, name = _response_format(params, limits)
    defaulted = frozenset(n for n in ("min_p", "repeat_penalty", "dry_multiplier",
                                      "frequency_penalty")
                          if getattr(base, n) is not None
                          and not params.HasField(n))
    return Sampling(
        max_tokens, temperature, top_p, top_k, seed, tuple(params.stop),
        min_p=_ranged(params, "min_p", 0.0, 1.0) if "min_p" not in defaulted
        else base.min_p,
        repeat_penalty=_ranged(params, "repeat_penalty", 0.0, 10.0, low_open=True)
        if "repeat_penalty" not in defaulted else base.repeat_penalty,
        repeat_last_n=_count(params, "repeat_last_n"),
        presence_penalty=_ranged(params, "presence_penalty", -2.0, 2.0),
        frequency_penalty=_ranged(params, "frequency_penalty", -2.0, 2.0)
        if "frequency_penalty" not in defaulted else base.frequency_penalty,
        logit_bias=_logit_bias(params, limits),
        logprobs=params.logprobs,
        top_logprobs=_top_logprobs(params, limits),
        response_format=response_format, json_schema=schema, schema_name=name,
        grammar=_grammar(params, limits, response_format),
        dry_multiplier=_ranged(params, "dry_multiplier", 0.0, 10.0)
        if "dry_multiplier" not in defaulted else base.dry_multiplier,
        dry_base=_ranged(params, "dry_base", 1.0, 10.0),
        dry_allowed_length=_count(params, "dry_allowed_length"),
        dry_penalty_last_n=_count(params, "dry_penalty_last_n"),
        defaulted=defaulted,
    )


_MAX_WINDOW = 2**31 - 1  # llama.cpp reads token counts as int32


def _ranged(params: pb.SamplingParams, name: str, low: float, high: float, *,
            low_open: bool = False) -> float | None:
    """An optional float field, refused outside ``low..high`` (``(low, high]`` when
    ``low_open``)."""
    if not params.HasField(name):  # type: ignore[arg-type]
        return None
    value = float(getattr(params, name))
    inside = (low < value if low_open else low <= value) and value <= high
    if not math.isfinite(value) or not inside:
        interval = f"({low:g}, {high:g}]" if low_open else f"{low:g}..{high:g}"
        raise InvalidArgument(f"sampling.{name} must be in {interval}, got {value:g}",
                              field=f"sampling.{name}")
    return value


def _count(params: pb.SamplingParams, name: str) -> int | None:
    if not params.HasField(name):  # type: ignore[arg-type]
        return None
    value = int(getattr(params, name))
    if value > _MAX_WINDOW:
        raise InvalidArgument(f"sampling.{name} must be at most {_MAX_WINDOW}, got {value}",
                              field=f"sampling.{name}")
    return value


def _refuse_on_ask(params: pb.SamplingParams) -> None:
    for name, given in (("logprobs", params.logprobs),
                        ("top_logprobs", params.HasField("top_logprobs")),
                        ("response_format", params.HasField("response_format")),
                        ("grammar", bool(params.grammar))):
        if given:
            raise InvalidArgument(
                f"sampling.{name} is not available on Ask: its answer is prose with inline "
                "citations (use Chat or Generate)", field=f"sampling.{name}")


def _logit_bias(params: pb.SamplingParams, limits: Limits) -> tuple[LogitBias, ...]:
    if len(params.logit_bias) > limits.max_logit_bias:
        raise InvalidArgument(
            f"sampling.logit_bias has {len(params.logit_bias)} entries; the limit is "
            f"{limits.max_logit_bias} (limits.max_logit_bias)", field="sampling.logit_bias")
    out: list[LogitBias] = []
    for i, entry in enumerate(params.logit_bias):
        where = f"sampling.logit_bias[{i}]"
        if not math.isfinite(entry.bias) or not -100.0 <= entry.bias <= 100.0:
            raise InvalidArgument(f"{where}.bias must be in -100..100, got {entry.bias:g}",
                                  field=f"{where}.bias")
        target = entry.WhichOneof("target")
        if target == "token":
            if entry.token > _MAX_WINDOW:
                raise InvalidArgument(f"{where}.token {entry.token} is not a token id",
                                      field=f"{where}.token")
            out.append(LogitBias(entry.token, entry.bias))
        elif target == "text":
            if not entry.text or len(entry.text) > 256 or "\x00" in entry.text:
                raise InvalidArgument(f"{where}.text must be 1..256 characters, without NUL",
                                      field=f"{where}.text")
            out.append(LogitBias(entry.text, entry.bias))
        else:
            raise InvalidArgument(f"{where} names no token: set token (an id) or text", field=where)
    return tuple(out)


def _top_logprobs(params: pb.SamplingParams, limits: Limits) -> int:
    if not params.HasField("top_logprobs"):
        return 0
    if not params.logprobs:
        raise InvalidArgument("sampling.top_logprobs needs sampling.logprobs set",
                              field="sampling.top_logprobs")
    top = params.top_logprobs
    if top > limits.max_top_logprobs:
        raise InvalidArgument(f"sampling.top_logprobs must be at most {limits.max_top_logprobs} "
                              f"(limits.max_top_logprobs), got {top}",
                              field="sampling.top_logprobs")
    return top


def _response_format(params: pb.SamplingParams,
                     limits: Limits) -> tuple[str | None, str | None, str]:
    """(None, None, "") for free text; ("json_object", None, ""); or ("json_schema", the
    schema as compact JSON text, its name)."""
    fmt = params.response_format
    kind = fmt.type
    if kind in (pb.RESPONSE_FORMAT_TYPE_UNSPECIFIED, pb.RESPONSE_FORMAT_TYPE_TEXT):
        if fmt.json_schema or fmt.name:
            raise InvalidArgument("sampling.response_format.json_schema needs type JSON_SCHEMA",
                                  field="sampling.response_format.json_schema")
        return None, None, ""
    if kind == pb.RESPONSE_FORMAT_TYPE_JSON_OBJECT:
        if fmt.json_schema:
            raise InvalidArgument("sampling.response_format.json_schema needs type "
                                  "JSON_SCHEMA, not JSON_OBJECT",
                                  field="sampling.response_format.json_schema")
        return "json_object", None, ""
    if kind != pb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA:
        raise InvalidArgument(f"sampling.response_format.type {kind} is unknown",
                              field="sampling.response_format.type")
    text = fmt.json_schema
    if not text.strip():
        raise InvalidArgument("sampling.response_format.json_schema is empty (type "
                              "JSON_SCHEMA needs a schema; JSON_OBJECT takes any object)",
                              field="sampling.response_format.json_schema")
    if len(text) > limits.max_grammar_chars:
        raise InvalidArgument(
            f"sampling.response_format.json_schema has {len(text)} characters; the limit is "
            f"{limits.max_grammar_chars} (limits.max_grammar_chars)",
            field="sampling.response_format.json_schema")
    try:
        schema = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(
            f"sampling.response_format.json_schema is not valid JSON: {exc}",
            field="sampling.response_format.json_schema") from None
    if not isinstance(schema, dict):
        raise InvalidArgument("sampling.response_format.json_schema must be a JSON object "
                              f"(a schema), not a {type(schema).__name__}",
                              field="sampling.response_format.json_schema")
    checked_schema("sampling.response_format.json_schema", schema, limits)
    if len(fmt.name) > 64 or not all(c.isalnum() or c in "_-" for c in fmt.name):
        raise InvalidArgument("sampling.response_format.name must be at most 64 letters, "
                              "digits, _ or - (OpenAI's rule)",
                              field="sampling.response_format.name")
    return "json_schema", orjson.dumps(schema).decode(), fmt.name


def _grammar(params: pb.SamplingParams, limits: Limits,
             response_format: str | None) -> str | None:
    text = params.grammar
    if not text:
        return None
    if response_format is not None:
        raise InvalidArgument("sampling.grammar and sampling.response_format both constrain "
                              "the output: set one", field="sampling.grammar")
    if len(text) > limits.max_grammar_chars:
        raise InvalidArgument(f"sampling.grammar has {len(text)} characters; the limit is "
                              f"{limits.max_grammar_chars} (limits.max_grammar_chars)",
                              field="sampling.grammar")
    if "\x00" in text:
        raise InvalidArgument("sampling.grammar contains a NUL character", field="sampling.grammar")
    if "root" not in text or "::=" not in text:
        raise InvalidArgument("sampling.grammar is not a GBNF grammar: it needs a 'root ::= "
                              "...' rule", field="sampling.grammar")
    refusal = _grammar_refusal(text, GrammarLimits.of(limits))
    if refusal is not None:
        raise InvalidArgument(f"sampling.grammar {refusal}", field="sampling.grammar")
    return text


@functools.lru_cache(maxsize=256)
def _grammar_refusal(text: str, limits: GrammarLimits) -> str | None:
    """Why ``text`` is refused, or None; cached, since callers repeat their grammars and
    the check of a large one takes a few hundred milliseconds."""
    try:
        check_grammar(text, limits)
    except GrammarRefused as exc:
        return str(exc)
    return None


def prompt(request: pb.GenerateRequest, limits: Limits) -> str:
    _check_text("prompt", request.prompt, limits.max_prompt_chars)
    return request.prompt


def chat_messages(request: pb.ChatRequest, limits: Limits) -> list[Message]:
    """The messages of a Chat: ``(role, content)`` pairs, and :class:`supervisor.Turn`
    for an assistant message with tool calls and for a tool message (role ``tool``, which
    must name the call it answers in ``tool_call_id``).

    Raises:
        InvalidArgument: naming the message and field at fault.
    """
    if not request.messages:
        raise InvalidArgument("messages is empty", field="messages")
    if len(request.messages) > limits.max_messages:
        raise InvalidArgument(
            f"{len(request.messages)} messages; the limit is {limits.max_messages} "
            "(limits.max_messages)", field="messages")
    out: list[Message] = []
    total = 0
    for i, msg in enumerate(request.messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise InvalidArgument(f"messages[{i}].role is unspecified or unknown",
                                  field=f"messages[{i}].role")
        _check_text(f"messages[{i}].content", msg.content, limits.max_prompt_chars,
                    allow_empty=role in ("assistant", "tool"))
        total += len(msg.content) + tools.tool_chars(msg)
        out.append(_message(i, role, msg, limits))
    if total > limits.max_prompt_chars:
        raise InvalidArgument(f"messages have {total} characters in all; the limit is "
                              f"{limits.max_prompt_chars} (limits.max_prompt_chars)",
                              field="messages")
    last = out[-1]
    if (last.role if isinstance(last, Turn) else last[0]) == "assistant":
        raise InvalidArgument("the last message must not be from the assistant",
                              field=f"messages[{len(out) - 1}].role")
    return out


def _message(i: int, role: str, msg: pb.ChatMessage, limits: Limits) -> Message:
    """One checked message: a pair, or a Turn when it has tool calling's parts."""
    where = f"messages[{i}]"
    if msg.tool_calls and role != "assistant":
        raise InvalidArgument(f"{where}.tool_calls: only an assistant message calls tools",
                              field=f"{where}.tool_calls")
    if role == "tool":
        if not msg.tool_call_id:
            raise InvalidArgument(f"{where}.tool_call_id is empty: a tool message must name "
                                  "the call it answers", field=f"{where}.tool_call_id")
        _check_text(f"{where}.tool_call_id", msg.tool_call_id, limits.max_prompt_chars)
        return Turn(role, msg.content, tool_call_id=msg.tool_call_id)
    if msg.tool_call_id:
        raise InvalidArgument(f"{where}.tool_call_id is only for a tool message",
                              field=f"{where}.tool_call_id")
    if msg.tool_calls:
        return Turn(role, msg.content, tools.tool_calls(where, msg, limits))
    return (role, msg.content)


def embed_texts(texts: Sequence[str], limits: Limits) -> list[str]:
    if not texts:
        raise InvalidArgument("texts is empty", field="texts")
    if len(texts) > limits.max_embed_batch:
        raise InvalidArgument(
            f"{len(texts)} texts; the limit is {limits.max_embed_batch} (limits.max_embed_batch)",
            field="texts")
    for i, text in enumerate(texts):
        if not text.strip():
            raise InvalidArgument(f"texts[{i}] is empty", field=f"texts[{i}]")
        if len(text) > limits.max_embed_chars:
            raise InvalidArgument(
                f"texts[{i}] has {len(text)} characters; the limit is {limits.max_embed_chars} "
                "(limits.max_embed_chars)", field=f"texts[{i}]")
        if "\x00" in text:
            raise InvalidArgument(f"texts[{i}] contains a NUL character", field=f"texts[{i}]")
    return list(texts)
