"""One hit per text: the same text held by several documents is returned once.

Two documents may hold the same text (a file copied under two names, one note pushed under
two ids): each keeps its own rows, metadata, review state and filters, and the embedding
cache (keyed by content hash) embeds the text once. A search then finds the copies as
chunks of equal ``content_hash``; it keeps the best-ranked one and lists the other
documents that hold the text in its ``also_in``, in rank order. Each copy is ranked under
the search's own filters, so a filter that admits one holder returns the hit, and
``also_in`` names only holders the filters admit; deleting one holder leaves the others.

Copies are merged among the fused candidates (equal texts have the same vector and nearly
the same BM25 score: the title differs); then the store names every other holder of each
hit's text (:meth:`~retrieval._interface.DocumentStore.copies_of`, at most
``retrieval.max_also_in`` copies read a text), those the search's filters admit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._interface import DocumentStore
from ..store._bm25 import Filters
from ..store._entries import admits
from ..store._rows import StoredChunk
from ._reads import Reads

__all__ = ["admits", "every_holder", "fetch_distinct", "first_copies"]


async def fetch_distinct(reads: Reads, store: DocumentStore, keys: Sequence[int], k: int
                         ) -> dict[int, StoredChunk]:
    """The chunks of ``keys`` (best first) until they hold ``k`` distinct texts: ``2 k``
    at first (the copies of the last hits, ranked just below them, come with it), then
    ``k`` more at a time while copies leave fewer than ``k``."""
    chunks: dict[int, StoredChunk] = {}
    start, window = 0, 2 * k
    while start < len(keys):
        part = keys[start:start + window]
        chunks.update(await reads.run(store.chunks_by_keys, part))
        start += len(part)
        if len({c.content_hash for c in chunks.values()}) >= k:
            break
        window = k
    return chunks


def first_copies(keys: Sequence[int], chunks: Mapping[int, StoredChunk]
                 ) -> dict[int, tuple[str, ...]]:
    """Each text's best-ranked chunk among ``keys`` (best first; keys without a chunk are
    left out) -> the other documents holding that text, in rank order."""
    first: dict[str, int] = {}
    holders: dict[int, list[str]] = {}
    for key in keys:
        c = chunks.get(key)
        if c is None:
            continue
        kept = first.setdefault(c.content_hash, key)
        if kept == key:
            holders[key] = []
        elif c.doc_id != chunks[kept].doc_id and c.doc_id not in holders[kept]:
            holders[kept].append(c.doc_id)
    return {key: tuple(docs) for key, docs in holders.items()}


async def every_holder(reads: Reads, store: DocumentStore,
                       holders: dict[int, tuple[str, ...]],
                       chunks: Mapping[int, StoredChunk], filters: Filters, *,
                       limit: int) -> dict[int, tuple[str, ...]]:
    """``holders`` (from :func:`first_copies`: the hits' keys, best first) with the other
    documents the store holds each text under and ``filters`` admit (after those found
    among the candidates, by document id; at most ``limit`` copies read a text)."""
    if limit < 1 or not holders:
        return holders
    by_hash = {chunks[key].content_hash: key for key in holders}
    copies = await reads.run(store.copies_of, list(by_hash), limit)
    out = dict(holders)
    for digest, found in copies.items():
        key = by_hash[digest]
        named = {chunks[key].doc_id, *out[key]}
        more = [c.doc_id for c in found if c.doc_id not in named and admits(filters, c)]
        out[key] = out[key] + tuple(dict.fromkeys(more))
    return out
