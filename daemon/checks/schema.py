"""Bounding what a JSON schema costs before it reaches a child (issue 25).

A child turns a schema (``response_format`` json_schema, a tool's ``parameters``) into a
GBNF grammar itself (llama.cpp's ``common/json-schema-to-grammar.cpp``); most of what it
builds is deterministic JSON structure, cheap to apply. What is not, and is refused here:

* nesting deeper than ``max_schema_depth`` (JSON levels: objects and arrays): deep schemas
  make deep grammars, and past ~254 levels llamad's own JSON encoder failed (INTERNAL);
* a ``pattern`` (anchored ``^...$``: the converter turns only those into grammar) whose
  grammar :mod:`daemon.checks.grammar` refuses: a regular expression such as
  ``^(a*)*$`` or ``^(a|a)+$`` is the same trap as an ambiguous GBNF grammar;
* ``minLength``, ``minItems`` or ``minProperties`` above ``max_grammar_repetition``: each
  required repetition is a copy of the item in the grammar. (Maximums are not refused:
  llama.cpp builds at most 2000 optional copies and treats a larger maximum as none.)
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ._gbnf import GrammarSyntaxError, ParseLimits, parse
from .grammar import GrammarLimits, GrammarRefused, check_rules

if TYPE_CHECKING:
    from ..config import Limits

_MINIMUMS = ("minLength", "minItems", "minProperties")


def json_depth(value: Any, stop: int) -> int:
    """How deep objects and arrays nest in ``value`` (a scalar: 0), counting no further
    than ``stop + 1``. Iterative, so a value nested past Python's recursion limit is safe."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if not isinstance(node, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > stop:
            return deepest
        todo.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict)
                                                      else node))
    return deepest


def check_depth(value: Any, max_depth: int) -> None:
    """Raises GrammarRefused when ``value`` nests deeper than ``max_depth``."""
    if json_depth(value, max_depth) > max_depth:
        raise GrammarRefused(f"nests deeper than {max_depth} levels "
                             "(limits.max_schema_depth)")


def checked_schema(field: str, schema: Any, limits: Limits) -> None:
    """Refuse a parsed JSON schema that is costly to turn into a grammar or to apply.

    Raises:
        InvalidArgument: naming ``field``, the place in the schema and the limit.
    """
    try:
        check_schema(schema, GrammarLimits.of(limits), limits.max_schema_depth)
    except GrammarRefused as exc:
        raise InvalidArgument(f"{field} {exc}", field=field) from None


def check_schema(schema: Any, limits: GrammarLimits, max_depth: int) -> None:
    """Refuse a schema that is costly to turn into a grammar or to apply.

    Raises:
        GrammarRefused: naming the schema location (a JSON pointer) and the reason.
    """
    check_depth(schema, max_depth)
    todo: list[tuple[Any, str]] = [(schema, "")]
    while todo:
        node, where = todo.pop()
        if isinstance(node, list):
            todo.extend((v, f"{where}/{i}") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key in _MINIMUMS:
            count = node.get(key)
            if (isinstance(count, int | float) and not isinstance(count, bool)
                    and count > limits.max_repetition):
                raise GrammarRefused(
                    f"asks {key} {count:g} at {where or '/'}: the limit is "
                    f"{limits.max_repetition} (limits.max_grammar_repetition)")
        pattern = node.get("pattern")
        if isinstance(pattern, str) and node.get("type", "string") == "string":
            _check_pattern(pattern, f"{where}/pattern", limits)
        todo.extend((v, f"{where}/{_pointer(k)}") for k, v in node.items()
                    if isinstance(v, dict | list))


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _check_pattern(pattern: str, where: str, limits: GrammarLimits) -> None:
    if len(pattern) < 2 or not pattern.startswith("^") or not pattern.endswith("$"):
        return  # the converter takes an unanchored pattern as any string
    refusal = _pattern_refusal(pattern, limits)
    if refusal is not None:
        raise GrammarRefused(f"has a pattern at {where} that {refusal}")


_WHERE = re.compile(r" \(?at line \d+, column \d+\)?")


@functools.lru_cache(maxsize=256)
def _pattern_refusal(pattern: str, limits: GrammarLimits) -> str | None:
    """Why an anchored ``pattern`` is refused, or None (cached: the check of a long
    pattern takes a few hundred milliseconds, and callers repeat their schemas)."""
    try:
        text = "root ::= " + regex_to_gbnf(pattern[1:-1])
        check_rules(parse(text, ParseLimits(limits.max_rules, limits.max_depth,
                                            limits.max_repetition)), limits)
    except GrammarRefused as exc:  # its place is in the grammar text, not the pattern
        return _WHERE.sub("", str(exc))
    except GrammarSyntaxError as exc:
        return f"is not one llama.cpp can take: {_WHERE.sub('', str(exc))}"
    except ValueError as exc:
        return f"llamad cannot check: {exc}"
    return None


_CLASSES = {"d": "[0-9]", "D": "[^0-9]", "w": "[0-9A-Za-z_]", "W": "[^0-9A-Za-z_]",
            "s": "[ \\t\\n\\r\\x0B\\x0C]", "S": "[^ \\t\\n\\r\\x0B\\x0C]"}
_IN_CLASS = {"d": "0-9", "w": "0-9A-Za-z_", "s": " \\t\\n\\r\\x0B\\x0C"}
_CONTROL = {"n": 10, "r": 13, "t": 9, "f": 12, "v": 11}


def _char(cp: int) -> str:
    """One code point as a GBNF escape (safe inside a literal and a class)."""
    return f"\\x{cp:02X}" if cp < 0x100 else (f"\\u{cp:04X}" if cp < 0x10000
                                               else f"\\U{cp:08X}")


def regex_to_gbnf(regex: str) -> str:
    """The GBNF alternatives a regular expression (the subset llama.cpp converts: groups,
    ``(?:``, ``|``, classes, ``.``, ``* + ? {m,n}``, escapes) stands for, for checking.

    Raises:
        ValueError: syntax the converter does not take (lookarounds, backreferences...).
    """
    out: list[str] = []
    i = 0
    n = len(regex)
    while i < n:
        c = regex[i]
        if c == "(":
            if regex.startswith("(?:", i):
                i += 3
            elif regex.startswith("(?", i):
                raise ValueError("it uses a group syntax other than (...) and (?:...)")
            else:
                i += 1
            out.append("(")
            continue
        if c in ")|*+?":
            out.append(f" {c} ")
        elif c == "{":
            end = regex.find("}", i)
            if end < 0:
                raise ValueError("a '{' is not closed")
            out.append(regex[i:end + 1])
            i = end + 1
            continue
        elif c == ".":
            out.append(" . ")
        elif c == "[":
            i, cls = _char_class(regex, i)
            out.append(f" {cls} ")
            continue
        elif c == "\\":
            if i + 1 >= n:
                raise ValueError("it ends in a backslash")
            e = regex[i + 1]
            if e in _CLASSES:
                out.append(f" {_CLASSES[e]} ")
            elif e.isdigit():
                raise ValueError("it uses a backreference")
            else:
                out.append(f' "{_char(_CONTROL.get(e, ord(e)))}" ')
            i += 2
            continue
        elif c in "^$":
            raise ValueError("it has an anchor inside the pattern")
        else:
            out.append(f' "{_char(ord(c))}" ')
        i += 1
    return "".join(out)


def _char_class(regex: str, i: int) -> tuple[int, str]:
    """The class starting at ``regex[i]`` ('[') as GBNF, and the index after it."""
    j = i + 1
    parts = ["["]
    if j < len(regex) and regex[j] == "^":
        parts.append("^")
        j += 1
    first = True
    while j < len(regex) and (regex[j] != "]" or first):
        first = False
        c = regex[j]
        if c == "\\" and j + 1 < len(regex):
            e = regex[j + 1]
            if e in _IN_CLASS:
                parts.append(_IN_CLASS[e])
            elif e in "DWS":
                raise ValueError(f"it uses \\{e} inside a class")
            else:
                parts.append(_char(_CONTROL.get(e, ord(e))))
            j += 2
            continue
        parts.append("-" if c == "-" and regex[j + 1:j + 2] != "]" and
                     parts[-1] not in ("[", "^") else _char(ord(c)))
        j += 1
    if j >= len(regex):
        raise ValueError("a character class is not closed")
    parts.append("]")
    return j + 1, "".join(parts)
