"""Chunking prose (text, and the text of HTML and PDFs): overlap is whole trailing
sentences, text without punctuation splits between words, a paragraph that fits is never
split, a giant token is cut hard, and markdown syntax means nothing in these kinds.
"""

from __future__ import annotations

import itertools
import re

import pytest

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import PLAIN, SENTENCES

# --- prose -------------------------------------------------------------------------------


def test_text_overlap_is_whole_trailing_sentences() -> None:
    """Each chunk after the first repeats whole sentences from the end of the one before,
    within the overlap budget."""
    chunks = chunk_text(SENTENCES, "text", size=400, overlap=120, max_chars=400)
    assert len(chunks) > 10
    overlaps = 0
    for a, b in itertools.pairwise(chunks):
        assert len(b.text) <= 400
        starts = [m.end() for m in re.finditer(r"\. ", b.text)]
        shared = [b.text[:p - 1] for p in starts if a.text.endswith(b.text[:p - 1])]
        if shared:
            overlaps += 1
            assert len(shared[-1]) <= 120
            cut = len(a.text) - len(shared[-1])
            assert a.text[cut - 2:cut] in (". ", "\n\n")
    assert overlaps >= len(chunks) // 2


def test_text_without_punctuation_splits_between_words() -> None:
    """Long unpunctuated paragraphs split at whitespace: no word is ever cut."""
    words = PLAIN.split()
    index = {w: n for n, w in enumerate(words)}
    chunks = chunk_text(PLAIN, "text", size=300, overlap=60, max_chars=300)
    previous_end = 0
    for c in chunks:
        got = c.text.split()
        first = index[got[0]]
        assert got == words[first:first + len(got)]
        repeated = words[first:previous_end]
        assert len(" ".join(repeated)) <= 60
        previous_end = first + len(got)
    assert previous_end == len(words)


def test_text_paragraph_that_fits_is_never_split() -> None:
    """Paragraphs shorter than size each land whole in one chunk."""
    paragraphs = [f"Paragraph {n} " + "word " * (n * 7 % 90) + "end." for n in range(30)]
    chunks = chunk_text("\n\n".join(paragraphs), "text", size=500, overlap=0)
    for p in paragraphs:
        assert any(p in c.text for c in chunks)


def test_text_giant_token_is_cut_hard() -> None:
    """A token longer than size (a base64 blob) is cut into size-long pieces."""
    blob = "QUJD" * 1500
    chunks = chunk_text(f"key: {blob} end", "text", size=1000, overlap=100)
    assert [len(c.text) for c in chunks] == [4, 1000, 1000, 1000, 1000, 1000, 1000, 3]
    assert "".join(c.text for c in chunks) == f"key:{blob}end"


@pytest.mark.parametrize("kind", ["text", "html", "pdf"])
def test_plain_kinds_ignore_markdown_syntax(kind: str) -> None:
    """Extracted text has no headings or fences: "#" and "```" lines are plain text."""
    chunks = chunk_text("# not a heading\n```\ncode\n\nmore", kind)
    assert [(c.heading, c.text) for c in chunks] == [("", "# not a heading\n```\ncode\n\nmore")]
