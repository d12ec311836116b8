"""The embedding child, as the retriever needs it: a protocol and how it is provided.

The retriever asks the provider on every use (so it follows the embedding role: a
restarted child is a new client, a disabled role is None); vectors of different models
never mix, so ``model_id`` names the vector space.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ._group import Vector


class Embedder(Protocol):
    """The embedding child, as the retriever needs it."""

    @property
    def model_id(self) -> str:
        """Identifies the vector space (vectors of different models never mix)."""
        ...

    async def embed(self, texts: Sequence[str]) -> Sequence[Vector]:
        """One L2-normalised vector per text. Raises on any failure."""
        ...

    async def count_tokens(self, text: str) -> int:
        """Tokens the embedding model sees for ``text``."""
        ...

    @property
    def context(self) -> int:
        """Most tokens one input may have."""
        ...


EmbedderProvider = Callable[[], "Embedder | None"]
"""Gives the embedder to use now, or None when there is none (search is then BM25-only)."""
