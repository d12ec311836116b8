"""Durable asynchronous pushes (issue 30), decided by a kill -9: documents pushed with
wait=false and acknowledged are all indexed after the daemon is killed and started again
on the same state. The real ``python -m daemon serve`` with the real MiniLM embedding
child; that child is stopped (SIGSTOP) before the pushes, so the acknowledged documents
are still waiting for their vectors when the daemon dies (the journal holds them), and
every one must be indexed after the restart: the test does not depend on how fast
anything indexes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from clients import AsyncClient
from tests.support.daemon import config_env
from tests.support.eventually import eventually
from tests.support.serve_process import ServeProcess, child_pids

pytestmark = pytest.mark.integration

DOCUMENTS = 40


def start(started: list[ServeProcess], env: dict[str, str]) -> str:
    d = ServeProcess(env)
    started.append(d)
    address = str(d.wait_event("listening")["address"])
    d.wait_running(1)
    return address


async def test_acknowledged_pushes_survive_kill_9(
        spawned: list[ServeProcess], tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_STATE_DIR=str(state))
    # The stopped child stays the embedder (no liveness or token probe replaces it while
    # the pushes are acknowledged): whatever the machine's speed, none can be indexed.
    address = start(spawned, {**env, "LLAMAD_CHILD_PROBE_INTERVAL": "600",
                              "LLAMAD_CHILD_TOKEN_PROBE_INTERVAL": "600",
                              "LLAMAD_CHILD_FAILED_CALLS": "0"})
    (embedder,) = child_pids(address)
    async with AsyncClient(address, timeout=30) as client:
        await client.add_source("inbox")
        os.kill(embedder, signal.SIGSTOP)  # every document now waits for its vectors
        try:
            for i in range(DOCUMENTS):
                doc = await client.upsert_document(
                    "inbox", f"# Note {i}\n\nThe keyword of this note is quillon{i}.\n",
                    document_id=f"inbox/n{i}", wait=False)
                assert doc.state == "pending"
            # Acknowledged and not yet indexed (if the stopped child is judged hung and
            # replaced meanwhile, the first ones may be): the journal holds them.
            pending = sorted((state / "retrieval" / "pending").glob("*.json"))
            assert pending
            spawned[0].proc.kill()  # SIGKILL: no drain, no close
            spawned[0].proc.wait()
        finally:
            os.kill(embedder, signal.SIGKILL)

    address = start(spawned, {**env, "LLAMAD_RETRIEVAL_BACKFILL_INTERVAL": "1"})
    async with AsyncClient(address, timeout=30) as client:
        async def all_indexed() -> bool:
            docs = await client.list_documents("inbox")
            return len(docs) == DOCUMENTS and all(d.state == "indexed" for d in docs)
        await eventually(all_indexed, timeout=120, what="every acknowledged push indexed")
        hit = (await client.search(f"quillon{DOCUMENTS - 1}", top_k=1)).hits[0]
        assert hit.document_id == f"inbox/n{DOCUMENTS - 1}"

        async def embedded() -> bool:  # replayed at open, perhaps before the new child
            hits = (await client.search(f"quillon{DOCUMENTS - 1}", top_k=1)).hits
            return hits[0].vector_rank is not None  # served: the backfill embeds them
        await eventually(embedded, timeout=120, what="the replayed documents embedded")
    assert list((state / "retrieval" / "pending").glob("*.json")) == []
