"""Python source for the chunker (:mod:`retrieval.chunking._chunker`): functions and classes kept
whole, big classes cut between methods.

Python
    Nothing is imported or run, and the file need not parse: a line scanner follows
    strings (triple-quoted ones across lines), comments, brackets and backslash
    continuations, so a statement's first line and its indentation are known even in a
    multi-line call or a docstring whose lines start at column 0. A definition is a
    top-level ``def``, ``async def`` or ``class`` statement with the decorators before
    it and the comment lines just above them (no blank line between), up to the next
    top-level statement (comment lines just above a statement, no blank line between,
    go with it; other comment lines with what precedes them). The top-level statements
    between definitions (imports, constants, the ``if __name__`` block) form blocks of
    their own, packed between. A definition's heading is its signature, its lines
    joined (``def restart(host: str, timeout: int = 30) -> None:``, at most 200
    characters), and its ``def`` or ``class`` line is its header. A class over
    ``max_chars`` is cut the same way between its methods, at its body's indentation:
    its head (the class line, docstring and attributes before the first method) is
    headed by the class's signature, each method with the lines after it by
    ``Class.method``, and every chunk that starts with one of those begins with the
    class line. The packing is :mod:`retrieval.chunking._blocks`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ._blocks import Block, Line, block_chunks, block_of, string_end, tidy

__all__ = ["python_chunks"]

_MAX_HEADING = 200  # characters of a signature heading
_MAX_LINES = 20     # lines of a signature joined into a heading
_DEF = re.compile(r"(?:async[ \t]+)?def[ \t]+(\w+)|class[ \t]+(\w+)")
_TOKEN = re.compile(r"\"\"\"|'''|[\"'#()\[\]{}]|\\$")
_CLOSE = {"'": re.compile(r"\\.|'"), '"': re.compile(r'\\.|"'),
          "'''": re.compile(r"\\.|'''", re.S), '"""': re.compile(r'\\.|"""', re.S)}


def _starts(lines: list[Line]) -> list[bool]:
    """Whether each line starts a statement (not inside a string, brackets or a
    backslash continuation)."""
    starts: list[bool] = []
    quote = ""      # the open triple quote carried over from the line before
    depth = 0
    continued = False
    for _, line in lines:
        starts.append(not quote and depth == 0 and not continued)
        continued = False
        pos = 0
        while True:
            if quote:
                end = string_end(line, pos, _CLOSE[quote], quote)
                if end is None:
                    break  # the string goes on past this line
                pos, quote = end, ""
            m = _TOKEN.search(line, pos)
            if m is None:
                break
            tok, pos = m.group(), m.end()
            if tok == "#":
                break
            if tok == "\\":
                continued = True
            elif tok in "([{":
                depth += 1
            elif tok in ")]}":
                depth = max(0, depth - 1)
            elif len(tok) == 3:
                quote = tok
            else:  # a one-line string: closed on this line, else it ends with it
                end = string_end(line, pos, _CLOSE[tok], tok)
                if end is None:
                    break
                pos = end
    return starts


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _segments(lines: list[Line], starts: list[bool], lo: int, hi: int,
              indent: int) -> Iterator[tuple[int, int, str]]:
    """(start, end, name) of the runs of ``lines[lo:hi]`` at ``indent``: each definition
    (name: its ``def``/``class`` name) and each run of other statements (name ``""``)."""
    bounds: list[tuple[int, str]] = []   # (start, name) of each segment
    decorated = False                    # the statement before was a decorator
    for i in range(lo, hi):
        line = lines[i][1]
        if not starts[i] or _indent(line) != indent or line[indent] == "#":
            continue
        bare = line[indent:]
        m = _DEF.match(bare)
        name = (m.group(1) or m.group(2)) if m else "@" if bare.startswith("@") else ""
        if decorated and name:  # the decorated definition itself, or one more decorator
            if m:
                bounds[-1] = (bounds[-1][0], name)
        elif not bounds and not name:
            bounds.append((lo, ""))  # what comes before the first statement goes with it
        elif name or bounds[-1][1]:
            start = i
            while (start > lo and not lines[start][0] and starts[start - 1]
                   and _indent(lines[start - 1][1]) == indent
                   and lines[start - 1][1][indent] == "#"
                   and not lines[start - 1][1].startswith("#!")):
                start -= 1  # the comment lines just above go with it
            if bounds and start <= bounds[-1][0]:
                start = i
            bounds.append((start, name))
        decorated = name == "@"
    if not bounds or bounds[0][0] > lo:
        bounds.insert(0, (lo, ""))
    for n, (start, name) in enumerate(bounds):
        end = bounds[n + 1][0] if n + 1 < len(bounds) else hi
        yield start, end, "" if name == "@" else name


def _signature(lines: list[Line], starts: list[bool], lo: int, hi: int,
               indent: int) -> int:
    """Index of the ``def``/``class`` line in a definition's lines (``lo`` if none)."""
    for i in range(lo, hi):
        line = lines[i][1]
        if starts[i] and _indent(line) == indent and _DEF.match(line[indent:]):
            return i
    return lo


def _statement(lines: list[Line], starts: list[bool], i: int, hi: int) -> str:
    """The statement starting at line ``i`` on one line (a signature over several lines
    joined, whitespace collapsed), at most ``_MAX_HEADING`` characters."""
    parts = [lines[i][1].strip()]
    for j in range(i + 1, min(hi, i + _MAX_LINES)):
        if starts[j]:
            break
        parts.append(lines[j][1].strip())
    text = " ".join(" ".join(parts).split())
    return text if len(text) <= _MAX_HEADING else text[:_MAX_HEADING - 1] + "…"


def _body_indent(lines: list[Line], starts: list[bool], lo: int, hi: int,
                 outer: int) -> int:
    """The indentation of the first statement deeper than ``outer`` (-1 if none)."""
    for i in range(lo, hi):
        line = lines[i][1]
        if starts[i] and _indent(line) > outer and line.lstrip(" \t")[0] != "#":
            return _indent(line)
    return -1


def _blocks(text: str) -> Iterator[Block]:
    lines = list(tidy(text.split("\n")))
    starts = _starts(lines)
    for start, end, name in _segments(lines, starts, 0, len(lines), 0):
        if not name:
            yield block_of(lines, start, end)
            continue
        sig = _signature(lines, starts, start, end, 0)
        header = lines[sig][1]
        parts: tuple[Block, ...] = ()
        if header.startswith("class"):
            parts = _methods(lines, starts, (start, end), sig, name)
        yield block_of(lines, start, end, heading=_statement(lines, starts, sig, end),
                       header=header, parts=parts)


def _methods(lines: list[Line], starts: list[bool], span: tuple[int, int], sig: int,
             name: str) -> tuple[Block, ...]:
    """A class's head and methods as blocks, to cut it between them."""
    start, end = span
    indent = _body_indent(lines, starts, sig + 1, end, 0)
    if indent < 0:
        return ()
    parts: list[Block] = []
    for lo, hi, method in _segments(lines, starts, start, end, indent):
        if not method:
            parts.append(block_of(lines, lo, hi, heading=_statement(lines, starts, sig, end)))
            continue
        line = lines[_signature(lines, starts, lo, hi, indent)][1]
        parts.append(block_of(lines, lo, hi, heading=f"{name}.{method}", header=line))
    return tuple(parts)


def python_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a Python file, in order."""
    return block_chunks(_blocks(text), size, max_chars)
