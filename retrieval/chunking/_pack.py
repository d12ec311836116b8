"""Prose for the chunker (:mod:`retrieval.chunking._chunker`): split text into units, pack units
into chunks. Markdown and config pack their own units with the same :func:`pack`.

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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["CODE", "STRETCH", "TEXT", "WORDS", "Unit", "pack", "prose_units", "split"]

# A packing unit: (whitespace joining it to the previous unit, text, kind). No unit text is
# empty or whitespace-only.
Unit = tuple[str, str, int]
TEXT = 0     # prose: packed within the target, may be repeated as overlap
CODE = 1     # code: packed within the target, never repeated as overlap
STRETCH = 2  # a whole fence, or the first piece of a cut one: like CODE, but it may
#              stretch the chunk to max_chars to stay with the text that leads into it

# Split levels below the paragraph, coarsest first; group 1 is the separator kept between
# the pieces.
_SENTENCE = re.compile(r"[.!?][\"')\]]*(\s+)")
_LEVELS = (_SENTENCE, re.compile(r"(\n)"), re.compile(r"(\s+)"))
WORDS = 2  # index of the whitespace level in _LEVELS
_WS = re.compile(r"\s+")
_CLOSERS = "\"')]"


def split(text: str, sep: str, target: int, level: int = 0) -> Iterator[Unit]:
    """``text`` (non-empty) as units of at most ``target``, split at the coarsest level that
    makes them fit; the first unit carries ``sep``."""
    if len(text) <= target:
        yield sep, text, TEXT
        return
    if level == len(_LEVELS):
        for i in range(0, len(text), target):
            yield (sep if i == 0 else ""), text[i:i + target], TEXT
        return
    start = 0
    for m in _LEVELS[level].finditer(text):
        a, b = m.span(1)
        if a > start:
            piece = text[start:a]
            if len(piece) <= target:  # the common case, without a nested generator
                yield sep, piece, TEXT
            else:
                yield from split(piece, sep, target, level + 1)
            sep = text[a:b]
        else:  # leading whitespace: nothing before it to split off
            sep += text[a:b]
        start = b
    if start < len(text):
        yield from split(text[start:], sep, target, level + 1)


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


def prose_units(text: str, target: int) -> Iterator[Unit]:
    """``text``'s paragraphs as units of at most ``target``."""
    for sep, para in _paragraphs(text.split("\n")):
        yield from split(para, sep, target)


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


def _overlap(items: list[Unit], budget: int) -> str:
    """The overlap to repeat from a chunk made of ``items``: ``_tail`` of its trailing
    prose, never reaching back into code."""
    parts: list[str] = []
    total = 0
    for sep, text, kind in reversed(items):
        if kind != TEXT:
            break
        parts.append(text)
        total += len(text)
        if total >= budget:
            break
        parts.append(sep)
        total += len(sep)
    text = "".join(reversed(parts)).lstrip()
    return _tail(text, budget)


def _join(items: list[Unit]) -> str:
    parts = [items[0][1]]
    for sep, text, _ in items[1:]:
        parts += (sep, text)
    return "".join(parts)


def pack(units: Iterable[Unit], target: int, overlap: int, limit: int) -> list[str]:
    """Greedy packing of units into chunk bodies of at most ``target``, or ``limit`` for a
    chunk stretched by a ``STRETCH`` unit, with overlap as in the module docstring."""
    out: list[str] = []
    items: list[Unit] = []
    length = 0
    for sep, text, kind in units:
        cap = limit if kind == STRETCH else target
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
            items = [("", tail, TEXT), (sep, text, kind)]
            length = len(tail) + len(sep) + len(text)
        else:
            items = [("", text, kind)]
            length = len(text)
    if items:
        out.append(_join(items))
    return out


def heading_prefix(heading: str, size: int) -> str:
    """What a chunk of at most ``size`` characters starts with to say where it stands:
    its heading (or path) and a blank line, cut to half the chunk with "…"; nothing when
    there is no heading or no room."""
    cap = size // 2
    if not heading or cap < 4:
        return ""
    if len(heading) + 2 <= cap:
        return heading + "\n\n"
    return heading[:cap - 3] + "…\n\n"
