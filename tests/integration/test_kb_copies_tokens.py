"""Issue 30 against a real daemon with the real MiniLM embedding child: token-sized chunks
(``retrieval.chunk_unit = tokens``) counted by the child's own tokenizer, and the same
text under two document ids returned once, naming both, over gRPC (the client), plain
HTTP and the ``llamad search`` command line."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from clients import AsyncClient
from daemon import Daemon
from tests.integration.test_ask_plan import llamad
from tests.support.modes import MakeDaemon

pytestmark = pytest.mark.integration

WORDS = tuple(str.split(
    "the replication lag on db02 grows when the nightly backup saturates the disk; check "
    "the replay timestamp, pause the backup, and page the on-call engineer if it stays "
    "above five minutes after the certificate rotation"))


def prose(sentences: int) -> str:
    rng = random.Random(3)
    out = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + "."
           for _ in range(sentences)]
    return "\n\n".join(" ".join(out[i:i + 3]) for i in range(0, sentences, 3))


async def embedding_ready(daemon: Daemon) -> None:
    deadline = time.monotonic() + 60  # vectors need the embedding model's SHA-256
    while not daemon.children["embedding"].setup.model.sha256:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_token_chunks_and_one_hit_per_text(daemon_for: MakeDaemon) -> None:
    daemon, c = await daemon_for(LLAMAD_GENERATION_ENABLED="false",
                                 LLAMAD_HTTP_LISTEN="127.0.0.1:0",
                                 LLAMAD_RETRIEVAL_CHUNK_UNIT="tokens",
                                 LLAMAD_RETRIEVAL_CHUNK_SIZE="200",
                                 LLAMAD_RETRIEVAL_CHUNK_OVERLAP="20")
    await c.wait_serving("")
    await embedding_ready(daemon)
    assert daemon.retriever is not None
    async with AsyncClient(daemon.address, timeout=60) as client, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{daemon.http_port}",
                              timeout=60) as http:
        await client.add_source("notes")
        await client.add_source("wiki")
        # Token-sized chunks: each within 200 tokens of the embedding model (its own
        # tokenizer, through Tokenize), and near that size.
        await client.upsert_document("notes", prose(60), document_id="notes/long")
        store = daemon.retriever._indexes.store
        assert store is not None
        chunks = store.chunks_by_keys(store.document_chunk_keys("notes/long"))
        texts = [ch.text for _, ch in sorted((ch.ordinal, ch) for ch in chunks.values())]
        counts = [(await client.tokenize(t, role="embedding", add_special=True)).count
                  for t in texts]
        assert len(counts) >= 4, counts
        assert max(counts) <= 200, counts
        assert sum(counts[:-1]) / len(counts[:-1]) >= 120, counts
        chars = sum(len(t) for t in texts[:-1]) / len(texts[:-1])
        assert chars > 1.5 * 200, chars  # not 200 characters: tokens

        # The same text under two ids: one hit naming both, over gRPC and HTTP.
        text = "Quillon gateway failover: drain the quillon pool, then flip the VIP."
        await client.upsert_document("notes", text, document_id="notes/failover",
                                     title="Failover")
        await client.upsert_document("wiki", text, document_id="wiki/failover-copy",
                                     title="Copied", category="howto")
        result = await client.search("quillon gateway failover", top_k=5)
        assert result.mode == "hybrid", result.warnings
        holding = [h for h in result.hits if h.text == text]
        assert len(holding) == 1, [h.chunk_id for h in result.hits]
        assert holding[0].vector_rank is not None  # embedded (once: the cache)
        assert {holding[0].document_id, *holding[0].also_in} == \
            {"notes/failover", "wiki/failover-copy"}
        resp = await http.post("/v1/llamad/search",
                               json={"query": "quillon gateway failover", "top_k": 5})
        assert resp.status_code == 200, resp.text
        hits = [h for h in resp.json()["hits"] if h["text"] == text]
        assert len(hits) == 1
        assert {hits[0]["document_id"], *hits[0]["also_in"]} == \
            {"notes/failover", "wiki/failover-copy"}
        code, out, err = await llamad(daemon.address, "search", "quillon gateway failover")
        assert code == 0, err
        assert f"{holding[0].chunk_id}: also in {holding[0].also_in[0]}" in out.splitlines()
        # A filter admitting one holder returns it alone; a delete keeps the other.
        only = await client.search("quillon gateway failover", top_k=5, categories=["howto"])
        assert [(h.document_id, h.also_in) for h in only.hits] == [("wiki/failover-copy", ())]
        assert await client.delete_document("notes/failover")
        left = await client.search("quillon gateway failover", top_k=5)
        assert [(h.document_id, h.also_in) for h in left.hits if h.text == text] == \
            [("wiki/failover-copy", ())]
