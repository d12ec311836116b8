"""The same text under several document ids (issue 30), on both store backends (the
embedded store in a temporary directory, a real PostgreSQL 18 + pgvector server): each id
keeps its own metadata, the text is embedded once, a search returns it once naming every
holder (``also_in``), a filter that admits one holder returns the hit, and deleting one
holder leaves the text searchable under the other."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from retrieval import Filters, Query, Retriever
from retrieval.postgres._connect import PgOptions
from tests.support.embedder import HashEmbedder

pytestmark = pytest.mark.integration

TEXT = ("Rotate the nginx logs on web01 when the disk fills up, then check df -h and "
        "restart the log shipper.")
OTHER = "The vpn tunnel flaps: tune dead peer detection on both gateways."


class CountingEmbedder(HashEmbedder):
    """Counts every text it embeds."""

    def __init__(self) -> None:
        super().__init__("m")
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return await super().embed(texts)


@pytest.fixture(params=("embedded", "postgres"))
async def retriever(request: pytest.FixtureRequest, tmp_path: Path
                    ) -> AsyncIterator[tuple[Retriever, CountingEmbedder]]:
    embedder = CountingEmbedder()
    options = PgOptions(request.getfixturevalue("pg_dsn")) \
        if request.param == "postgres" else None
    r = Retriever(tmp_path / "node", lambda: embedder, postgres=options)
    await r.open()
    try:
        assert r.store_kind == request.param
        await r.add_source("runbooks", category="ops")
        await r.add_source("wiki", category="notes")
        yield r, embedder
    finally:
        await r.close()


async def test_a_text_under_two_ids_is_embedded_once_and_found_once(
        retriever: tuple[Retriever, CountingEmbedder]) -> None:
    r, embedder = retriever
    await r.upsert("runbooks", "Disk full", TEXT, doc_id="runbooks/disk", tags=("web",))
    await r.upsert("runbooks", "Vpn", OTHER, doc_id="runbooks/vpn")
    embedded = len(embedder.texts)
    copy = await r.upsert("wiki", "Copied note", TEXT, doc_id="wiki/disk-copy",
                          category="howto", tags=("copied",))
    assert len(embedder.texts) == embedded  # the copy's text came from the cache
    # Each id keeps its own row and metadata.
    first, second = await r.document("runbooks/disk"), await r.document("wiki/disk-copy")
    assert first is not None and second is not None
    assert (first.title, first.category, first.tags) == ("Disk full", "ops", ("web",))
    assert (second.title, second.category, second.tags) == (copy.title, "howto", ("copied",))

    for mode in ("hybrid", "text", "vector"):
        hits = (await r.search("nginx logs disk df", k=5, options=Query(mode=mode))).hits
        holding = [h for h in hits if h.text == TEXT]
        assert len(holding) == 1, (mode, [h.chunk_id for h in hits])
        assert {holding[0].doc_id, *holding[0].also_in} == {"runbooks/disk", "wiki/disk-copy"}
        assert holding[0].doc_id not in holding[0].also_in
    # One hit per document too: the copies are one hit.
    grouped = await r.search("nginx logs disk df", k=5,
                             options=Query(group_by_document=True))
    assert [len([h for h in grouped.hits if h.text == TEXT])] == [1]
    # Filters stay per document: one admitting a single holder returns it alone.
    for filters, holder in ((Filters(categories=("howto",)), "wiki/disk-copy"),
                            (Filters(tags=("web",)), "runbooks/disk"),
                            (Filters(sources=("wiki",)), "wiki/disk-copy")):
        hits = (await r.search("nginx logs disk df", k=5, filters=filters)).hits
        assert [(h.doc_id, h.also_in) for h in hits] == [(holder, ())], filters
    # Deleting one holder keeps the text searchable under the other.
    assert await r.delete("runbooks/disk")
    hits = (await r.search("nginx logs disk df", k=5)).hits
    assert [(h.doc_id, h.also_in) for h in hits if h.text == TEXT] == [("wiki/disk-copy", ())]


async def test_k_distinct_texts_despite_copies(
        retriever: tuple[Retriever, CountingEmbedder]) -> None:
    """Copies do not eat into k: a search for 3 hits over five copies of one text and two
    other texts returns the three texts."""
    r, _ = retriever
    for i in range(5):
        await r.upsert("wiki", f"copy {i}", TEXT, doc_id=f"wiki/copy{i}")
    await r.upsert("wiki", "nginx", "nginx logs rotate weekly on the proxies",
                   doc_id="wiki/nginx")
    await r.upsert("wiki", "disk", "disk quotas on web01 home directories", doc_id="wiki/q")
    hits = (await r.search("nginx logs disk web01", k=3)).hits
    assert sorted(h.text for h in hits) == sorted(
        [TEXT, "nginx logs rotate weekly on the proxies", "disk quotas on web01 home directories"])
    (copies,) = [h for h in hits if h.text == TEXT]
    assert sorted([copies.doc_id, *copies.also_in]) == [f"wiki/copy{i}" for i in range(5)]
    # Holders ranked beyond the candidates are named too (the store's copies).
    (hit,) = (await r.search("nginx logs disk web01 df", k=1,
                             options=Query(mode="text", candidates=1))).hits
    assert hit.text == TEXT
    assert sorted([hit.doc_id, *hit.also_in]) == [f"wiki/copy{i}" for i in range(5)]
    # At most max_also_in copies are read a text.
    r.limits = dataclasses.replace(r.limits, max_also_in=2)
    (hit,) = (await r.search("nginx logs disk web01 df", k=1,
                             options=Query(mode="text", candidates=1))).hits
    # The first two by document id are read: those of them that are not the hit named.
    assert set(hit.also_in) == {"wiki/copy0", "wiki/copy1"} - {hit.doc_id}
