"""A document held for review set against its searchable version: what a reviewer reads
before approving or rejecting it (the operator console's Review page, issue 32).

The change is a unified diff of lines, computed here so that every client shows the same
one; it is bounded (:data:`MAX_DIFF_LINES` lines of at most :data:`MAX_LINE_CHARS`
characters each) so that a hostile or huge document costs the reviewer's page little.
"""

from __future__ import annotations

import asyncio
import difflib
from dataclasses import dataclass

from retrieval import NotFound, Retriever

from .documents import check_id

MAX_DIFF_LINES = 2000
"""Most diff lines answered; the rest are counted (``truncated``)."""
MAX_LINE_CHARS = 2000
"""Longest diff line answered, in characters; a longer one is cut (and says so)."""


@dataclass(frozen=True)
class ReviewChange:
    """A held version against the indexed one.

    Attributes:
        id: the document.
        indexed: whether a version of it is searchable now (else the held one is new).
        lines: the unified diff (``+`` held, ``-`` indexed, `` `` both, ``@@`` hunks).
        truncated: diff lines left out past :data:`MAX_DIFF_LINES`.
        held_chars: the held text's length.
    """

    id: str
    indexed: bool
    lines: tuple[str, ...]
    truncated: int
    held_chars: int


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]} [... {len(line) - MAX_LINE_CHARS} more characters]"


def diff(indexed: str, held: str) -> tuple[list[str], int]:
    """The unified diff of ``indexed`` to ``held`` by lines, bounded: (lines, left out)."""
    lines: list[str] = []
    total = 0
    for line in difflib.unified_diff(indexed.splitlines(), held.splitlines(), "indexed",
                                     "held", lineterm="", n=3):
        if line.startswith(("---", "+++")) and total < 2:  # the two file headers
            total += 1
            continue
        total += 1
        if len(lines) < MAX_DIFF_LINES:
            lines.append(_cut(line))
    return lines, max(0, total - 2 - len(lines))


async def change(retriever: Retriever, doc_id: str) -> ReviewChange:
    """The change a reviewer is asked to approve for ``doc_id``.

    Raises:
        InvalidArgument: an id no document can have (id).
        NotFound: no version of it is held for review.
    """
    check_id(doc_id)
    held, indexed = await retriever.review_texts(doc_id)
    if held is None:
        raise NotFound(f"no version of {doc_id!r} is held for review")
    lines, left_out = await asyncio.to_thread(diff, indexed, held)
    return ReviewChange(doc_id, bool(indexed), tuple(lines), left_out, len(held))
