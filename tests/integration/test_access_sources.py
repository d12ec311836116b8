"""Access, end to end, to the filesystem: directory sources may live only under the allowed
roots (from the environment or the config file, applied on reload), and a symlink swapped
during a read never hands a read token the contents of a file outside them. Real daemons on
port 0 with both children disabled, real clients and token files.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from clients import AsyncClient, errors
from daemon import Daemon
from tests.support.access import ADMIN_TOKEN, READ_TOKEN, quiet_env, start, token_files
from tests.support.races import OUTSIDE_DIR_WORD, swap_forever

pytestmark = pytest.mark.integration


# --- where directory sources may live --------------------------------------------------


async def test_directory_sources_only_under_allowed_roots(
    started: list[Daemon], tmp_path: Path
) -> None:
    """Without allowed roots, directory sources are refused (FAILED_PRECONDITION naming
    the option). With one: outside it, through '..', or through a symlink out of it is
    PERMISSION_DENIED; inside is accepted and indexed; a root swapped for a symlink to
    elsewhere after it was added is refused at the next scan."""
    docs, outside = tmp_path / "docs", tmp_path / "outside"
    (docs / "runbooks").mkdir(parents=True)
    outside.mkdir()
    (docs / "runbooks" / "disk.md").write_text("# Disk full\n\nRotate the nginx logs.\n")
    (outside / "secret.md").write_text("# Secret\n\nnot for the index\n")
    (docs / "escape").symlink_to(outside)

    closed = await start(started, quiet_env())
    async with AsyncClient(closed.address, timeout=10) as client:
        with pytest.raises(errors.FailedPrecondition, match=r"retrieval.allowed_roots"):
            await client.add_source("docs", docs)
    await closed.shutdown()

    daemon = await start(started, quiet_env(LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(docs)))
    async with AsyncClient(daemon.address, timeout=30) as client:
        for path in (outside, docs / ".." / "outside", docs / "escape",
                     docs / "runbooks" / ".." / ".." / "outside"):
            with pytest.raises(errors.PermissionDenied, match=r"outside retrieval.allowed_roots"):
                await client.add_source("bad", path)
        await client.add_source("docs", docs / "runbooks")
        final = [p async for p in client.reindex("docs")][-1]
        assert (final.added, final.seen) == (1, 1)
        assert [s.id for s in await client.list_sources()] == ["docs"]

        moved = tmp_path / "runbooks.real"
        (docs / "runbooks").rename(moved)
        (docs / "runbooks").symlink_to(outside)
        with pytest.raises(errors.PermissionDenied, match=r"outside retrieval.allowed_roots"):
            _ = [p async for p in client.reindex("docs")]
        hits = await client.search("secret")
        assert hits.hits == ()


async def test_allowed_roots_from_the_config_file_apply_on_reload(
    started: list[Daemon], tmp_path: Path
) -> None:
    """The refusal without roots says how to set them; doing what it says for a running
    daemon (allowed_roots in its config file, then a reload) opens directory sources
    under the new root, without a restart."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "disk.md").write_text("# Disk full\n\nRotate the nginx logs.\n")
    file = tmp_path / "llamad.toml"
    file.write_text("drain_grace = 5\n")
    daemon = await start(started, quiet_env(LLAMAD_CONFIG=str(file)), reload=True)
    async with AsyncClient(daemon.address, timeout=10) as client:
        with pytest.raises(errors.FailedPrecondition) as refused:
            await client.add_source("docs", docs)
        for words in ("--retrieval-allowed-roots", "LLAMAD_RETRIEVAL_ALLOWED_ROOTS",
                      "under [retrieval] in its config file", "systemctl reload llamad"):
            assert words in refused.value.details
        file.write_text(f'drain_grace = 5\n[retrieval]\nallowed_roots = ["{docs}"]\n')
        report = await daemon.reload()
        assert report.reloaded == ["retrieval.allowed_roots"] and not report.error
        await client.add_source("docs", docs)
        final = [p async for p in client.reindex("docs")][-1]
        assert (final.added, final.seen) == (1, 1)


async def test_symlink_race_never_hands_a_read_token_outside_files(
    started: list[Daemon], tmp_path: Path
) -> None:
    """An attacker with a read token and write access to one folder under the allowed
    roots swaps a file there between a regular file and a symlink to the daemon's own
    token file (and a directory between a directory and a symlink to an outside one)
    while an admin reindexes, round after round for a bounded time: a Search with the
    read token never returns a byte of the token file or of the outside directory."""
    tokens, read, admin = token_files(tmp_path)
    root, outside = tmp_path / "shared", tmp_path / "outside"
    src = root / "team"
    (src / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "note.md").write_text(f"# Outside\n\n{OUTSIDE_DIR_WORD} outside only\n")
    (src / "sub" / "note.md").write_text("# Inside\n\ninside note\n")
    (src / "stable.md").write_text("# Stable\n\nalways here\n")
    daemon = await start(started, quiet_env(LLAMAD_AUTH_TOKEN_FILE=str(tokens),
                                            LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(root)))
    stop = threading.Event()
    racer = threading.Thread(target=swap_forever, args=(src, tokens, outside, stop),
                             daemon=True)
    async with AsyncClient(daemon.address, token_file=admin, timeout=30) as operator, \
            AsyncClient(daemon.address, token_file=read, timeout=30) as reader:
        await operator.add_source("team", src)
        racer.start()
        rounds = 0
        try:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                _ = [p async for p in operator.reindex("team")]
                rounds += 1
                for query in (ADMIN_TOKEN, "admin", "fedcba9876543210", "read",
                              OUTSIDE_DIR_WORD):
                    hits = (await reader.search(query, top_k=20)).hits
                    leaked = [h.chunk_id for h in hits
                              if ADMIN_TOKEN in h.text or READ_TOKEN in h.text
                              or "role token" in h.text or OUTSIDE_DIR_WORD in h.text]
                    assert leaked == [], f"round {rounds}: {leaked}"
        finally:
            stop.set()
            racer.join(10)
        assert rounds >= 10
        assert [h.document_id for h in (await reader.search("always")).hits] == ["team/stable.md"]
