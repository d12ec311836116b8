"""Search stats on the wire (issue 30): the gRPC client and plain HTTP get what a search
did with every answer. A real daemon on port 0 (BM25 only: both children off)."""

from __future__ import annotations

import httpx

from clients import AsyncClient
from daemon import Daemon
from tests.support.access import quiet_env, start


async def test_grpc_and_http_answers_carry_the_stats(started: list[Daemon]) -> None:
    daemon = await start(started, quiet_env(LLAMAD_HTTP_LISTEN="127.0.0.1:0"))
    async with AsyncClient(daemon.address, timeout=30) as client, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{daemon.http_port}",
                              timeout=30) as http:
        await client.add_source("inbox")
        for i in range(3):
            await client.upsert_document("inbox", f"disk full on web0{i}",
                                         document_id=f"inbox/n{i}")
        st = (await client.search("disk full", top_k=1, candidates=2)).stats
        assert (st.text_chunks, st.text_depth, st.text_candidates, st.fused) == (3, 2, 2, 2)
        assert st.vector_depth == 0  # no embedding child: BM25-only
        assert {"filters", "text", "fuse", "fetch", "total"} <= set(st.stages_ms)
        resp = await http.post("/v1/llamad/search", json={"query": "web01", "top_k": 1})
        assert resp.status_code == 200, resp.text
        stats = resp.json()["stats"]
        assert (int(stats["text_chunks"]), stats["text_candidates"]) == (3, 1)
        assert stats["stages_ms"]["total"] > 0
