"""Tool calling as a child's chat API takes it (OpenAI's ``tools``, ``tool_choice``,
``parallel_tool_calls``, assistant ``tool_calls`` and ``tool`` messages) and streams it
back (``delta.tool_calls``).

llama-server renders the tools and the calls of the history with the model's Jinja chat
template and parses the calls out of the model's text with the format it detected from
that template (llama.cpp's common/chat.cpp); llamad only passes them through. Its
``tool_choice`` takes the strings ``auto``, ``none`` and ``required``, not OpenAI's
``{"type": "function", ...}`` object: a named function is sent as that tool alone with
``required`` (:meth:`ToolUse.to_json`).

Values here are already validated (:mod:`daemon.checks.validation`); JSON texts (a schema, a
call's arguments) are known to parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

CHOICES = ("auto", "none", "required")
"""The tool_choice modes llama-server takes."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: ``parameters`` is its JSON Schema as JSON text
    ("" for none)."""

    name: str
    description: str = ""
    parameters: str = ""

    def to_json(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = (orjson.loads(self.parameters) if self.parameters
                                  else {"type": "object", "properties": {}})
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolUse:
    """The tools of a chat request and how the model may use them.

    Attributes:
        tools: the functions (not empty).
        choice: one of :data:`CHOICES`, or ``"function"`` with ``function`` naming the
            one tool the model must call.
        function: the named choice's tool name ("" otherwise).
        parallel: ``parallel_tool_calls``; None leaves the runtime's default.
    """

    tools: tuple[Tool, ...]
    choice: str = "auto"
    function: str = ""
    parallel: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The request fields: a named function becomes that tool alone, ``required``
        (llama-server takes no named choice)."""
        tools = self.tools
        choice = self.choice
        if choice == "function":
            tools = tuple(t for t in tools if t.name == self.function)
            choice = "required"
        out: dict[str, Any] = {"tools": [t.to_json() for t in tools], "tool_choice": choice}
        if self.parallel is not None:
            out["parallel_tool_calls"] = self.parallel
        return out


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made, in the history: ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Turn:
    """A chat message with tool calling's parts: an assistant message with
    ``tool_calls``, or a ``tool`` message answering ``tool_call_id``. A plain message is
    a ``(role, content)`` pair."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


Message = tuple[str, str] | Turn
"""A chat message: ``(role, content)``, or a :class:`Turn`."""


def messages_json(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a chat request body."""
    return [m.to_json() if isinstance(m, Turn) else {"role": m[0], "content": m[1]}
            for m in messages]


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call being streamed (OpenAI's ``delta.tool_calls[i]``): the
    first piece of call ``index`` carries its ``id`` and ``name``, the later ones more of
    its ``arguments`` (JSON text once joined)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


def parse_tool_deltas(value: object) -> tuple[ToolCallDelta, ...]:
    """``delta.tool_calls`` of a streamed event (anything malformed is skipped: the
    runtime's own output, not a caller's)."""
    if not isinstance(value, list):
        return ()
    out: list[ToolCallDelta] = []
    for item in value:
        if not isinstance(item, dict):
            continue
        index = item.get("index", 0)
        function = item.get("function") or {}
        if not isinstance(function, dict) or not isinstance(index, int):
            continue
        out.append(ToolCallDelta(index, _text(item.get("id")), _text(function.get("name")),
                                 _text(function.get("arguments"))))
    return tuple(out)


def join_tool_deltas(deltas: Sequence[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """``deltas`` in order, a piece that only continues the arguments of the call just
    before it (same index, no id, no name) joined to it: what several events streamed,
    as one event would have."""
    out: list[ToolCallDelta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if last is not None and last.index == delta.index and not delta.id \
                and not delta.name:
            out[-1] = ToolCallDelta(last.index, last.id, last.name,
                                    last.arguments + delta.arguments)
        else:
            out.append(delta)
    return tuple(out)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
