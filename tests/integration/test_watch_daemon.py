"""Live change detection in the daemon (issue 30): with ``retrieval.watch`` on (the
default), a file saved into a directory source is found by a hybrid Search, its vector
from the real embedding child, with no Reindex and no rescan schedule; a new
subdirectory's files too; a deleted file leaves the index. Off, nothing is found until a
Reindex. A real daemon on port 0, a real MiniLM child, the real client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from clients import AsyncClient
from daemon import Daemon
from tests.support.access import start
from tests.support.daemon import config_env
from tests.support.eventually import eventually

pytestmark = pytest.mark.integration


def env(root: Path, **overrides: str) -> dict[str, str]:
    return config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                      LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(root),
                      LLAMAD_RETRIEVAL_RESCAN_INTERVAL="0",
                      LLAMAD_RETRIEVAL_REFRESH_MIN_INTERVAL="0",
                      LLAMAD_RETRIEVAL_WATCH_RETRY="0.5", **overrides)


async def hits(client: AsyncClient, query: str) -> list[str]:
    return [h.document_id for h in (await client.search(query, top_k=3)).hits]


def found(client: AsyncClient, query: str, doc_id: str,
          present: bool = True) -> Callable[[], Awaitable[bool]]:
    """A check: is ``doc_id`` among the hits (or, ``present`` False, not)?"""
    async def check() -> bool:
        return (doc_id in await hits(client, query)) is present
    return check


async def test_saved_files_are_searchable_without_a_reindex(
        started: list[Daemon], tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "disk.md").write_text("# Disk full\n\nRotate the nginx logs.\n")
    daemon = await start(started, env(tmp_path, LLAMAD_RETRIEVAL_WATCH="true"))
    async with AsyncClient(daemon.address, timeout=60) as client:
        await client.add_source("docs", docs)
        _ = [p async for p in client.reindex("docs")]
        await asyncio.sleep(1.5)  # three looks at the source list: the source is watched

        (docs / "vpn.md").write_text("# VPN tunnel down\n\nRestart the strongswan service "
                                     "and check the IKE proposals.\n")
        await eventually(found(client, "strongswan IKE proposals", "docs/vpn.md"), 60)
        result = await client.search("strongswan IKE proposals", top_k=3)
        assert result.hits[0].document_id == "docs/vpn.md"
        assert result.hits[0].vector_rank == 1  # embedded by the real child

        (docs / "network" / "dns").mkdir(parents=True)
        await asyncio.sleep(1.0)  # the new directories are watched before this write
        (docs / "network" / "dns" / "resolver.md").write_text(
            "# Resolver timeouts\n\nRaise the unbound cache size.\n")
        await eventually(found(client, "unbound cache size", "docs/network/dns/resolver.md"),
                         60)

        (docs / "vpn.md").unlink()
        await eventually(found(client, "strongswan IKE proposals", "docs/vpn.md",
                               present=False), 60, "a deleted file gone")


async def test_off_nothing_is_found_until_a_reindex(
        started: list[Daemon], tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    daemon = await start(started, env(tmp_path, LLAMAD_RETRIEVAL_WATCH="false"))
    async with AsyncClient(daemon.address, timeout=60) as client:
        await client.add_source("docs", docs)
        (docs / "vpn.md").write_text("# VPN tunnel down\n\nRestart strongswan.\n")
        await asyncio.sleep(3.0)  # six watch retries and debounces: time enough if on
        assert await hits(client, "strongswan") == []
        final = [p async for p in client.reindex("docs")][-1]
        assert final.added == 1
        assert await hits(client, "strongswan") == ["docs/vpn.md"]
