"""Exclude patterns through the daemon (issue 30): set over gRPC and over HTTP, the
built-in credential defaults, the counts in Reindex and ListSources, refusals naming the
field, and a change of patterns applied at once with no Reindex (the watcher off). A real daemon on
port 0 (BM25 only: both children off), the real client, plain httpx."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from clients import AsyncClient, errors
from daemon import Daemon
from tests.support.access import quiet_env, start
from tests.support.eventually import eventually
from tests.support.exclusions import write_tree


async def found(client: AsyncClient, word: str) -> bool:
    return bool((await client.search(word, top_k=1)).hits)


async def until(client: AsyncClient, word: str, present: bool) -> None:
    async def check() -> bool:
        return await found(client, word) is present
    await eventually(check, what=f"{word} {'found' if present else 'gone'}")


async def test_patterns_over_grpc_and_http(started: list[Daemon], tmp_path: Path) -> None:
    root = tmp_path / "kb"
    write_tree(root)
    daemon = await start(started, quiet_env(
        LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path), LLAMAD_HTTP_LISTEN="127.0.0.1:0"))
    async with AsyncClient(daemon.address, timeout=30) as client, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{daemon.http_port}",
                              timeout=30) as http:
        added = await client.add_source("kb", root, exclude=["private/"])
        assert added.exclude == ("private/",)
        final = [p async for p in client.reindex("kb")][-1]
        # private/ and the three key and credential files of the defaults
        assert (final.added, final.excluded) == (2, 4)
        (listed,) = await client.list_sources()
        assert (listed.exclude, listed.excluded) == (("private/",), 4)
        assert await found(client, "amberquill") and await found(client, "foxglade")
        assert not await found(client, "basaltmoth")
        assert not await found(client, "emberlynx")

        # New patterns over HTTP: the daemon rescans for them, no Reindex asked.
        resp = await http.post("/v1/llamad/sources", json={
            "id": "kb", "path": str(root), "exclude": ["/drafts"]})
        assert resp.status_code == 200, resp.text
        assert resp.json()["exclude"] == ["/drafts"]
        await until(client, "basaltmoth", present=True)
        await until(client, "foxglade", present=False)
        assert not await found(client, "emberlynx")  # the defaults still hold

        # Refusals name the field and change nothing.
        with pytest.raises(errors.InvalidArgument, match=r"retrieval\.max_exclude_patterns"):
            await client.add_source("kb", root, exclude=[f"p{i}" for i in range(257)])
        resp = await http.post("/v1/llamad/sources", json={
            "id": "kb", "path": str(root), "exclude": ["two\nlines"]})
        assert resp.status_code == 400
        assert resp.json()["error"]["param"] == "exclude"
        resp = await http.post("/v1/llamad/sources", json={"id": "pushed",
                                                           "exclude": ["*.md"]})
        assert resp.status_code == 400 and "directory sources only" in resp.text
        (listed,) = await client.list_sources()
        assert listed.exclude == ("/drafts",)
