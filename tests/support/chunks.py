"""What every chunking must guarantee, as assertions shared by the chunker's tests and its
fuzzing: chunks cover the source in order, are bounded, numbered and deterministic."""

from __future__ import annotations

import re

from retrieval.chunking._chunker import Chunk, chunk_text

FENCE_LINE = re.compile(r"[ \t]*(`{3,}|~{3,})")

PROSE_KINDS = ("text", "html", "pdf")
"""Kinds whose chunks have no heading."""
PATH_KINDS = ("markdown", "yaml", "json", "toml")
"""Kinds whose chunks begin with their heading path (see :func:`prefix_of`)."""
CONTEXT_LINES = {"config": 1, "session": 1, "shell": 1, "python": 2}
"""Kinds whose chunks may begin with up to this many repeated lines (a config block's
header, a session's command, a function's definition line, a class line)."""


def prefix_of(chunk: Chunk, size: int) -> str:
    """The heading-path line chunk_text adds to a markdown (or other path kind's) chunk
    ("" when none)."""
    if not chunk.heading or size < 8:
        return ""
    cap = size // 2
    if len(chunk.heading) + 2 <= cap:
        return chunk.heading + "\n\n"
    return chunk.heading[:cap - 3] + "…\n\n"


def body(chunk: Chunk, kind: str, size: int) -> str:
    """The chunk's text without the added heading-path line."""
    prefix = prefix_of(chunk, size) if kind in PATH_KINDS else ""
    assert chunk.text.startswith(prefix)
    return chunk.text[len(prefix):]


def without_fence_lines(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if not FENCE_LINE.match(line))


def squeeze(text: str) -> str:
    return "".join(text.split())


def assert_covered(source: str, chunks: list[Chunk], kind: str, size: int) -> None:
    """Each chunk is a slice of the source (modulo whitespace and added lines) starting
    no later than where the chunks before it stopped, and together they reach the end."""
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    whole = squeeze(without_fence_lines(source) if kind == "markdown" else source)
    pos = 0
    for chunk in chunks:
        text = body(chunk, kind, size)
        if kind == "markdown":
            candidates = [without_fence_lines(text)]
        elif kind in CONTEXT_LINES:  # repeated header or context lines may open the chunk
            candidates = [text]
            for _ in range(CONTEXT_LINES[kind]):
                candidates.append(candidates[-1].partition("\n")[2])
        else:
            candidates = [text]
        ends = []
        for candidate in map(squeeze, candidates):
            if not candidate:
                ends.append(pos)
                continue
            at = whole.rfind(candidate, 0, pos + len(candidate))
            if at >= 0:
                ends.append(at + len(candidate))
        assert ends, f"chunk {chunk.ordinal} is not a slice of the source at or before {pos}"
        pos = max(pos, *ends)
    assert pos == len(whole), f"characters from {pos} of {len(whole)} are in no chunk"


def open_fence_at_end(text: str) -> bool:
    """Whether a code fence is still open at the end of ``text`` (the module's grammar)."""
    marker = ""
    for line in text.split("\n"):
        bare = line.strip(" \t")
        if marker:
            if len(bare) >= len(marker) and bare.count(marker[0]) == len(bare):
                marker = ""
        elif (m := re.fullmatch(r"[ \t]*(`{3,}|~{3,})(.*)", line)) and not (
                m.group(1)[0] == "`" and "`" in m.group(2)):
            marker = m.group(1)
    return bool(marker)


def assert_guarantees(text: str, kind: str, size: int, overlap: int, max_chars: int,
                      chunks: list[Chunk]) -> None:
    assert [c.ordinal for c in chunks] == list(range(1, len(chunks) + 1))
    for c in chunks:
        assert 0 < len(c.text) <= max_chars
        assert c.text.strip()
        if kind in PATH_KINDS:
            assert c.text.startswith(prefix_of(c, size))
        elif kind in PROSE_KINDS:
            assert c.heading == ""
    assert chunk_text(text, kind, size=size, overlap=overlap, max_chars=max_chars) == chunks
