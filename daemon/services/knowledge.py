"""The knowledge base as the API adapters reach it, free of any wire: the retriever, its
search service (refresh on search, audit) and where directory sources may live.

Search is :class:`~daemon.services.search.SearchService`; documents, review and reprocess
are :mod:`daemon.services.documents`; sources and reindex :mod:`daemon.services.sources`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from retrieval import Retriever

from .search import SearchService


@dataclass(frozen=True)
class Knowledge:
    """One daemon's knowledge base.

    Attributes:
        allowed_roots: retrieval.allowed_roots as reloaded (read at every use).
    """

    retriever: Retriever
    search: SearchService
    allowed_roots: Callable[[], tuple[str, ...]]
