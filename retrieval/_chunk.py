"""Chunking: extracted text in, citable chunks out.

``chunk_text(text, kind)`` returns ``Chunk(ordinal, text, heading)`` in document order with
ordinals 1..n. The exact rules:

Arguments and guarantees
    ``size > 0``, ``0 <= overlap < size``, ``max_chars >= size`` and a kind among markdown,
    config, text, html, pdf, else ``ValueError``. ``\\r\\n`` and ``\\r`` become ``\\n``;
    empty or whitespace-only text gives ``[]``. Every chunk is at most ``max_chars`` long,
    never whitespace-only, and the output is a pure function of the arguments. A chunk's
    text is a slice of the input (runs of blank lines collapsed to one, whitespace at the
    end of a paragraph or config line dropped) plus at most three kinds of added lines: the
    markdown heading path, the fence lines around a piece of a cut code fence, and the
    header line atop a piece of a cut config block. So every non-whitespace character of
    the input is in some chunk.

Prose (text, html, pdf, and the paragraphs of markdown)
    The units are paragraphs (runs of non-blank lines). A paragraph longer than the target
    is split at sentence ends (``.``, ``!`` or ``?``, then optional closing quotes or
    brackets, then whitespace); a piece still too long at line breaks, then at whitespace,
    then hard every ``target`` characters. Units are packed greedily while the chunk stays
    within the target (``size``), so a paragraph that fits a chunk is never split. Each
    following chunk of the same section starts with an overlap: the longest suffix of the
    previous chunk, within ``overlap`` characters, that starts a sentence (after a sentence
    end or a blank line), else the longest that starts a word. It never reaches back into
    a code fence, and shrinks (to nothing if need be) to keep the chunk within the target.

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

Config (Cisco IOS, Arista, Juniper exports)
    Blank lines are dropped. A block is a non-indented line with the indented lines after
    it and any non-indented comment or terminator lines (``!``, ``#``, ``/*``, ``}``) after
    those; comment lines before the first block form a headerless block. A non-indented
    line ending in ``{`` opens a Juniper brace block that runs until its braces balance
    (braces in double quotes and on comment lines ignored). Blocks are packed whole into
    chunks within ``size``; a block longer than ``size`` but within ``max_chars`` is a
    chunk of its own; a longer one is cut into pieces within ``size``, each after the first
    starting with the block's header line (cut to ``size // 2`` characters ending in
    ``…``). The cuts fall between sub-blocks (a line as shallow as the first line after
    the header, with the deeper and ``}``/``!`` lines after it) where those fit, else
    between lines (a longer line at whitespace, then hard). A chunk's ``heading`` is
    the header line of its first block that has one, a Juniper header without its ``{``.
    There is no overlap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from ._kinds import KINDS

__all__ = ["Chunk", "chunk_text"]

_PROSE_KINDS = frozenset({"text", "html", "pdf"})  # of KINDS; markdown and config have rules


@dataclass(frozen=True)
class Chunk:
    """One indexable piece of a document.

    Attributes:
        ordinal: 1-based position in the document (the ``n`` of the chunk id ``<doc>#<n>``).
        text: what is indexed and embedded; for markdown it begins with the heading path.
        heading: the heading path (markdown) or block header line (config); ``""`` if none.
    """

    ordinal: int
    text: str
    heading: str


def chunk_text(text: str, kind: str, *, size: int = 1200, overlap: int = 200,
               max_chars: int = 2000) -> list[Chunk]:
    """Split extracted text into chunks by the rules in this module's docstring.

    Args:
        text: extracted text (any newline convention).
        kind: ``markdown``, ``config``, ``text``, ``html`` or ``pdf``.
        size: target chunk length in characters.
        overlap: characters of overlap between consecutive prose chunks of one section.
        max_chars: hard upper bound on every chunk's length.

    Returns:
        The chunks in document order; ``[]`` for empty or whitespace-only text.

    Raises:
        ValueError: unknown kind, or ``size``/``overlap``/``max_chars`` out of range.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {sorted(KINDS)}")
    if size <= 0:
        raise ValueError(f"size must be > 0, got {size}")
    if not 0 <= overlap < size:
        raise ValueError(f"overlap must be >= 0 and < size ({size}), got {overlap}")
    if max_chars < size:
        raise ValueError(f"max_chars must be >= size ({size}), got {max_chars}")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return []
    if kind == "markdown":
        pieces = _markdown(text, size, overlap, max_chars)
    elif kind == "config":
        pieces = _config(text, size, max_chars)
    else:
        pieces = (("", body) for body in _pack(_prose_units(text, size), size, overlap, size))
    return [Chunk(n, body, heading) for n, (heading, body) in enumerate(pieces, 1)]


# --- prose: split into units, pack units into chunks -----------------------------------

# A packing unit: (whitespace joining it to the previous unit, text, kind). No unit text is
# empty or whitespace-only.
_Unit = tuple[str, str, int]
_TEXT = 0     # prose: packed within the target, may be repeated as overlap
_CODE = 1     # code: packed within the target, never repeated as overlap
_STRETCH = 2  # a whole fence, or the first piece of a cut one: like _CODE, but it may
#               stretch the chunk to max_chars to stay with the text that leads into it

# Split levels below the paragraph, coarsest first; group 1 is the separator kept between
# the pieces.
_SENTENCE = re.compile(r"[.!?][\"')\]]*(\s+)")
_LEVELS = (_SENTENCE, re.compile(r"(\n)"), re.compile(r"(\s+)"))
_WORDS = 2  # index of the whitespace level in _LEVELS
_WS = re.compile(r"\s+")
_CLOSERS = "\"')]"


def _split(text: str, sep: str, target: int, level: int = 0) -> Iterator[_Unit]:
    """``text`` (non-empty) as units of at most ``target``, split at the coarsest level that
    makes them fit; the first unit carries ``sep``."""
    if len(text) <= target:
        yield sep, text, _TEXT
        return
    if level == len(_LEVELS):
        for i in range(0, len(text), target):
            yield (sep if i == 0 else ""), text[i:i + target], _TEXT
        return
    start = 0
    for m in _LEVELS[level].finditer(text):
        a, b = m.span(1)
        if a > start:
            piece = text[start:a]
            if len(piece) <= target:  # the common case, without a nested generator
                yield sep, piece, _TEXT
            else:
                yield from _split(piece, sep, target, level + 1)
            sep = text[a:b]
        else:  # leading whitespace: nothing before it to split off
            sep += text[a:b]
        start = b
    if start < len(text):
        yield from _split(text[start:], sep, target, level + 1)


def _paragraphs(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(separator, paragraph) for each run of non-blank lines."""
    para: list[str] = []
    sep = ""
    for line in lines:
        if line.strip():
            para.append(line)
        elif para:
            yield sep, "\n".join(para).rstrip()
            para, sep = [], "\n\n"
    if para:
        yield sep, "\n".join(para).rstrip()


def _prose_units(text: str, target: int) -> Iterator[_Unit]:
    for sep, para in _paragraphs(text.split("\n")):
        yield from _split(para, sep, target)


def _tail(text: str, budget: int) -> str:
    """The longest suffix of ``text`` within ``budget`` that starts a sentence (after
    ``.``, ``!`` or ``?`` and whitespace, or after a blank line), else a word; ``""`` if
    there is none."""
    if len(text) <= budget:
        return text
    if budget <= 0:
        return ""
    lo = len(text) - budget  # the suffix must start at or after lo
    word = -1
    for m in _WS.finditer(text, lo - 1):
        p = m.end()
        if p >= len(text):
            break
        q = m.start()
        while q > 0 and text[q - 1].isspace():  # a run straddling lo - 1
            q -= 1
        if text.count("\n", q, p) >= 2:
            return text[p:]
        while q > 0 and text[q - 1] in _CLOSERS:
            q -= 1
        if q > 0 and text[q - 1] in ".!?":
            return text[p:]
        if word < 0:
            word = p
    return text[word:] if word >= 0 else ""


def _overlap(items: list[_Unit], budget: int) -> str:
    """The overlap to repeat from a chunk made of ``items``: ``_tail`` of its trailing
    prose, never reaching back into code."""
    parts: list[str] = []
    total = 0
    for sep, text, kind in reversed(items):
        if kind != _TEXT:
            break
        parts.append(text)
        total += len(text)
        if total >= budget:
            break
        parts.append(sep)
        total += len(sep)
    text = "".join(reversed(parts)).lstrip()
    return _tail(text, budget)


def _join(items: list[_Unit]) -> str:
    parts = [items[0][1]]
    for sep, text, _ in items[1:]:
        parts += (sep, text)
    return "".join(parts)


def _pack(units: Iterable[_Unit], target: int, overlap: int, limit: int) -> list[str]:
    """Greedy packing of units into chunk bodies of at most ``target``, or ``limit`` for a
    chunk stretched by a ``_STRETCH`` unit, with overlap as in the module docstring."""
    out: list[str] = []
    items: list[_Unit] = []
    length = 0
    for sep, text, kind in units:
        cap = limit if kind == _STRETCH else target
        if items and length + len(sep) + len(text) <= cap:
            items.append((sep, text, kind))
            length += len(sep) + len(text)
            continue
        tail = ""
        if items:
            out.append(_join(items))
            budget = min(overlap, cap - len(sep) - len(text))
            if budget > 0:
                tail = _overlap(items, budget)
        if tail:
            items = [("", tail, _TEXT), (sep, text, kind)]
            length = len(tail) + len(sep) + len(text)
        else:
            items = [("", text, kind)]
            length = len(text)
    if items:
        out.append(_join(items))
    return out


# --- markdown ----------------------------------------------------------------------------

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


def _prefix(heading: str, size: int) -> str:
    cap = size // 2
    if not heading or cap < 4:
        return ""
    if len(heading) + 2 <= cap:
        return heading + "\n\n"
    return heading[:cap - 3] + "…\n\n"


def _length(blocks: list[_Block]) -> int:
    if len(blocks) == 1:
        return len(blocks[0].text)
    return sum(len(b.sep) + len(b.text) for b in blocks) - len(blocks[0].sep)


def _fence_units(fence: _Fence, sep: str, target: int) -> Iterator[_Unit]:
    """A fence longer than max_chars as re-fenced pieces of at most ``target``."""
    room = target - len(fence.opener) - len(fence.closer) - 2
    if room < max(1, target // 2):
        # The fence lines would crowd out the code: emit the raw lines, unfenced.
        for line in (fence.opener, *fence.lines, fence.closer):
            if line.strip():
                for s, t, _ in _split(line, sep, target, _WORDS):
                    yield s, t, _CODE
                sep = "\n"
        return
    piece: list[str] = []
    length = -1
    kind = _STRETCH
    for line in fence.lines:
        frags = [line] if len(line) <= room else [line[i:i + room]
                                                 for i in range(0, len(line), room)]
        for frag in frags:
            if piece and length + 1 + len(frag) > room:
                yield sep, "\n".join((fence.opener, *piece, fence.closer)), kind
                piece, length, sep, kind = [], -1, "\n", _CODE
            piece.append(frag)
            length += 1 + len(frag)
    yield sep, "\n".join((fence.opener, *piece, fence.closer)), kind


def _group_chunks(blocks: list[_Block], heading: str, size: int, overlap: int,
                  max_chars: int) -> Iterator[tuple[str, str]]:
    prefix = _prefix(heading, size)
    target = size - len(prefix)
    limit = max_chars - len(prefix)

    def units() -> Iterator[_Unit]:
        for b in blocks:
            if b.fence is None:
                yield from _split(b.text, b.sep, target)
            elif len(b.text) <= limit:
                yield b.sep, b.text, _STRETCH
            else:
                yield from _fence_units(b.fence, b.sep, target)

    for body in _pack(units(), target, overlap * target // size, limit):
        yield heading, prefix + body


def _markdown(text: str, size: int, overlap: int,
              max_chars: int) -> Iterator[tuple[str, str]]:
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
        target = size - len(_prefix(_path(path), size))
    if group:
        yield from _group_chunks(group, _path(first[:-1] if sibling else first), size,
                                 overlap, max_chars)


def _path(path: tuple[tuple[int, str], ...]) -> str:
    return " > ".join(title for _, title in path if title)


# --- config ------------------------------------------------------------------------------

_CONTINUATION = ("!", "#", "}", "/*")


def _braces(line: str) -> int:
    """Net ``{`` minus ``}`` outside double quotes; 0 for comment lines."""
    if line.lstrip().startswith(("#", "/*")):
        return 0
    if '"' not in line:
        return line.count("{") - line.count("}")
    depth, quoted = 0, False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "{}":
            depth += 1 if ch == "{" else -1
    return depth


@dataclass
class _ConfigBlock:
    heading: str
    lines: list[str]
    header: bool  # lines[0] is a header line (not a leading comment)


def _config_blocks(text: str) -> list[_ConfigBlock]:
    blocks: list[_ConfigBlock] = []
    depth = 0
    for raw in text.split("\n"):
        line = raw.rstrip()
        if not line.strip():
            continue
        if depth > 0:
            blocks[-1].lines.append(line)
            depth = max(0, depth + _braces(line))
        elif line[0] in " \t" or line.startswith(_CONTINUATION):
            if blocks:
                blocks[-1].lines.append(line)
            else:
                blocks.append(_ConfigBlock("", [line], header=False))
        else:
            heading = line.strip()
            if heading.endswith("{"):
                heading = heading[:-1].rstrip()
                depth = max(0, _braces(line))
            blocks.append(_ConfigBlock(heading, [line], header=True))
    return blocks


def _children(lines: list[str]) -> Iterator[list[str]]:
    """Lines grouped into sub-blocks: a line as shallow as the first one, with the deeper
    lines and the ``}``/``!`` lines after it (``ge-0/0/1 { ... }``, ``vrf PROD ...``)."""
    base = len(lines[0]) - len(lines[0].lstrip())
    child: list[str] = []
    for line in lines:
        bare = line.lstrip()
        if child and (len(line) - len(bare) > base or bare.startswith(("}", "!"))):
            child.append(line)
        else:
            if child:
                yield child
            child = [line]
    if child:
        yield child


def _config_units(block: _ConfigBlock, room: int) -> Iterator[_Unit]:
    """The block's lines as units within ``room``: whole sub-blocks where they fit, else
    lines, a longer line at whitespace then hard."""
    lines = block.lines
    if block.header:
        yield from _split(lines[0], "", room, _WORDS)
        lines = lines[1:]
    for child in _children(lines) if lines else ():
        text = "\n".join(child)
        if len(text) <= room:
            yield "\n", text, _CODE
        else:
            for line in child:
                yield from _split(line, "\n", room, _WORDS)


def _config_pieces(block: _ConfigBlock, size: int) -> list[str]:
    """A block longer than max_chars, cut into pieces of at most ``size``."""
    repeat = block.lines[0] if block.header and len(block.lines) > 1 else ""
    cap = size // 2
    if repeat and len(repeat) + 1 > cap:
        repeat = repeat[:cap - 2] + "…" if cap >= 3 else ""
    room = size - (len(repeat) + 1 if repeat else 0)
    pieces = _pack(_config_units(block, room), room, 0, room)
    if repeat:
        pieces[1:] = [repeat + "\n" + p for p in pieces[1:]]
    return pieces


def _config(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    group: list[str] = []
    heading = ""
    length = 0
    for block in _config_blocks(text):
        body = "\n".join(block.lines)
        if group and length + 1 + len(body) <= size:
            group.append(body)
            length += 1 + len(body)
            heading = heading or block.heading
            continue
        if group:
            yield heading, "\n".join(group)
        if len(body) > max_chars:
            for piece in _config_pieces(block, size):
                yield block.heading, piece
            group, heading, length = [], "", 0
        else:
            group, heading, length = [body], block.heading, len(body)
    if group:
        yield heading, "\n".join(group)
