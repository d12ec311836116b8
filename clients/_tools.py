"""Tool calling in the clients: the tools and tool_choice of a chat call as wire messages,
chat messages carrying tool calls (OpenAI's dict shape taken too), and the streamed
pieces of the model's calls joined into whole :class:`~clients.ToolCall` s."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

from llamad_protocol.v1 import inference_pb2

from ._types import Message, Tool, ToolCall, ToolCallDelta

ToolInput: TypeAlias = Tool | Mapping[str, Any]
"""A tool as callers may give it: a :class:`Tool`, ``{"name": ..., "description": ...,
"parameters": {...}}``, or OpenAI's ``{"type": "function", "function": {...}}``."""

_MODES: dict[str, inference_pb2.ToolChoiceMode.ValueType] = {
    "auto": inference_pb2.TOOL_CHOICE_MODE_AUTO,
    "none": inference_pb2.TOOL_CHOICE_MODE_NONE,
    "required": inference_pb2.TOOL_CHOICE_MODE_REQUIRED,
}


def _json_text(value: Mapping[str, Any] | str | None) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def tool(item: ToolInput) -> inference_pb2.Tool:
    """One tool as a wire ``Tool``.

    Raises:
        ValueError: a mapping without a function name.
    """
    if isinstance(item, Tool):
        return inference_pb2.Tool(name=item.name, description=item.description,
                                  parameters=_json_text(item.parameters))
    spec = item.get("function", item) if item.get("type", "function") == "function" else {}
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"tools: each tool needs a function name, not {dict(item)!r}")
    return inference_pb2.Tool(name=name, description=str(spec.get("description") or ""),
                              parameters=_json_text(spec.get("parameters")))


def tools(items: Iterable[ToolInput]) -> list[inference_pb2.Tool]:
    return [tool(t) for t in items]


def tool_choice(choice: str | Mapping[str, Any] | None) -> inference_pb2.ToolChoice | None:
    """``auto``/``none``/``required``, a tool's name, or OpenAI's
    ``{"type": "function", "function": {"name": ...}}``; None: unset (auto).

    Raises:
        ValueError: an empty name or a mapping without one.
    """
    if choice is None:
        return None
    if isinstance(choice, Mapping):
        spec = choice.get("function")
        name = spec.get("name") if isinstance(spec, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool_choice: give auto, none, required or a tool's name, "
                             f"not {dict(choice)!r}")
        return inference_pb2.ToolChoice(function=name)
    if choice in _MODES:
        return inference_pb2.ToolChoice(mode=_MODES[choice])
    if not choice:
        raise ValueError("tool_choice: give auto, none, required or a tool's name")
    return inference_pb2.ToolChoice(function=choice)


def _call(item: ToolCall | Mapping[str, Any]) -> ToolCall:
    if isinstance(item, ToolCall):
        return item
    spec = item.get("function", item)
    arguments = spec.get("arguments", "")
    return ToolCall(id=str(item.get("id", "")), name=str(spec.get("name", "")),
                    arguments=arguments if isinstance(arguments, str)
                    else json.dumps(arguments))


def message_from_mapping(item: Mapping[str, Any]) -> Message:
    """A chat message from a dict: ``role`` and ``content``, with OpenAI's ``tool_calls``
    (assistant) and ``tool_call_id`` (tool)."""
    return Message(item["role"], item.get("content") or "",
                   tool_calls=tuple(_call(c) for c in item.get("tool_calls") or ()),
                   tool_call_id=str(item.get("tool_call_id") or ""))


def wire_calls(calls: Sequence[ToolCall]) -> list[inference_pb2.ToolCall]:
    return [inference_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
            for c in calls]


def deltas(msg: inference_pb2.GenerateResponse) -> tuple[ToolCallDelta, ...]:
    return tuple(ToolCallDelta(index=d.index, id=d.id, name=d.name, arguments=d.arguments)
                 for d in msg.tool_calls)


def joined(pieces: Iterable[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """The whole calls of a stream's pieces, in index order."""
    calls: dict[int, list[str]] = {}
    for d in pieces:
        id_, name, arguments = calls.setdefault(d.index, ["", "", ""])
        calls[d.index] = [id_ or d.id, name or d.name, arguments + d.arguments]
    return tuple(ToolCall(id=c[0], name=c[1], arguments=c[2])
                 for _, c in sorted(calls.items()))
