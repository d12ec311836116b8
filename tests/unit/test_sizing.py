"""Chunk sizes in tokens (``retrieval.chunk_unit = tokens``, :mod:`retrieval._sizing`):
with a tokenizer every chunk is within chunk_size tokens and near it, a denser stretch is
cut again; without one tokens are estimated conservatively; characters stay as before.
A real Retriever stores the chunks so sized."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from retrieval import RetrievalLimits, Retriever
from retrieval._sizing import ESTIMATE_CHARS, sized_chunks
from retrieval.chunking._chunker import chunk_text
from tests.support.embedder import HashEmbedder

WORDS = ["disk", "replication", "nginx", "certificate", "a", "of", "timestamp", "vpn",
         "gateway", "the", "is", "restart", "configuration", "journal", "on"]


def prose(n_sentences: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize()
                 + "." for _ in range(n_sentences)]
    return "\n\n".join(" ".join(sentences[i:i + 4]) for i in range(0, n_sentences, 4))


class WordTokens(HashEmbedder):
    """A tokenizer of one token a word, plus two special tokens (HashEmbedder's)."""

    def __init__(self) -> None:
        super().__init__("m")
        self.counted = 0

    async def count_tokens(self, text: str) -> int:
        self.counted += 1
        return await super().count_tokens(text)


TOKENS = RetrievalLimits(chunk_unit="tokens", chunk_size=60, chunk_overlap=6)


def test_token_chunks_are_within_and_near_chunk_size() -> None:
    embedder = WordTokens()
    text = prose(60)
    chunks = asyncio.run(sized_chunks(text, "text", TOKENS, embedder))
    counts = [len(c.text.split()) + 2 for c in chunks]
    assert max(counts) <= 60
    assert sum(counts[:-1]) / len(counts[:-1]) >= 0.6 * 60, counts
    # The same sizes in characters make chunks of another size entirely.
    chars = chunk_text(text, "text", size=60, overlap=6, max_chars=2000)
    assert len(chars) > 3 * len(chunks)


def test_a_denser_stretch_is_cut_again_within_the_budget() -> None:
    """The density is learned from the document's start; a later stretch of one-letter
    words (five times the tokens a character) is cut until each piece fits."""
    embedder = WordTokens()
    text = prose(20) + "\n\n" + " ".join("a" for _ in range(400)) + "."
    chunks = asyncio.run(sized_chunks(text, "text", TOKENS, embedder))
    assert max(len(c.text.split()) + 2 for c in chunks) <= 60
    assert "".join("".join(c.text.split()) for c in chunks).count("a") >= 400


def test_without_a_tokenizer_tokens_are_estimated_small() -> None:
    chunks = asyncio.run(sized_chunks(prose(60), "text", TOKENS, None))
    assert max(len(c.text) for c in chunks) <= 60 * ESTIMATE_CHARS


def test_characters_stay_the_default_and_a_bad_unit_is_refused() -> None:
    text = prose(30)
    assert asyncio.run(sized_chunks(text, "text", RetrievalLimits(), WordTokens())) == \
        chunk_text(text, "text")
    with pytest.raises(ValueError, match="chunk_unit"):
        asyncio.run(sized_chunks(text, "text", RetrievalLimits(chunk_unit="bytes"), None))


async def test_a_retriever_stores_token_sized_chunks(tmp_path: Path) -> None:
    embedder = WordTokens()
    r = Retriever(tmp_path / "idx", lambda: embedder, TOKENS)
    await r.open()
    try:
        await r.add_source("docs")
        await r.upsert("docs", "long", prose(60), doc_id="docs/long")
        store = r._indexes.store
        assert store is not None
        keys = store.document_chunk_keys("docs/long")
        texts = [c.text for c in store.chunks_by_keys(keys).values()]
        assert len(texts) > 5
        assert max(len(t.split()) + 2 for t in texts) <= 60
    finally:
        await r.close()
