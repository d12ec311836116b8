"""Tool calling in request bodies: ``tools``, ``tool_choice``, ``parallel_tool_calls``,
and the tool parts of ``messages`` (an assistant's ``tool_calls``, a ``tool`` message's
``tool_call_id``), read into a gRPC ``ChatRequest``.

Only JSON types are checked here, naming the parameter as OpenAI spells it; the values
are then validated by :mod:`daemon.checks.tools` and :mod:`daemon.checks.validation`, as gRPC's Chat
is. OpenAI's legacy ``functions`` and ``function_call`` stay refused (:mod:`._parse`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from llamad_protocol.v1 import inference_pb2 as pb

from ..checks.grammar import GrammarRefused
from ..checks.schema import check_depth
from ._errors import ParamError

_MODES = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "none": pb.TOOL_CHOICE_MODE_NONE,
          "required": pb.TOOL_CHOICE_MODE_REQUIRED}


def read_tools(body: Mapping[str, Any], request: pb.ChatRequest, max_depth: int) -> None:
    """Put ``tools``, ``tool_choice`` and ``parallel_tool_calls`` into ``request``.

    Raises:
        ParamError: a field of the wrong JSON type or shape, naming it.
    """
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ParamError("tools", 'tools must be an array of {"type": "function", '
                             '"function": {...}} objects')
        for i, tool in enumerate(tools):
            request.tools.append(_tool(f"tools[{i}]", tool, max_depth))
    _tool_choice(body.get("tool_choice"), request)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise ParamError("parallel_tool_calls", "parallel_tool_calls must be true or false")
        request.parallel_tool_calls = parallel


def _tool(where: str, tool: object, max_depth: int) -> pb.Tool:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ParamError(f"{where}.type", f'{where} must be {{"type": "function", '
                         '"function": {"name": ..., "parameters": {...}}} (only functions '
                         "are tools)")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ParamError(f"{where}.function", f"{where}.function must be an object")
    name = function.get("name")
    if not isinstance(name, str):
        raise ParamError(f"{where}.function.name", f"{where}.function.name must be a string")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ParamError(f"{where}.function.description",
                         f"{where}.function.description must be a string")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ParamError(f"{where}.function.parameters", f"{where}.function.parameters must "
                         "be a JSON Schema object")
    if parameters:
        _shallow(f"{where}.function.parameters", parameters, max_depth)
    return pb.Tool(name=name, description=description or "",
                   parameters=orjson.dumps(parameters).decode() if parameters else "")


def _shallow(param: str, schema: object, max_depth: int) -> None:
    """Refuse a schema nested deeper than ``max_depth`` before it is written as JSON text
    (past ~254 levels the encoder fails, which would be an internal error)."""
    try:
        check_depth(schema, max_depth)
    except GrammarRefused as exc:
        raise ParamError(param, f"{param} {exc}") from None


def _tool_choice(value: object, request: pb.ChatRequest) -> None:
    if value is None:
        return
    if isinstance(value, str):
        mode = _MODES.get(value)
        if mode is None:
            raise ParamError("tool_choice", f"tool_choice {value[:40]!r} is unknown: auto, "
                             'none, required, or {"type": "function", "function": '
                             '{"name": ...}}')
        request.tool_choice.mode = mode
        return
    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or \
            not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ParamError("tool_choice", 'tool_choice must be auto, none, required, or '
                         '{"type": "function", "function": {"name": ...}}')
    request.tool_choice.function = function["name"]


def read_message_tools(where: str, message: Mapping[str, Any], out: pb.ChatMessage) -> None:
    """Put a message's ``tool_calls`` (assistant) and ``tool_call_id`` (tool) into
    ``out``; their values are validated with the rest of the messages.

    Raises:
        ParamError: a field of the wrong JSON type or shape, naming it.
    """
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ParamError(f"{where}.tool_calls", f"{where}.tool_calls must be an array")
        for j, call in enumerate(calls):
            out.tool_calls.append(_call(f"{where}.tool_calls[{j}]", call))
    call_id = message.get("tool_call_id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise ParamError(f"{where}.tool_call_id", f"{where}.tool_call_id must be a string")
        out.tool_call_id = call_id


def _call(at: str, call: object) -> pb.ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or call.get("type", "function") != "function" or \
            not isinstance(function, dict):
        raise ParamError(at, f'{at} must be {{"id": ..., "type": "function", "function": '
                         '{"name": ..., "arguments": "..."}}')
    call_id, name = call.get("id", ""), function.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise ParamError(at, f"{at}.id and {at}.function.name must be strings")
    arguments = function.get("arguments", "")
    if isinstance(arguments, dict):  # some clients send the object itself
        try:
            arguments = orjson.dumps(arguments).decode()
        except orjson.JSONEncodeError:  # nested past the encoder's ~254 levels
            raise ParamError(f"{at}.function.arguments", f"{at}.function.arguments nests "
                             "too deep to be read") from None
    if not isinstance(arguments, str):
        raise ParamError(f"{at}.function.arguments", f"{at}.function.arguments must be JSON "
                         "text (a string)")
    return pb.ToolCall(id=call_id, name=name, arguments=arguments)
