"""The Python client against a real daemon: real llama-server children on real GGUF models,
the daemon in-process on port 0 (and on a unix socket).

The blocking :class:`Client` runs in a worker thread (``asyncio.to_thread``) so the daemon
keeps serving on this test's event loop.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

from clients import AskSources, AsyncClient, Client, TextStream, errors
from daemon import Daemon
from tests.conftest import SMALL_MODEL, model_path
from tests.support.child_http import generation_idle
from tests.support.daemon import config_env, make_daemon
from tests.support.endless import end_tokens

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

LONG = "Count from 1 to 1000: 1, 2, 3, 4, 5,"


def endless() -> dict[int | str, float]:
    """Biases that keep SmolLM2 generating until max_tokens (no end token can be drawn)."""
    return {token: -100.0 for token in end_tokens(model_path(SMALL_MODEL))}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[tuple[Daemon, str]]:
    """One daemon (generation and embedding children) for the whole module."""
    state = tmp_path_factory.mktemp("state")
    daemon = make_daemon(config_env("llama-server", LLAMAD_STATE_DIR=str(state),
                                    LLAMAD_CHILD_SLOTS="true"))
    address = await daemon.start()
    try:
        async with AsyncClient(address) as client:
            await client.wait_serving("", timeout=120)
        yield daemon, address
    finally:
        await daemon.shutdown()


async def test_generate_streams_then_usage(running: tuple[Daemon, str]) -> None:
    """Generate yields chunks as produced; the last carries finish reason and usage."""
    _, address = running

    def call() -> list[object]:
        with Client(address) as client:
            return list(client.generate("The three primary colors are", max_tokens=16))

    chunks = await asyncio.to_thread(call)
    # Streamed: pieces before the last (a busy relay may carry several tokens in one).
    assert len(chunks) >= 2
    last = chunks[-1]
    assert getattr(last, "finish_reason", None) in ("stop", "length")
    usage = getattr(last, "usage", None)
    assert usage is not None
    assert 3 <= usage.completion_tokens <= 16
    assert sum(getattr(c, "tokens", 0) for c in chunks) == usage.completion_tokens
    assert all(getattr(c, "usage", None) is None for c in chunks[:-1])
    assert getattr(last, "model", "") == SMALL_MODEL
    async with AsyncClient(address) as client:
        result = await client.chat([("user", "Name a color.")], max_tokens=8).collect()
    assert result.text
    assert result.usage.completion_tokens >= 1


async def test_break_cancels_generation_in_the_child(running: tuple[Daemon, str]) -> None:
    """Breaking out of a generate loop (sync and async) stops the child's generation;
    while an unfinished stream is held open, the child is still generating (the control
    that shows /slots can tell)."""
    _, address = running
    async with AsyncClient(address) as client:
        gen = (await client.status()).child("generation")
        assert gen is not None
        child = (gen.socket, gen.pid)
        with Client(address) as sync:
            def start() -> TextStream:
                stream = sync.generate(LONG, max_tokens=3000, temperature=0.0,
                                       logit_bias=endless())
                for _ in range(5):
                    next(stream)
                return stream

            held = await asyncio.to_thread(start)
            assert not await generation_idle(*child, timeout=0.3), "control: not generating"
            held.close()
            assert await generation_idle(*child), "the child kept generating after close()"

            def sync_break() -> int:
                for n, _ in enumerate(sync.generate(LONG, max_tokens=3000,
                                                    temperature=0.0, logit_bias=endless()), 1):
                    if n == 5:
                        break
                return n

            assert await asyncio.to_thread(sync_break) == 5
            assert await generation_idle(*child), "the child kept generating after break"
        n = 0
        async for _ in client.generate(LONG, max_tokens=3000, temperature=0.0,
                                         logit_bias=endless()):
            n += 1
            if n == 5:
                break
        assert await generation_idle(*child), "the child kept generating after break (async)"
        began = time.monotonic()
        assert (await client.generate("Hi", max_tokens=3, timeout=20).collect()).text
        assert time.monotonic() - began < 10


async def test_embed_tokenize_status_and_health(running: tuple[Daemon, str]) -> None:
    """Embed returns real 384-d vectors; tokenize, status and health report the children."""
    _, address = running
    async with AsyncClient(address) as client:
        emb = await client.embed(["a cat sat on the mat", "a kitten rested on the rug",
                                  "quarterly tax filing deadline"])
        vectors = np.array(emb.vectors)
        assert emb.dimension == 384
        assert vectors.shape == (3, 384)
        sims = vectors @ vectors.T
        assert sims[0, 1] > sims[0, 2] + 0.2
        assert (await client.tokenize("hello world")).count >= 2
        ids = (await client.tokenize("Héllo wörld 🎉, 42 ≠ 43")).ids
        assert await client.detokenize(ids) == "Héllo wörld 🎉, 42 ≠ 43"
        with pytest.raises(errors.InvalidArgument, match="4000000000 is not a token id"):
            await client.detokenize([1, 4_000_000_000])
        status = await client.status()
        gen, embedding = status.child("generation"), status.child("embedding")
        assert gen is not None and embedding is not None
        assert (gen.state, embedding.state) == ("running", "running")
        assert gen.model_path.endswith(SMALL_MODEL)
        assert gen.breaker == "closed"
        assert gen.slots == 2
        assert (embedding.slots, embedding.queue_ahead) == (2, 2)  # the child's slots
        assert gen.queue_ahead == 0
        assert await client.health("generation") == "serving"
        assert await client.health("no-such-service") == "service_unknown"
        with pytest.raises(errors.InvalidArgument, match="prompt is empty"):
            await client.generate("").collect()


async def test_concurrent_embeds_beyond_the_slots(running: tuple[Daemon, str]) -> None:
    """The llama-server embedding child is sent embedding.queue_ahead (2) calls beyond its
    2 slots: they wait in its own queue and come back right. Eight concurrent calls, each
    against the same text embedded alone."""
    daemon, address = running
    adm = daemon.children["embedding"].admission
    assert (adm.limit, adm.ahead) == (2, 2)
    assert daemon.children["generation"].admission.ahead == 0
    texts = [f"note {i}: the {w} service restarted after a disk filled up"
             for i, w in enumerate(["backup", "mail", "dns", "web", "ldap", "ntp", "vpn",
                                    "proxy"])]
    async with AsyncClient(address) as client:
        alone = [np.array((await client.embed([t])).vectors[0]) for t in texts]
        peak = 0

        async def watch() -> None:  # the daemon runs in this event loop
            nonlocal peak
            while True:
                peak = max(peak, adm.in_flight)
                await asyncio.sleep(0.0005)

        watcher = asyncio.create_task(watch())
        try:
            together = await asyncio.gather(*(client.embed([t]) for t in texts))
        finally:
            watcher.cancel()
    assert peak == 4  # two running, two waiting inside the child; the rest in llamad
    for one, many in zip(alone, together, strict=True):
        assert float(one @ np.array(many.vectors[0])) > 0.9999


async def test_search_after_upsert(running: tuple[Daemon, str]) -> None:
    """A pushed document is searchable at once, readable, listable and deletable."""
    _, address = running

    def scenario() -> None:
        with Client(address) as client:
            client.add_source("notes")
            doc = client.upsert_document(
                "notes", "When web01 says No space left on device, rotate the nginx logs "
                "with logrotate -f and check df -h /var.", document_id="notes/web01-disk",
                title="web01 disk full", kind="text", tags=["ops"])
            assert doc.state == "indexed"
            result = client.search("web01 no space left on device", top_k=3)
            assert result.hits[0].document_id == "notes/web01-disk"
            assert result.hits[0].chunk_id.startswith("notes/web01-disk#")
            assert result.mode in ("hybrid", "text")
            assert client.get_document("notes/web01-disk").title == "web01 disk full"
            assert [d.id for d in client.list_documents("notes")] == ["notes/web01-disk"]
            assert "notes" in {s.id for s in client.list_sources()}
            assert client.retrieval_status().chunks >= 1
            assert client.delete_document("notes/web01-disk") is True
            with pytest.raises(errors.NotFound):
                client.get_document("notes/web01-disk")
            with pytest.raises(errors.InvalidArgument):
                client.search("")

    await asyncio.to_thread(scenario)


async def test_ask_streams_text_then_sources_then_done(running: tuple[Daemon, str]) -> None:
    """Ask (AnswerService, coded against answer.proto): text events, then one sources
    event citing S1.., then one done event."""
    _, address = running
    async with AsyncClient(address) as client:
        await client.add_source("kb")
        await client.upsert_document(
            "kb", "To restart the billing worker run systemctl restart billing-worker.",
            document_id="kb/billing", title="billing worker")
        events = [e async for e in client.ask("How do I restart the billing worker?",
                                              max_tokens=16, temperature=0.0)]
    kinds = [type(e).__name__ for e in events]
    assert kinds[-2:] == ["AskSources", "AskDone"]
    assert set(kinds[:-2]) <= {"AskText"}
    sources = events[-2]
    assert isinstance(sources, AskSources)
    assert sources.citations
    assert sources.citations[0].label == "S1"
    assert sources.citations[0].document_id == "kb/billing"


async def test_unix_socket_address(llama_server: str) -> None:
    """A daemon listening on unix:/path serves the client given that address."""
    directory = tempfile.mkdtemp(prefix="llamad-", dir="/tmp")  # short: sun_path limit
    address = f"unix:{directory}/llamad.sock"
    daemon = make_daemon(config_env(
        "llama-server", LLAMAD_LISTEN=address, LLAMAD_EMBEDDING_ENABLED="false",
        LLAMAD_RETRIEVAL_ENABLED="false", LLAMAD_STATE_DIR=f"{directory}/state"))
    try:
        assert await daemon.start() == address
        async with AsyncClient(address) as client:
            await client.wait_serving("generation", timeout=120)

        def call() -> tuple[str, str]:
            with Client(address) as sync:
                gen = sync.status().child("generation")
                text = sync.generate("Hello", max_tokens=4).collect().text
                return (gen.state if gen else "", text)

        state, text = await asyncio.to_thread(call)
        assert state == "running"
        assert text
    finally:
        await daemon.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


async def test_swap_streams_progress(running: tuple[Daemon, str]) -> None:
    """Swap streams its stages to done; a bad model fails with FAILED then Aborted.
    (Last in the module: it replaces the generation child.)"""
    _, address = running

    def scenario() -> tuple[list[str], list[str]]:
        with Client(address) as client:
            good = [p.stage for p in client.swap(
                "generation", model_path(SMALL_MODEL), ctx_size=1024, reason="test")]
            bad: list[str] = []
            with pytest.raises(errors.Aborted):
                for p in client.swap("generation", "/nonexistent.gguf"):
                    bad.append(p.stage)
            after = client.status().child("generation")
            assert after is not None
            assert after.state == "running"
            assert after.last_swap is not None
            assert after.last_swap.reason == "test"
            return good, bad

    good, bad = await asyncio.to_thread(scenario)
    assert good[0] == "validating"
    assert "probing" in good
    assert good[-1] == "done"
    assert bad[-1] == "failed"

