"""Request bodies of the HTTP API, read into what the gRPC API is validated into.

Each JSON field is type-checked here, naming the parameter as OpenAI spells it; the
values are then put in the gRPC request messages and validated by :mod:`daemon.checks.validation`,
so both APIs accept and refuse exactly the same values under the same named limits.
Parameters llamad cannot honour (``n`` > 1, OpenAI's legacy ``functions``, ``echo``,
``suffix``, ...) are refused by name rather than ignored; fields it does not know are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from llamad_protocol.v1 import inference_pb2 as pb
from supervisor import Message, Sampling, ToolUse

from ..checks import schema as schema_check
from ..checks import tools, validation
from ..checks.grammar import GrammarRefused
from ..config import Limits
from ..errors import InvalidArgument
from ..services.inference import EmbedInput
from . import _token_ids as _token_ids_mod
from ._errors import ApiError, ParamError, http_param
from ._tools import read_message_tools, read_tools

Body = Mapping[str, Any]

_REFUSED = {
    "functions": "OpenAI's legacy function calling is not available: use tools",
    "function_call": "OpenAI's legacy function calling is not available: use tool_choice",
    "audio": "audio output is not available",
    "modalities": "only text output is available",
    "prediction": "predicted outputs are not available",
    "suffix": "suffix (insertion) is not available",
}
_ROLES = {"system": pb.CHAT_ROLE_SYSTEM, "developer": pb.CHAT_ROLE_SYSTEM,
          "user": pb.CHAT_ROLE_USER, "assistant": pb.CHAT_ROLE_ASSISTANT,
          "tool": pb.CHAT_ROLE_TOOL}
_UINT32 = 2**32 - 1
_FORMATS = {"text": pb.RESPONSE_FORMAT_TYPE_TEXT,
            "json_object": pb.RESPONSE_FORMAT_TYPE_JSON_OBJECT,
            "json_schema": pb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA}


def json_body(raw: bytes) -> Body:
    """The request body as a JSON object.

    Raises:
        ApiError: 400 when it is not JSON (invalid UTF-8 included) or not an object.
    """
    if not raw.strip():
        raise ApiError(400, "the request body is empty: send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not "
                            f"{kind(body)}")
    return body


def kind(value: object) -> str:
    """How a JSON value is named in a refusal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _number(body: Body, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamError(name, f"{name} must be a number, not {kind(value)}")
    return float(value)


def _integer(body: Body, name: str, *, high: int = _UINT32) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError(name, f"{name} must be an integer, not {kind(value)}")
    if not 0 <= value <= high:
        raise ParamError(name, f"{name} must be in 0..{high}, got {value}")
    return value


def _boolean(body: Body, name: str) -> bool:
    return bool(_typed(body, name, bool, "true or false"))


def _string(body: Body, name: str) -> str | None:
    value = _typed(body, name, str, "a string")
    return None if value is None else str(value)


def _typed(body: Body, name: str, expected: type, what: str) -> object:
    """``body[name]`` when it is an ``expected`` (None when absent or null)."""
    value = body.get(name)
    if value is not None and not isinstance(value, expected):
        raise ParamError(name, f"{name} must be {what}, not {kind(value)}")
    return value


def model_name(body: Body) -> str:
    """``model``: required, a string (an unknown name is the catalog's 404)."""
    name = _string(body, "model")
    return name or ""


@dataclass(frozen=True)
class Streaming:
    """``stream`` and ``stream_options.include_usage``."""

    stream: bool
    include_usage: bool


def streaming(body: Body) -> Streaming:
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return Streaming(stream, False)
    if not isinstance(options, dict):
        raise ParamError("stream_options", "stream_options must be an object")
    if not stream:
        raise ParamError("stream_options", "stream_options is only allowed with stream: true")
    return Streaming(stream, _boolean(options, "include_usage"))


def _refuse_unsupported(body: Body) -> None:
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, [], ""):
            raise ParamError(name, f"{name} is not supported: {why}")
    for name in ("n", "best_of"):
        count = _integer(body, name)
        if count not in (None, 1):
            raise ParamError(name, f"{name} must be 1: llamad returns one choice per request")
    if _boolean(body, "echo"):
        raise ParamError("echo", "echo is not supported: the prompt is not repeated")


def sampling(body: Body, limits: Limits, *, chat: bool) -> Sampling:
    """The generation controls of a chat or completion request, validated, with the
    defaults of gRPC's Chat or Generate for what it leaves unset.

    Raises:
        InvalidArgument: a parameter of the wrong type or out of range, naming it.
    """
    _refuse_unsupported(body)
    params = pb.SamplingParams()
    max_tokens = _integer(body, "max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens")
    if max_tokens is not None:
        params.max_tokens = max_tokens
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "dry_multiplier", "dry_base"):
        if (number := _number(body, name)) is not None:
            setattr(params, name, number)
    for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n"):
        if (count := _integer(body, name)) is not None:
            setattr(params, name, count)
    if (seed := _integer(body, "seed", high=2**64 - 1)) is not None:
        params.seed = seed
    params.stop.extend(_stop(body))
    _logit_bias(body, params)
    _logprobs(body, params, chat=chat)
    _response_format(body, params, limits)
    if (grammar := _string(body, "grammar")) is not None:
        params.grammar = grammar
    # Chat's defaults (limits.chat_*: sampling with a repetition guard) as on gRPC Chat;
    # completions stay greedy, as Generate.
    return validation.sampling(params, limits,
                               defaults=validation.chat_defaults(limits) if chat else None)


def _stop(body: Body) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ParamError("stop", "stop must be a string or an array of strings")
    return list(value)


def _logit_bias(body: Body, params: pb.SamplingParams) -> None:
    """OpenAI's ``{"token id": bias}``; a key that is not a number is a text whose tokens
    are biased (llama-server's extension)."""
    value = body.get("logit_bias")
    if value is None:
        return
    if not isinstance(value, dict):
        raise ParamError("logit_bias", "logit_bias must be an object of token id: bias")
    for key, bias in value.items():
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ParamError("logit_bias", f"logit_bias[{key!r}] must be a number")
        entry = params.logit_bias.add(bias=float(bias))
        if key.isdigit() and int(key) <= _UINT32:
            entry.token = int(key)
        else:
            entry.text = key


def _logprobs(body: Body, params: pb.SamplingParams, *, chat: bool) -> None:
    """Chat: ``logprobs`` true and ``top_logprobs`` N. Completions: ``logprobs`` N (the
    alternatives per token; 0 still reports the chosen tokens')."""
    if chat:
        params.logprobs = _boolean(body, "logprobs")
        if (top := _integer(body, "top_logprobs")) is not None:
            params.top_logprobs = top
        return
    if (count := _integer(body, "logprobs")) is not None:
        params.logprobs = True
        params.top_logprobs = count


def _response_format(body: Body, params: pb.SamplingParams, limits: Limits) -> None:
    value = body.get("response_format")
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ParamError("response_format", 'response_format must be an object with a '
                                            '"type" (text, json_object or json_schema)')
    kind = _FORMATS.get(value["type"])
    if kind is None:
        raise ParamError("response_format.type", f"response_format.type "
                         f"{value['type'][:40]!r} is unknown: text, json_object or "
                         "json_schema")
    params.response_format.type = kind
    if kind != pb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA:
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ParamError("response_format.json_schema",
                         'response_format.json_schema must be an object with a "schema" '
                         "object (and a name)")
    try:  # the depth first: past ~254 levels the encoder fails (an internal error)
        schema_check.check_depth(spec["schema"], limits.max_schema_depth)
    except GrammarRefused as exc:
        raise ParamError("response_format.json_schema",
                         f"response_format.json_schema.schema {exc}") from None
    params.response_format.json_schema = orjson.dumps(spec["schema"]).decode()
    name = spec.get("name", "")
    if not isinstance(name, str):
        raise ParamError("response_format.json_schema.name",
                         "response_format.json_schema.name must be a string")
    params.response_format.name = name


def chat_messages(body: Body, limits: Limits) -> tuple[list[Message], ToolUse | None]:
    """``messages`` (roles system or developer, user, assistant with its ``tool_calls``,
    and tool with its ``tool_call_id``; content a string or text parts), and ``tools``
    with ``tool_choice`` and ``parallel_tool_calls`` (None: no tools).

    Raises:
        InvalidArgument: naming the message and field, or the tools parameter, at fault.
    """
    value = body.get("messages")
    if not isinstance(value, list):
        raise ParamError("messages", "messages must be an array of {role, content} objects")
    request = pb.ChatRequest()
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ParamError(where, f"{where} must be an object with role and content")
        role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise ParamError(f"{where}.role", f"{where}.role must be system, developer, user, "
                             "assistant or tool")
        added = request.messages.add(role=role,
                                     content=_content(message.get("content"), where))
        read_message_tools(where, message, added)
    read_tools(body, request, limits.max_schema_depth)
    return validation.chat_messages(request, limits), tools.chat_tools(request, limits)


def _content(value: object, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ParamError(f"{where}.content", f"{where}.content must be a string or an array "
                         "of text parts")
    return "".join(text_blocks(value, f"{where}.content",
                               'a {"type": "text", "text": ...} part (only text is accepted)'))


def text_blocks(value: list[Any], where: str, wanted: str) -> list[str]:
    """The texts of ``value``'s text blocks; the first other item is refused as
    ``where[i] must be`` ``wanted``."""
    texts: list[str] = []
    for i, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            raise ParamError(f"{where}[{i}]", f"{where}[{i}] must be {wanted}")
        texts.append(block["text"])
    return texts


def prompt(body: Body, limits: Limits) -> str:
    """``prompt``: a string (or an array holding one)."""
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if _token_ids(value):
        raise _token_ids_mod.refuse_foreign("prompt", own_accepted=False)
    if not isinstance(value, str):
        raise ParamError("prompt", "prompt must be a string (one prompt per request)")
    return validation.prompt(pb.GenerateRequest(prompt=value), limits)


def embedding_inputs(body: Body, limits: Limits) -> list[EmbedInput]:
    """``input``: a string, an array of strings, an array of token ids, or an array of
    arrays of token ids.

    Raises:
        InvalidArgument: naming ``input`` (or ``input[i]``) and what is wrong.
    """
    value = body.get("input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ParamError("input", "input must be a string, an array of strings, or an "
                         "array of token-id arrays, and not empty")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]
    if all(isinstance(v, str) for v in value):
        try:
            return list(validation.embed_texts(value, limits))
        except InvalidArgument as exc:
            raise ParamError(http_param(exc.field or "input"),
                             str(exc).replace("texts", "input", 1)) from None
    if not _token_ids_mod.declared_own(body):
        raise _token_ids_mod.refuse_foreign("input", own_accepted=True)
    if len(value) > limits.max_embed_batch:
        raise ParamError("input", f"input has {len(value)} items; the limit is "
                         f"{limits.max_embed_batch} (limits.max_embed_batch)")
    out: list[EmbedInput] = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or not item or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31
                for t in item):
            raise ParamError(f"input[{i}]", f"input[{i}] must be a non-empty array of token "
                             "ids (inputs are all strings or all token arrays)")
        if len(item) > limits.max_embed_chars:
            raise ParamError(f"input[{i}]", f"input[{i}] has {len(item)} tokens; the limit "
                             f"is {limits.max_embed_chars} (limits.max_embed_chars)")
        out.append(tuple(item))
    return out


def _token_ids(value: object) -> bool:
    """Whether ``value`` is token ids: a list of integers, or a list of such lists."""
    if not isinstance(value, list) or not value:
        return False
    items = value if all(isinstance(v, list) for v in value) else [value]
    return all(item and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
               for item in items)


def encoding_format(body: Body) -> str:
    value = body.get("encoding_format", "float")
    if value not in ("float", "base64"):
        raise ParamError("encoding_format", "encoding_format must be float or base64")
    return str(value)


def dimensions(body: Body) -> int | None:
    return _integer(body, "dimensions")
