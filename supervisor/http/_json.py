"""JSON text that must hold an object: a child's answer, a tool's parameters, a call's
arguments. One parse and one check, so every caller refuses the same two things."""

from __future__ import annotations

from typing import Any

import orjson


class NotAJsonObject(ValueError):
    """The text is not JSON, or is JSON but not an object. The message completes a
    sentence about the text: ``f"tools[0].parameters {exc}"``."""


def json_object(text: str | bytes) -> dict[str, Any]:
    """``text`` parsed: a JSON object.

    Raises:
        NotAJsonObject: it is not valid JSON (the message says where it broke), or its
            value is not an object.
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise NotAJsonObject(f"is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise NotAJsonObject("must be a JSON object")
    return value
