"""llamad's gRPC messages over HTTP: a JSON body or a query string read into a message
(protobuf's JSON mapping), a message written as JSON, and the JSON Schema of a message.

The three are driven by the same message descriptors, so the OpenAPI document
(:mod:`._openapi`) describes exactly what is read and written. Reading follows the
proto3 JSON mapping: a field by its proto name (``top_k``) or its lowerCamelCase JSON name
(``topK``), ``null`` for its default, an enum by name or number, a 64-bit integer as a
number or a decimal string, bytes as base64, a ``google.protobuf.Timestamp`` as an RFC
3339 time. What does not fit is refused as :class:`~._errors.ParamError` naming the field
by its path (``filters.tags[1]``), never guessed from a message.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from multidict import MultiMapping

from . import _parse
from ._errors import ParamError

M = TypeVar("M", bound=Message)
Descriptor = Any
"""A message's descriptor (upb's at run time; the stubs name another class)."""
Field = Any
"""A field's descriptor (as :data:`Descriptor`)."""

_TIMESTAMP = "google.protobuf.Timestamp"
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_WIDE = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64,
         FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_UINT64,
         FieldDescriptor.TYPE_FIXED64}
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _fields(descriptor: Descriptor) -> dict[str, Field]:
    """Each field by its proto name and by its JSON name."""
    named: dict[str, Field] = {}
    for field in descriptor.fields:
        named[field.name] = field
        named[field.json_name] = field
    return named


def read_body(body: Mapping[str, Any], cls: type[M], *, skip: tuple[str, ...] = ()) -> M:
    """``body`` (a JSON object) read into a ``cls`` message; the keys in ``skip`` are the
    route's own (``stream``) and left out.

    Raises:
        ParamError: an unknown field, a field given twice, or a value of the wrong type,
            naming the field's path.
    """
    message = cls()
    _fill(message, {k: v for k, v in body.items() if k not in skip}, "")
    return message


def _fill(message: Message, value: object, where: str) -> None:
    descriptor = message.DESCRIPTOR
    if not isinstance(value, Mapping):
        raise ParamError(where or "body", f"{where or 'the body'} must be an object, not "
                                          f"{_parse.kind(value)}")
    named = _fields(descriptor)
    seen: set[str] = set()
    for key, item in value.items():
        field = named.get(key)
        path = _join(where, str(key))
        if field is None:
            known = ", ".join(f.name for f in descriptor.fields)
            raise ParamError(path, f'unknown field "{str(key)[:100]}": a '
                                   f"{descriptor.full_name} has {known}")
        path = _join(where, field.name)
        if field.name in seen:
            raise ParamError(path, f"{path} is given twice")
        seen.add(field.name)
        if item is None:  # null: the field's default
            continue
        _set(message, field, item, path)


def _set(message: Message, field: Field, item: object, path: str) -> None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        raise ParamError(path, f"{path} cannot be given")  # no request carries a map
    if field.is_repeated:
        if not isinstance(item, list):
            raise ParamError(path, f"{path} must be an array, not {_parse.kind(item)}")
        target = getattr(message, field.name)
        for i, element in enumerate(item):
            where = f"{path}[{i}]"
            if field.message_type is not None:
                _message_value(target.add(), element, where)
            else:
                target.append(_scalar(field, element, where))
        return
    if field.message_type is not None:
        _message_value(getattr(message, field.name), item, path)
        return
    setattr(message, field.name, _scalar(field, item, path))


def _message_value(target: Message, item: object, path: str) -> None:
    if target.DESCRIPTOR.full_name == _TIMESTAMP:
        if not isinstance(item, str):
            raise ParamError(path, f"{path} must be an RFC 3339 time "
                                   f"(2026-01-31T00:00:00Z), not {_parse.kind(item)}")
        try:
            target.FromJsonString(item)  # type: ignore[attr-defined]
        except ValueError:
            raise ParamError(path, f"{path} must be an RFC 3339 time with its offset, "
                                   f"within the years 1 to 9999 (2026-01-31T00:00:00Z), "
                                   f"not {item[:60]!r}") from None
        return
    _fill(target, item, path)


def _scalar(field: Field, item: object, path: str) -> object:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        if not isinstance(item, str):
            raise ParamError(path, f"{path} must be a string, not {_parse.kind(item)}")
        return item
    if kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(item, bool):
            raise ParamError(path, f"{path} must be true or false, not {_parse.kind(item)}")
        return item
    if kind == FieldDescriptor.TYPE_ENUM:
        return _enum(field.enum_type, item, path)
    if kind == FieldDescriptor.TYPE_BYTES:
        if not isinstance(item, str):
            raise ParamError(path, f"{path} must be base64 text, not {_parse.kind(item)}")
        try:  # the JSON mapping takes the standard and the URL-safe alphabets
            padded = item + "=" * (-len(item) % 4)
            return base64.b64decode(padded.replace("-", "+").replace("_", "/"),
                                    validate=True)
        except (binascii.Error, ValueError):
            raise ParamError(path, f"{path} is not valid base64") from None
    if kind in _FLOATS:
        if isinstance(item, bool) or not isinstance(item, int | float) \
                or not math.isfinite(item):
            raise ParamError(path, f"{path} must be a finite number, not "
                                   f"{_parse.kind(item)}")
        return float(item)
    low, high = _INT_RANGES[kind]
    value = item
    if isinstance(value, str) and value.lstrip("-").isdigit():  # the mapping allows "5"
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = value if isinstance(value, int) and not isinstance(value, bool) \
            else _parse.kind(value)
        raise ParamError(path, f"{path} must be an integer in {low}..{high}, not {shown}")
    return value


def _enum(enum: Any, item: object, path: str) -> int:
    if isinstance(item, int) and not isinstance(item, bool) and item in enum.values_by_number:
        return item
    if isinstance(item, str) and item in enum.values_by_name:
        return int(enum.values_by_name[item].number)
    names = ", ".join(v.name for v in enum.values)
    raise ParamError(path, f"{path} must be a {enum.name} ({names}), not "
                           f"{str(item)[:80]!r}")


def read_query(query: MultiMapping[str], cls: type[M], *, skip: tuple[str, ...] = ()) -> M:
    """A query string read into a ``cls`` message: each field a parameter (a repeated one
    given once per value), its text read as the JSON mapping reads a string of it.

    Raises:
        ParamError: an unknown parameter or a value that does not parse, naming it.
    """
    message = cls()
    named = _fields(message.DESCRIPTOR)
    for key in set(query.keys()):
        field = named.get(key)
        if field is None or field.name in skip:
            params = ", ".join(f.name for f in message.DESCRIPTOR.fields if f.name not in skip)
            raise ParamError(key, f"unknown query parameter {key[:100]!r}: this route takes "
                                  f"{params}")
        values = query.getall(key)
        if not field.is_repeated and len(values) > 1:
            raise ParamError(field.name, f"{field.name} is given {len(values)} times")
        items = [_from_text(field, v) for v in values]
        _set(message, field, items if field.is_repeated
             else items[0], field.name)
    return message


def _from_text(field: Field, text: str) -> object:
    """A query parameter's text as the JSON value the mapping would carry."""
    if field.type == FieldDescriptor.TYPE_BOOL:
        return {"true": True, "false": False}.get(text, text)
    if field.type in _FLOATS:
        try:
            return float(text)
        except ValueError:
            return text
    if field.type == FieldDescriptor.TYPE_ENUM and text.isdigit():
        return int(text)
    return text


def to_json(message: Message) -> dict[str, Any]:
    """``message`` in protobuf's JSON mapping with the proto's field names (as Ask's
    events); fields at their default are left out, 64-bit integers are strings."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def ref(descriptor: Descriptor) -> dict[str, Any]:
    """A reference to a message's schema among the document's components."""
    return {"$ref": f"#/components/schemas/{descriptor.full_name}"}


def message_schema(descriptor: Descriptor, components: dict[str, Any], *,
                   skip: tuple[str, ...] = (),
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of ``descriptor`` in the JSON mapping (proto names; the
    lowerCamelCase names are read too); the messages it holds are added to
    ``components`` and referenced. ``extra``: route-level fields beside the message's."""
    properties = {f.name: field_schema(f, components) for f in descriptor.fields
                  if f.name not in skip}
    properties.update(extra or {})
    return {"type": "object", "properties": properties, "additionalProperties": False}


def field_schema(field: Field, components: dict[str, Any]) -> dict[str, Any]:
    """One field's schema (an array of the element's schema when repeated)."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value = field.message_type.fields_by_name["value"]
        return {"type": "object", "additionalProperties": _single(value, components)}
    single = _single(field, components)
    if field.is_repeated:
        return {"type": "array", "items": single}
    return single


def _single(field: Field, components: dict[str, Any]) -> dict[str, Any]:
    kind = field.type
    if field.message_type is not None:
        message = field.message_type
        if message.full_name == _TIMESTAMP:
            return {"type": "string", "format": "date-time"}
        if message.full_name not in components:
            components[message.full_name] = {}  # a placeholder: recursion stops here
            components[message.full_name] = message_schema(message, components)
        return ref(message)
    if kind == FieldDescriptor.TYPE_STRING:
        return {"type": "string"}
    if kind == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if kind == FieldDescriptor.TYPE_BYTES:
        return {"type": "string", "contentEncoding": "base64"}
    if kind == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        return {"type": ["string", "integer"],
                "enum": [v.name for v in enum.values] + [v.number for v in enum.values]}
    if kind in _FLOATS:
        return {"type": "number"}
    low, high = _INT_RANGES[kind]
    if kind in _WIDE:  # written as a decimal string, read as either
        return {"type": ["integer", "string"], "pattern": "^-?[0-9]+$",
                "minimum": low, "maximum": high}
    return {"type": "integer", "minimum": low, "maximum": high}
