"""Line blocks for the chunker (:mod:`retrieval.chunking._chunker`): the packing that session, shell
and python share.

Blocks
    A kind's module turns the text into blocks in document order, each a run of lines
    (trailing whitespace dropped, runs of blank lines collapsed to one, none at either
    end) with a ``heading`` (the command, the function's signature...) and a ``header``
    line (the command line, the ``def`` line...), and optionally parts (a class's head and
    its methods, which together are exactly its lines). Blocks are packed whole into
    chunks within ``size``, joined by a newline, or a blank line where the source had
    one. A block longer than ``size`` but within ``max_chars`` is a chunk of its own. A
    longer one with parts is replaced by its parts, each after the first carrying the
    block's header line as context; a longer one without parts is cut into pieces within
    ``size``, between paragraphs (runs of non-blank lines) where they fit, else between
    lines (a longer line at whitespace, then hard; a first line that fits ``size`` with
    the block's context is a piece of its own), each piece after the first carrying the
    header line as context. A chunk that starts with a block or piece that has
    context begins with those lines (all of them cut to ``size // 2`` characters ending
    in ``…``; none when ``size < 8``); two pieces of one block never share a chunk. A
    chunk's ``heading`` is the heading of its first block that has one. No overlap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from ._pack import CODE, STRETCH, WORDS, Unit, pack, split

__all__ = ["Block", "Line", "block_chunks", "block_of", "tidy"]


class Block(NamedTuple):
    """A run of lines the chunker keeps together when it can."""

    heading: str                    # the chunk heading it gives ("" for none)
    lines: list[str]                # tidy lines: see tidy()
    sep: str = "\n"                 # before it: "\n\n" when the source had a blank line
    header: str = ""                # repeated atop each piece after the first when cut
    context: tuple[str, ...] = ()   # lines atop a chunk that starts with this block
    parts: tuple[Block, ...] = ()   # what it is cut into first (together: its lines)


Line = tuple[bool, str]
"""(a blank line before it, the line without trailing whitespace): see :func:`tidy`."""


def tidy(lines: Iterable[str]) -> Iterator[Line]:
    """(blank line before it, line) for each non-blank line, trailing whitespace dropped."""
    blank = False
    for raw in lines:
        line = raw.rstrip()
        if line.strip():
            yield blank, line
            blank = False
        else:
            blank = True


def string_end(line: str, pos: int, close: re.Pattern[str], quote: str) -> int | None:
    """Where a string opened by ``quote`` closes in ``line``, reading from ``pos``: just
    after its closing quote (``close`` matches that quote and the escapes it skips), or
    None when the string goes on past the line."""
    for m in close.finditer(line, pos):
        if m.group() == quote:
            return m.end()
    return None


def block_of(lines: list[Line], start: int, end: int, *, heading: str = "",
             header: str = "", parts: tuple[Block, ...] = ()) -> Block:
    """The block of ``lines[start:end]`` (not empty), a blank line before it in ``sep``."""
    out = [lines[start][1]]
    for blank, line in lines[start + 1:end]:
        if blank:
            out.append("")
        out.append(line)
    return Block(heading, out, "\n\n" if lines[start][0] else "\n", header, (), parts)


def _context(lines: tuple[str, ...], size: int) -> str:
    """The lines atop a chunk, as text ending in a newline; cut to ``size // 2``."""
    if not lines or size < 8:
        return ""
    text = "\n".join(lines)
    cap = size // 2
    if len(text) + 1 <= cap:
        return text + "\n"
    return text[:cap - 2] + "…\n"


def _length(lines: list[str]) -> int:
    return sum(map(len, lines)) + len(lines) - 1


def _units(lines: list[str], room: int, first_room: int) -> Iterator[Unit]:
    """Paragraphs within ``room`` as units, longer ones as lines (split if need be); a
    first line longer than ``room`` but within ``first_room`` whole, on its own."""
    sep = ""
    para: list[str] = []
    if room < len(lines[0]) <= first_room:
        yield "", lines[0], STRETCH
        lines, sep = lines[1:], "\n"
    for line in (*lines, ""):
        if line:
            para.append(line)
            continue
        text = "\n".join(para)
        if len(text) <= room:
            yield sep, text, CODE
        else:
            for n, piece in enumerate(para):
                for s, t, _ in split(piece, sep if n == 0 else "\n", room, WORDS):
                    yield s, t, CODE
        para, sep = [], "\n\n"


class _Item(NamedTuple):
    heading: str
    sep: str
    top: str      # context text, used only when the item starts a chunk
    body: str
    joins: bool   # may share a chunk with the item before it


def _items(block: Block, size: int, max_chars: int) -> Iterator[_Item]:
    top = _context(block.context, size)
    if len(top) + _length(block.lines) <= max_chars:
        yield _Item(block.heading, block.sep, top, "\n".join(block.lines), True)
        return
    inner = (*block.context, block.header) if block.header else block.context
    if block.parts:
        for n, part in enumerate(block.parts):
            yield from _items(part._replace(context=block.context if n == 0 else inner),
                              size, max_chars)
        return
    repeat = _context(inner, size)
    room, first_room = size - len(repeat), size - len(top)
    for n, piece in enumerate(pack(_units(block.lines, room, first_room), room, 0,
                                   first_room)):
        yield _Item(block.heading, block.sep if n == 0 else "\n", top if n == 0 else repeat,
                    piece, n == 0)


def block_chunks(blocks: Iterable[Block], size: int,
                 max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of the blocks, in order."""
    parts: list[str] = []
    heading = ""
    length = 0
    for block in blocks:
        for item in _items(block, size, max_chars):
            if parts and item.joins and length + len(item.sep) + len(item.body) <= size:
                parts += (item.sep, item.body)
                length += len(item.sep) + len(item.body)
                heading = heading or item.heading
                continue
            if parts:
                yield heading, "".join(parts)
            parts = [item.top, item.body]
            length = len(item.top) + len(item.body)
            heading = item.heading
    if parts:
        yield heading, "".join(parts)
