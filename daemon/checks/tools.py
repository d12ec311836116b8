"""Tool calling's part of Chat validation: a request's ``tools``, ``tool_choice`` and
``parallel_tool_calls``, and the tool parts of its messages (an assistant's
``tool_calls``, a tool message's ``tool_call_id``).

Both APIs go through here (the HTTP API reads its JSON into a ``ChatRequest`` first), so
they refuse the same things with the same words: a tool name that is empty, malformed or
given twice; parameters that are not a JSON Schema object as JSON text; a ``tool_choice``
naming a function that is not among the tools; a tool message without ``tool_call_id``;
more tools, or calls in one message, than ``limits.max_tools``. Whether the serving model
can take tools at all is the backend's to say (:meth:`daemon.models.backend.InferenceBackend.
stream_chat`), once it is known which model serves the call.
"""

from __future__ import annotations

import re
from typing import Any

from llamad_protocol.v1 import inference_pb2 as pb
from supervisor import NotAJsonObject, Tool, ToolCall, ToolUse, json_object

from ..config import Limits
from ..errors import InvalidArgument
from .schema import checked_schema

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MODES = {pb.TOOL_CHOICE_MODE_UNSPECIFIED: "auto", pb.TOOL_CHOICE_MODE_AUTO: "auto",
          pb.TOOL_CHOICE_MODE_NONE: "none", pb.TOOL_CHOICE_MODE_REQUIRED: "required"}


def _json_object(name: str, text: str, field: str) -> dict[str, Any]:
    """``text`` parsed, refused unless it is a JSON object (``name`` says what it is,
    ``field`` is where)."""
    try:
        return json_object(text)
    except NotAJsonObject as exc:
        raise InvalidArgument(f"{name} {exc}", field=field) from None


def _no_nul(name: str, text: str) -> None:
    if "\x00" in text:
        raise InvalidArgument(f"{name} contains a NUL character", field=name)


def chat_tools(request: pb.ChatRequest, limits: Limits) -> ToolUse | None:
    """The tools of ``request`` and its choice among them; None when it offers none.

    Raises:
        InvalidArgument: naming the field at fault (``tools[i].name``, ``tool_choice``...).
    """
    choice = request.tool_choice
    kind = choice.WhichOneof("choice")
    if not request.tools:
        if kind == "function" or (kind == "mode" and
                                   choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED):
            raise InvalidArgument("tool_choice asks for a tool call, and tools is empty",
                                  field="tool_choice")
        return None  # auto or none with nothing to call: nothing to send
    if len(request.tools) > limits.max_tools:
        raise InvalidArgument(f"tools has {len(request.tools)} tools; the limit is "
                              f"{limits.max_tools} (limits.max_tools)", field="tools")
    tools: list[Tool] = []
    seen: set[str] = set()
    chars = 0
    for i, tool in enumerate(request.tools):
        where = f"tools[{i}]"
        if not _NAME.fullmatch(tool.name):
            raise InvalidArgument(f"{where}.name must be 1 to 64 letters, digits, '_' or '-', "
                                  f"not {tool.name[:80]!r}", field=f"{where}.name")
        if tool.name in seen:
            raise InvalidArgument(f"{where}.name: the tool {tool.name!r} is given twice",
                                  field=f"{where}.name")
        seen.add(tool.name)
        _no_nul(f"{where}.description", tool.description)
        if tool.parameters:
            _no_nul(f"{where}.parameters", tool.parameters)
            schema = _json_object(f"{where}.parameters (a JSON Schema, as JSON text)",
                                  tool.parameters, f"{where}.parameters")
            # With tool calling on, llama-server makes a grammar of the parameters: the
            # same bounds as a response_format schema (issue 25).
            checked_schema(f"{where}.parameters", schema, limits)
        chars += len(tool.description) + len(tool.parameters)
        tools.append(Tool(tool.name, tool.description, tool.parameters))
    if chars > limits.max_prompt_chars:
        raise InvalidArgument(f"tools have {chars} characters of descriptions and parameters; "
                              f"the limit is {limits.max_prompt_chars} "
                              "(limits.max_prompt_chars)", field="tools")
    parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") \
        else None
    if kind == "function":
        if choice.function not in seen:
            raise InvalidArgument(f"tool_choice names the function {choice.function[:80]!r}, "
                                  f"which is not one of tools ({', '.join(sorted(seen))})",
                                  field="tool_choice")
        return ToolUse(tuple(tools), "function", choice.function, parallel)
    mode = _MODES.get(choice.mode) if kind == "mode" else "auto"
    if mode is None:
        raise InvalidArgument(f"tool_choice.mode {choice.mode} is unknown",
                              field="tool_choice.mode")
    return ToolUse(tuple(tools), mode, parallel=parallel)


def tool_calls(where: str, message: pb.ChatMessage, limits: Limits) -> tuple[ToolCall, ...]:
    """The tool calls of an assistant message of the history (``where`` names it).

    Raises:
        InvalidArgument: too many, a call without id or name, arguments that are not a
            JSON object as JSON text.
    """
    if len(message.tool_calls) > limits.max_tools:
        raise InvalidArgument(f"{where}.tool_calls has {len(message.tool_calls)} calls; the "
                              f"limit is {limits.max_tools} (limits.max_tools)",
                              field=f"{where}.tool_calls")
    out: list[ToolCall] = []
    for j, call in enumerate(message.tool_calls):
        at = f"{where}.tool_calls[{j}]"
        if not call.id:
            raise InvalidArgument(f"{at}.id is empty: a tool message answers a call by its id",
                                  field=f"{at}.id")
        if not _NAME.fullmatch(call.name):
            raise InvalidArgument(f"{at}.name must be 1 to 64 letters, digits, '_' or '-', "
                                  f"not {call.name[:80]!r}", field=f"{at}.name")
        _no_nul(f"{at}.id", call.id)
        arguments = call.arguments or "{}"
        _no_nul(f"{at}.arguments", arguments)
        _json_object(f"{at}.arguments (JSON text)", arguments, f"{at}.arguments")
        out.append(ToolCall(call.id, call.name, arguments))
    return tuple(out)


def tool_chars(message: pb.ChatMessage) -> int:
    """The characters a message's tool parts add to the prompt."""
    return sum(len(c.id) + len(c.name) + len(c.arguments) for c in message.tool_calls) \
        + len(message.tool_call_id)
