"""The embedding child, as the retriever needs it: a protocol and how it is provided.

The retriever asks the provider on every use (so it follows the embedding role: a
restarted child is a new client, a disabled role is None); vectors of different models
never mix, so ``model_id`` names the vector space. A query must be embedded by the model
of the index it searches: during a rebuild for a new model that is the previous one, so
search asks a lookup (:data:`EmbedderLookup`) for an embedder of that model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from .store._group import Vector


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


EmbedderLookup = Callable[[str], "Embedder | None"]
"""Gives an embedder of the named model (its ``model_id``) when that model is available
now, else None. With one embedding model at a time it answers for the current one only
(:func:`current_only`); a pool of resident embedding models answers for any of them."""


def current_only(provider: EmbedderProvider) -> EmbedderLookup:
    """The lookup when only the provider's embedder exists: it answers for its model."""
    def lookup(model_id: str) -> Embedder | None:
        embedder = provider()
        return embedder if embedder is not None and embedder.model_id == model_id else None

    return lookup
