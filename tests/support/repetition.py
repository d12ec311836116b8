"""Degenerate-repetition checks on generated text, shared by the answer-quality bench and
the integration test of the default model's answers.

A small model that has lost its way repeats itself: one line forty times, one token
hundreds of times (``1000000…``), or a short phrase over and over. These are measured,
not guessed at, on whitespace-split words and stripped lines.
"""

from __future__ import annotations

import re

MAX_LINE_REPEATS = 2
"""A non-empty line may appear at most this many times in one answer."""
MAX_NGRAM_RUN = 4
"""A word or phrase of up to 4 words may repeat back to back at most this many times."""
MAX_CHAR_RUN = 24
"""A letter or digit may repeat back to back at most this many times."""
MAX_LOOP = 6
"""A piece of 2..30 characters holding a letter or digit (``1.0.0-``) may repeat back to
back at most this many times, spaces or not."""

_CITATION = re.compile(r"\[S\d+\]")
_LOOP = re.compile(r"(.{2,30}?)\1{" + str(MAX_LOOP) + ",}", re.DOTALL)


def line_repeats(text: str) -> int:
    """The most times any one line (stripped) with a letter or digit appears: markup of
    its own (a code fence, with or without its language, a rule) is not content
    repeated."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        key = line.strip()
        if any(c.isalnum() for c in key) and not key.startswith("```"):
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=0)


def ngram_run(text: str, longest: int = 4) -> int:
    """The most times a phrase of 1..``longest`` words repeats back to back."""
    words = text.split()
    best = 1 if words else 0
    for n in range(1, longest + 1):
        i = 0
        while i + n <= len(words):
            run = 1
            while words[i + run * n: i + (run + 1) * n] == words[i: i + n]:
                run += 1
            best = max(best, run)
            i += n * run if run > 1 else 1
    return best


def char_run(text: str) -> int:
    """The longest run of one letter or digit (``0000…``)."""
    best = 0
    for match in re.finditer(r"([0-9A-Za-z])\1*", text):
        best = max(best, len(match.group(0)))
    return best


def loop(text: str) -> str:
    """A piece (2..30 characters, with a letter or digit) repeated back to back more
    than :data:`MAX_LOOP` times, or ""."""
    for match in _LOOP.finditer(text):
        if any(c.isalnum() for c in match.group(1)):
            return match.group(1)
    return ""


def degenerate(text: str) -> list[str]:
    """What is degenerate in ``text``, in words; empty when nothing is."""
    found = []
    if (n := line_repeats(text)) > MAX_LINE_REPEATS:
        found.append(f"a line repeated {n} times")
    if (n := ngram_run(text)) > MAX_NGRAM_RUN:
        found.append(f"a phrase repeated {n} times back to back")
    if (n := char_run(text)) > MAX_CHAR_RUN:
        found.append(f"a character repeated {n} times")
    if piece := loop(text):
        found.append(f"{piece!r} repeated more than {MAX_LOOP} times back to back")
    return found


def cites(text: str) -> bool:
    """Whether ``text`` cites a source label inline ([S1], [S2]...)."""
    return _CITATION.search(text) is not None
