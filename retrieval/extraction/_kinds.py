"""Document kinds, defined once: what a document is decides how it is extracted and
chunked.

The extractors (:mod:`retrieval.extraction._extract`), the chunker
(:mod:`retrieval.chunking._chunker`), ingest validation and directory scans all take their kinds
from here; outside the package they are :data:`retrieval.KINDS` and :func:`retrieval.kind_for`.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ..errors import InvalidDocument

KINDS: tuple[str, ...] = ("markdown", "text", "html", "pdf", "config", "yaml", "json",
                            "toml", "shell", "python", "session")
"""Every document kind, in the order messages list them."""

SUFFIXES: dict[str, str] = {
    ".md": "markdown", ".markdown": "markdown",
    ".txt": "text", ".log": "text", ".rst": "text", ".text": "text",
    ".html": "html", ".htm": "html",
    ".cfg": "config", ".conf": "config", ".config": "config", ".ios": "config",
    ".junos": "config",
    ".pdf": "pdf",
    ".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".ksh": "shell",
    ".py": "python",
}
"""File suffix (lower case) -> kind. Anything else is unsupported (``session`` has no
suffix: transcripts are pushed, by history sources or callers)."""


def kind_for(path: PurePosixPath | Path) -> str | None:
    """The kind of a file by its suffix (case-insensitive); None when unsupported."""
    return SUFFIXES.get(path.suffix.lower())


def check_kind(kind: str, name: str = "") -> str:
    """``kind`` unchanged if it is one of :data:`KINDS`.

    Raises:
        InvalidDocument: it is not; the message lists the kinds (after ``name``, if any).
    """
    if kind not in KINDS:
        raise InvalidDocument(f"{name + ': ' if name else ''}kind must be one of "
                              f"{', '.join(KINDS)}, not {kind!r}")
    return kind
