"""Chunking: extracted text in, citable chunks out.

``chunk_text(text, kind)`` returns ``Chunk(ordinal, text, heading)`` in document order with
ordinals 1..n. The exact rules:

Arguments and guarantees
    ``size > 0``, ``0 <= overlap < size``, ``max_chars >= size`` and a kind of
    :data:`~retrieval.extraction._kinds.KINDS`, else ``ValueError``. ``\\r\\n`` and ``\\r`` become
    ``\\n``; empty or whitespace-only text gives ``[]``. Every chunk is at most ``max_chars`` long,
    never whitespace-only, and the output is a pure function of the arguments. A chunk's
    text is a slice of the input (runs of blank lines collapsed to one, blank lines of
    config, yaml, json and toml dropped, whitespace at the end of a paragraph or line
    dropped; a long line cut where it is split between chunks) plus at most four kinds of
    added lines: the heading path of markdown, yaml, json and toml, the fence lines
    around a piece of a cut code fence, the header line atop a piece of a cut config
    block, and the context lines atop a chunk of a session, shell or python document (the
    command or signature lines the chunk's first piece belongs to). So every
    non-whitespace character of the input is in some chunk.

The rules of each kind are in its module's docstring: :mod:`retrieval.chunking._pack` (prose:
text, html, pdf, and the paragraphs of markdown; the packing every kind shares),
:mod:`retrieval.chunking._markdown` (headings, sections, code fences),
:mod:`retrieval.chunking._config` (Cisco IOS, Arista, Juniper exports),
:mod:`retrieval.chunking._yaml`, :mod:`retrieval.chunking._json` and :mod:`retrieval.chunking._toml`
(structured data, cut and packed by the key tree of :mod:`retrieval.chunking._tree`),
:mod:`retrieval.chunking._session` (shell transcripts: commands with their output),
:mod:`retrieval.chunking._shell` (shell scripts: functions), :mod:`retrieval.chunking._python`
(Python: functions, classes, methods) and :mod:`retrieval.chunking._blocks` (the packing
sessions and code share).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..extraction._kinds import KINDS
from ._config import config_chunks
from ._json import json_chunks
from ._markdown import markdown_chunks
from ._pack import pack, prose_units
from ._python import python_chunks
from ._session import session_chunks
from ._shell import shell_chunks
from ._toml import toml_chunks
from ._yaml import yaml_chunks

__all__ = ["Chunk", "chunk_text"]

_STRUCTURED: dict[str, Callable[[str, int, int], Iterator[tuple[str, str]]]] = {
    "config": config_chunks, "yaml": yaml_chunks, "json": json_chunks, "toml": toml_chunks,
    "shell": shell_chunks, "python": python_chunks, "session": session_chunks}
"""The kinds chunked by their structure, without overlap; markdown has its own rules and
the others (text, html, pdf) are prose."""


@dataclass(frozen=True)
class Chunk:
    """One indexable piece of a document.

    Attributes:
        ordinal: 1-based position in the document (the ``n`` of the chunk id ``<doc>#<n>``).
        text: what is indexed and embedded; for markdown, yaml, json and toml it begins
            with the heading path.
        heading: the heading path (markdown), key path (yaml, json, toml: ``services.web``,
            ``[server.tls]``), block header line (config), command
            (session), function or class signature (shell, python; ``Class.method``
            for a piece of a class cut between methods); ``""`` if none.
    """

    ordinal: int
    text: str
    heading: str


def chunk_text(text: str, kind: str, *, size: int = 1200, overlap: int = 200,
               max_chars: int = 2000) -> list[Chunk]:
    """Split extracted text into chunks by the rules in this module's docstring and those
    of the modules it names.

    Args:
        text: extracted text (any newline convention).
        kind: one of :data:`~retrieval.extraction._kinds.KINDS`.
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
        pieces = markdown_chunks(text, size, overlap, max_chars)
    elif kind in _STRUCTURED:
        pieces = _STRUCTURED[kind](text, size, max_chars)
    else:
        pieces = (("", body) for body in pack(prose_units(text, size), size, overlap, size))
    return [Chunk(n, body, heading) for n, (heading, body) in enumerate(pieces, 1)]
