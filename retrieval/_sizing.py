"""Chunk sizes in characters or in tokens of the embedding model (``retrieval.chunk_unit``).

The chunker (:mod:`retrieval.chunking`) counts characters. With ``chunk_unit = tokens``,
``chunk_size`` and ``chunk_overlap`` count tokens of the embedding model instead, in two
steps:

1. **Target.** The document's density is learned from its first :data:`SAMPLE_CHARS`
   characters, counted by the embedding model's tokenizer (the child's ``/tokenize``: one
   call a document); the sizes in tokens times its characters per token are the chunker's
   sizes in characters (``max_chunk_chars`` raised to that size where it is below).
2. **Bound.** Every chunk of more than ``chunk_size`` tokens (a denser stretch than the
   sample: code, tables, non-Latin script) is cut again until it fits, as a chunk longer
   than the embedding model's context is cut in either unit (:func:`fit_tokens`).

Without an embedder (the child down) tokens are estimated at :data:`ESTIMATE_CHARS` characters
each (a conservative figure for English BPE/WordPiece vocabularies): the chunks are then
smaller than with the tokenizer, never larger, and stay as they are when their vectors are
backfilled later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ._embedder import Embedder
from ._limits import RetrievalLimits
from .chunking._chunker import Chunk, chunk_text

CHUNK_UNITS = ("characters", "tokens")
"""The values of ``retrieval.chunk_unit``."""

SAMPLE_CHARS = 20_000
"""Characters of a document tokenized to learn its characters per token."""

ESTIMATE_CHARS = 3.0
"""Characters per token assumed when no tokenizer can be asked."""


async def sized_chunks(text: str, kind: str, limits: RetrievalLimits,
                       embedder: Embedder | None) -> list[Chunk]:
    """``text`` chunked by ``limits`` in their unit, each chunk within the embedding model's
    context (and within ``chunk_size`` tokens in the token unit).

    Raises:
        ValueError: an unknown ``chunk_unit`` (or sizes the chunker refuses).
    """
    if limits.chunk_unit not in CHUNK_UNITS:
        raise ValueError(f"retrieval.chunk_unit must be one of {CHUNK_UNITS}, "
                         f"got {limits.chunk_unit!r}")
    size, overlap, max_chars = limits.chunk_size, limits.chunk_overlap, limits.max_chunk_chars
    budget: int | None = None
    if limits.chunk_unit == "tokens":
        per_token = await chars_per_token(text, embedder)
        size = max(1, round(limits.chunk_size * per_token))
        overlap = min(size - 1, round(limits.chunk_overlap * per_token))
        max_chars = max(max_chars, size)
        budget = limits.chunk_size
    pieces = await asyncio.to_thread(chunk_text, text, kind, size=size, overlap=overlap,
                                     max_chars=max_chars)
    return await fit_tokens(pieces, embedder, budget)


async def chars_per_token(text: str, embedder: Embedder | None) -> float:
    """Characters per token of ``text``'s first :data:`SAMPLE_CHARS` characters by the
    embedder's tokenizer (special tokens included, so a little low: chunks err small);
    :data:`ESTIMATE_CHARS` when there is no embedder or it cannot count."""
    sample = text[:SAMPLE_CHARS]
    if embedder is None or not sample.strip():
        return ESTIMATE_CHARS
    try:
        tokens = await embedder.count_tokens(sample)
    except Exception:  # a tokenizer failure costs only the precision
        return ESTIMATE_CHARS
    return max(1.0, len(sample) / max(1, tokens))


async def fit_tokens(pieces: Sequence[Chunk], embedder: Embedder | None,
                     budget: int | None = None) -> list[Chunk]:
    """Split chunks of more tokens than the embedding model's context (or ``budget``, when
    smaller) until each fits.

    Token density varies within a text (a line of emoji costs a byte-level BPE model a
    token per byte), so the smaller pieces are checked again; a piece whose tokens
    cannot be counted is kept as it is. Without an embedder nothing is counted.
    """
    if embedder is None:
        return list(pieces)
    limit = embedder.context if budget is None else min(budget, embedder.context)
    out = []
    todo = list(reversed(pieces))
    while todo:
        piece = todo.pop()
        # No tokenizer makes more tokens than UTF-8 bytes, plus two special tokens.
        if len(piece.text.encode("utf-8")) + 2 <= limit:
            out.append(piece)
            continue
        try:
            tokens = await embedder.count_tokens(piece.text)
        except Exception:  # kept whole: the embedding model truncates it
            out.append(piece)
            continue
        if tokens <= limit or len(piece.text) < 2:
            out.append(piece)
            continue
        # Re-chunk this piece smaller, in proportion to how far over it is (and always
        # smaller than it was, so this ends).
        size = max(1, min(len(piece.text) - 1, int(len(piece.text) * limit / tokens * 0.9)))
        smaller = chunk_text(piece.text, "text", size=size, overlap=min(100, size // 4),
                             max_chars=size)
        todo.extend(Chunk(0, s.text, piece.heading) for s in reversed(smaller))
    return out
