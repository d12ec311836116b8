"""Shell scripts for the chunker (:mod:`retrieval.chunking._chunker`): functions kept whole.

Shell (sh, bash, zsh, ksh)
    Nothing is run. A function starts at a line ``name() {``, ``name () {``,
    ``function name {`` or ``function name() {`` (any indentation; the ``{`` may open
    the next line instead) and ends on the line where its braces balance again; braces
    inside quotes (single quotes across lines), comments and here-documents
    (``<<WORD``, ``<<-'WORD'``... up to the line ``WORD``; not ``<<<``) do not count.
    A definition line at column 0 inside a function whose braces never balanced ends
    that function (so one stray quote cannot swallow the rest of the script); a
    definition with no ``{`` on its line or the next is just its line. The comment
    lines just above a function (no blank line between; not a ``#!`` line) belong to
    it. The rest of the script (settings, top-level commands) forms blocks between the
    functions. A function's heading is its definition without the ``{`` and what
    follows (``restart_nginx()``, ``function deploy``), and its definition line is its
    header. The packing is :mod:`retrieval.chunking._blocks`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ._blocks import Block, Line, block_chunks, block_of, tidy

__all__ = ["shell_chunks"]

_FUNCTION = re.compile(
    r"[ \t]*(?:function[ \t]+[\w.:@+-]+(?:[ \t]*\([ \t]*\))?|[\w.:@+-]+[ \t]*\([ \t]*\))"
    r"[ \t]*(?:\{|$)")
_TOKEN = re.compile(
    r"\\.|'|\"|(?:^|(?<=[\s;&|(]))#|[{}]|(?<!<)<<-?[ \t]*(['\"]?)([A-Za-z_][\w-]*)\1")
_DOUBLE = re.compile(r'\\.|"')


class _Scanner:
    """Brace depth line by line, skipping quotes, comments and here-documents."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""      # "'" or '"' open across lines
        self.heredoc = ""    # the word that ends the open here-document

    def reset(self) -> None:
        self.depth, self.quote, self.heredoc = 0, "", ""

    def feed(self, line: str) -> None:
        if self.heredoc:
            if line.strip() == self.heredoc:
                self.heredoc = ""
            return
        pos = 0
        while pos <= len(line):
            if self.quote == "'":
                end = line.find("'", pos)
                if end < 0:
                    return
                pos, self.quote = end + 1, ""
            elif self.quote == '"':
                for q in _DOUBLE.finditer(line, pos):
                    if q.group() == '"':
                        pos, self.quote = q.end(), ""
                        break
                else:
                    return
            m = _TOKEN.search(line, pos)
            if m is None:
                return
            tok, pos = m.group(), m.end()
            if tok in ("'", '"'):
                self.quote = tok
            elif tok == "#":
                return
            elif tok == "{":
                self.depth += 1
            elif tok == "}":
                self.depth = max(0, self.depth - 1)
            elif tok.startswith("<<"):
                self.heredoc = m.group(2)


def _comments_above(lines: list[Line], i: int, floor: int) -> int:
    """The first of the comment lines just above line ``i`` (``i`` if none)."""
    while (i > floor and not lines[i][0] and lines[i - 1][1].lstrip().startswith("#")
           and not lines[i - 1][1].startswith("#!")):
        i -= 1
    return i


def _blocks(text: str) -> Iterator[Block]:
    lines = list(tidy(text.split("\n")))
    scan = _Scanner()
    rest = 0        # where the run of lines outside functions began
    start = -1      # where the current function began (-1: not in one)
    sig = base = 0  # its definition line, and the depth before it
    opened = False  # its "{" has been seen
    title = ""      # its heading

    def function(end: int) -> Block:
        return block_of(lines, start, end, heading=title, header=lines[sig][1])

    for i, (_, line) in enumerate(lines):
        m = _FUNCTION.match(line)
        if m and start >= 0 and line[:1] not in (" ", "\t"):
            yield function(i)  # its braces never balanced: a new definition ends it
            scan.reset()
            start, rest = -1, i
        if m and start < 0 and not scan.heredoc and not scan.quote:
            first = _comments_above(lines, i, rest)
            if first > rest:
                yield block_of(lines, rest, first)
            start, sig, base, opened = first, i, scan.depth, m.group().endswith("{")
            title = m.group().strip().removesuffix("{").rstrip()
        scan.feed(line)
        if start < 0:
            continue
        if i == sig and not opened:
            if i + 1 < len(lines) and lines[i + 1][1].lstrip().startswith("{"):
                continue
            yield function(i + 1)  # no body: just the line
            start, rest = -1, i + 1
            continue
        opened = opened or scan.depth > base
        if opened and scan.depth <= base:
            yield function(i + 1)
            start, rest = -1, i + 1
    if start >= 0:
        yield function(len(lines))
    elif rest < len(lines):
        yield block_of(lines, rest, len(lines))


def shell_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a shell script, in order."""
    return block_chunks(_blocks(text), size, max_chars)
