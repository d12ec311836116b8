"""Markdown for the chunker (:mod:`retrieval.chunking._chunker`): sections by heading, fences kept
whole.

Markdown
    Headings: ATX (``#``..``######`` after at most 3 spaces, closing ``#``s dropped) and
    setext (a ``===`` or ``---`` underline under a one-line paragraph that is not a list
    item or quote). A heading opens a section whose path is the titles of the open
    headings, ``Runbooks > web01 > Disk full``. Code fences: ``` or ~~~ (3 or more, any
    indentation, an info string that for backticks holds no backtick), closed only by a
    line of the same character at least as long; an unterminated fence runs to the end of
    the document and gets a closing line. Nothing inside a fence is a heading.

    Sections to groups: a section with no content besides its heading, followed by one of
    its subsections, is folded into that subsection (its heading line stays in the text).
    A section joins the group before it if the group's text stays within the target and
    the section lies under the parent of the group's first section (a subsection of that
    first section, a sibling, or a sibling's subsection); text before the first heading is
    a group of its own. Chunks and overlap never cross groups; a group of several sections
    always fits one chunk. A group's ``heading`` is the path its sections share: its first
    section's path, or that path's parent once a sibling has joined. Each of its chunks
    begins with ``heading + "\\n\\n"`` (cut to ``size // 2`` characters ending in ``…``;
    nothing for an empty heading or ``size < 8``), and the target and overlap shrink in
    proportion to the room that line takes.

    Fences in groups: a fence that fits ``max_chars`` is one unit that stays in the current
    chunk if the chunk then stays within ``max_chars`` (so code keeps the sentence that
    introduces it), else it starts the next chunk (after the overlap, if that fits). A
    longer fence is cut at line boundaries (a line longer than the room hard) into pieces
    within the target, each wrapped in the original opening line (marker and info string)
    and closing line; the first piece may join the current chunk like a whole fence. If
    those two lines would take more than half the target, the fence's lines are emitted
    unfenced instead. Hence fences are balanced in every chunk whenever each fence's
    ``len(opening) + len(closing) + 2 <= size // 4`` (300 characters at the default size),
    barring two oddities nothing here rewrites: prose with a fence marker inside a line
    (a chunk may start at that word) and code lines longer than the room made of the
    fence's own marker character (a cut piece can look like a closing line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from ._pack import CODE, STRETCH, WORDS, Unit, heading_prefix, pack, split

__all__ = ["markdown_chunks"]

_ATX = re.compile(r" {0,3}(#{1,6})(?=[ \t]|$)")
_SETEXT = re.compile(r" {0,3}(?:=+|-+)[ \t]*")
_NOT_TITLE = re.compile(r" {4}|\t| {0,3}(?:[-*+][ \t]|[-*+]$|\d{1,9}[.)](?:[ \t]|$)|>)")
_FENCE = re.compile(r"([ \t]*)(`{3,}|~{3,})(.*)")


class _Fence(NamedTuple):
    opener: str               # the opening line, verbatim
    closer: str               # the closing line, verbatim (synthesised if unterminated)
    lines: tuple[str, ...]    # the code between them


class _Block(NamedTuple):   # a named tuple: millions are made for a big document
    sep: str                  # "\n" or "\n\n" (a blank line) before it
    text: str                 # paragraph, heading line(s) or the whole rendered fence
    fence: _Fence | None = None


@dataclass
class _Section:
    path: tuple[tuple[int, str], ...]  # (line number, title) of each open heading
    blocks: list[_Block] = field(default_factory=list)
    content: bool = False     # has blocks besides its own heading


def _title(atx_rest: str) -> str:
    title = atx_rest.strip()
    bare = title.rstrip("#")
    if bare != title and (not bare or bare[-1] in " \t"):  # closing sequence
        title = bare.strip()
    return title


def _fence_end(lines: list[str], i: int, marker: str) -> int:
    """Index of the line closing the fence opened at line ``i`` (``len(lines)`` if none)."""
    char, n = marker[0], len(marker)
    for j in range(i + 1, len(lines)):
        t = lines[j].strip(" \t")
        if len(t) >= n and t.count(char) == len(t):
            return j
    return len(lines)


def _scan_markdown(lines: list[str]) -> Iterator[_Section]:
    """One pass over the lines: fences first, then blank lines, headings, paragraphs.

    A flat loop with local state (it runs once per line), yielding each section as soon as
    the next heading starts, so a big document never has all its blocks alive at once.
    """
    current = _Section(())                  # the preamble, yielded only if it has blocks
    levels: list[int] = []                  # levels of the open headings
    opened: list[tuple[int, str]] = []      # their (line number, title)
    para: list[str] = []
    gap = ""                                # separator before the next block

    def add(text: str, fence: _Fence | None = None) -> None:
        nonlocal gap
        current.blocks.append(_Block(gap, text, fence))
        current.content = True
        gap = "\n"

    def section(level: int, number: int, title: str, text: str) -> _Section:
        while levels and levels[-1] >= level:
            levels.pop()
            opened.pop()
        levels.append(level)
        opened.append((number, title))
        return _Section(tuple(opened), [_Block(gap, text)])

    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        bare = line.lstrip(" \t")
        first = bare[:1]
        if first in ("`", "~") and bare[:3] in ("```", "~~~") and (
                m := _FENCE.fullmatch(line)):
            indent, marker, info = m.groups()
            if not (marker[0] == "`" and "`" in info):
                if para:
                    add("\n".join(para).rstrip())
                    para.clear()
                j = _fence_end(lines, i, marker)
                code = lines[i + 1:j]
                if j < n:
                    closer = lines[j]
                else:  # unterminated: the fence runs to the end of the document
                    closer = indent + marker
                    while code and not code[-1].strip():
                        code.pop()
                add("\n".join((line, *code, closer)), _Fence(line, closer, tuple(code)))
                i = j + 1
                continue
        if not bare or bare.isspace():
            if para:
                add("\n".join(para).rstrip())
                para.clear()
            if gap:
                gap = "\n\n"
        elif first == "#" and (m := _ATX.match(line)):
            if para:
                add("\n".join(para).rstrip())
                para.clear()
            if current.blocks:
                yield current
            current = section(len(m.group(1)), i, _title(line[m.end():]), line.rstrip())
            gap = "\n"
        elif (first in ("=", "-") and len(para) == 1 and _SETEXT.fullmatch(line)
              and not _NOT_TITLE.match(para[0])):
            title_line = para.pop()
            if current.blocks:
                yield current
            current = section(1 if first == "=" else 2, i, title_line.strip(),
                              title_line.rstrip() + "\n" + line.rstrip())
            gap = "\n"
        else:
            para.append(line)
        i += 1
    if para:
        add("\n".join(para).rstrip())
    if current.blocks:
        yield current


def _fold(sections: Iterable[_Section]) -> Iterator[_Section]:
    """Fold each content-less section into the subsection that follows it."""
    carry: list[_Block] = []
    prev: _Section | None = None
    for section in sections:
        if prev is not None:
            depth = len(prev.path)
            if (not prev.content and depth and len(section.path) > depth
                    and section.path[:depth] == prev.path):
                carry += prev.blocks
            else:
                if carry:
                    prev.blocks[:0] = carry
                    carry = []
                yield prev
        prev = section
    if prev is not None:
        if carry:
            prev.blocks[:0] = carry
        yield prev


def _length(blocks: list[_Block]) -> int:
    if len(blocks) == 1:
        return len(blocks[0].text)
    return sum(len(b.sep) + len(b.text) for b in blocks) - len(blocks[0].sep)


def _fence_units(fence: _Fence, sep: str, target: int) -> Iterator[Unit]:
    """A fence longer than max_chars as re-fenced pieces of at most ``target``."""
    room = target - len(fence.opener) - len(fence.closer) - 2
    if room < max(1, target // 2):
        # The fence lines would crowd out the code: emit the raw lines, unfenced.
        for line in (fence.opener, *fence.lines, fence.closer):
            if line.strip():
                for s, t, _ in split(line, sep, target, WORDS):
                    yield s, t, CODE
                sep = "\n"
        return
    piece: list[str] = []
    length = -1
    kind = STRETCH
    for line in fence.lines:
        frags = [line] if len(line) <= room else [line[i:i + room]
                                                 for i in range(0, len(line), room)]
        for frag in frags:
            if piece and length + 1 + len(frag) > room:
                yield sep, "\n".join((fence.opener, *piece, fence.closer)), kind
                piece, length, sep, kind = [], -1, "\n", CODE
            piece.append(frag)
            length += 1 + len(frag)
    yield sep, "\n".join((fence.opener, *piece, fence.closer)), kind


def _group_chunks(blocks: list[_Block], heading: str, size: int, overlap: int,
                  max_chars: int) -> Iterator[tuple[str, str]]:
    prefix = heading_prefix(heading, size)
    target = size - len(prefix)
    limit = max_chars - len(prefix)

    def units() -> Iterator[Unit]:
        for b in blocks:
            if b.fence is None:
                yield from split(b.text, b.sep, target)
            elif len(b.text) <= limit:
                yield b.sep, b.text, STRETCH
            else:
                yield from _fence_units(b.fence, b.sep, target)

    for body in pack(units(), target, overlap * target // size, limit):
        yield heading, prefix + body


def markdown_chunks(text: str, size: int, overlap: int,
                    max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a markdown document, in order."""
    group: list[_Block] = []
    first: tuple[tuple[int, str], ...] = ()  # path of the group's first section
    sibling = False                          # has a sibling of the first joined the group?
    length = target = 0
    for section in _fold(_scan_markdown(text.split("\n"))):
        n = _length(section.blocks)
        path = section.path
        depth = len(first)
        if (group and depth and path[:depth - 1] == first[:-1]
                and length + len(section.blocks[0].sep) + n <= target):
            group += section.blocks
            length += len(section.blocks[0].sep) + n
            sibling = sibling or path[:depth] != first
            continue
        if group:  # siblings share only the parent's path
            yield from _group_chunks(group, _path(first[:-1] if sibling else first), size,
                                     overlap, max_chars)
        group, first, length, sibling = list(section.blocks), path, n, False
        target = size - len(heading_prefix(_path(path), size))
    if group:
        yield from _group_chunks(group, _path(first[:-1] if sibling else first), size,
                                 overlap, max_chars)


def _path(path: tuple[tuple[int, str], ...]) -> str:
    return " > ".join(title for _, title in path if title)
