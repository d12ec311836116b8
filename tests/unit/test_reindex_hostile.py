"""Reindex against a hostile directory (issue 25), through a real in-process gRPC server
and a client with gRPC's default limits: a source root renamed and replaced by a symlink,
removed, or made a symlink loop while (or before) a Reindex runs gets FAILED_PRECONDITION
naming the source and its root, reads nothing from outside and deletes nothing; and a
Reindex of 30,000 files streams messages far below 4 MiB with exact counts."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from daemon.grpcapi.retrieval import RetrievalServicer
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import RetrievalLimits, Retriever
from tests.support.inprocess import serving
from tests.support.load import patience
from tests.support.races import OUTSIDE_DIR_WORD

# Each document of the source carries a word found nowhere else: its search key.
WORDS = {f"sub{i}/note{j}.md": f"keyword{i}x{j}tern" for i in range(3) for j in range(4)}
MESSAGE_BOUND = 64 * 1024  # bytes: far below gRPC's default 4 MiB receive limit


@dataclass
class Served:
    stub: retrieval_pb2_grpc.RetrievalServiceStub
    r: Retriever
    allowed: Path     # the allowed root
    kb: Path          # the source's root, inside it
    outside: Path     # a directory outside the allowed root, with its own word


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    kb = allowed / "kb"
    for rel, word in WORDS.items():
        (kb / rel).parent.mkdir(parents=True, exist_ok=True)
        (kb / rel).write_text(f"Note {rel}. Keyword {word}.\n")
    for i in range(3):
        (outside / f"sub{i}").mkdir(parents=True)
        (outside / f"sub{i}" / "leak.md").write_text(f"Keyword {OUTSIDE_DIR_WORD}.\n")
    r = Retriever(tmp_path / "index", lambda: None, RetrievalLimits(ingest_workers=1))
    await r.open()
    servicer = RetrievalServicer(r, allowed_roots=lambda: (str(allowed),))
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        await stub.AddSource(rpb.AddSourceRequest(id="kb", path=str(kb)))
        yield Served(stub, r, allowed, kb, outside)
    await r.close()


async def reindex(stub: retrieval_pb2_grpc.RetrievalServiceStub,
                  source_id: str = "kb") -> list[rpb.ReindexProgress]:
    return [m async for m in stub.Reindex(rpb.ReindexRequest(source_id=source_id))]


def on_first_ingest(r: Retriever, act: Callable[[], None]) -> None:
    """Run ``act`` (the swap) once, as the scan starts reading its first file."""
    ingest_file = r.ingest_file
    done = False

    async def hooked(*args: object) -> object:
        nonlocal done
        if not done:
            done = True
            act()
        return await ingest_file(*args)  # type: ignore[arg-type]

    r.ingest_file = hooked  # type: ignore[assignment,method-assign]


def renamed_and_linked_outside(s: Served) -> Callable[[], None]:
    def act() -> None:
        os.rename(s.kb, s.allowed / "kb.old")
        s.kb.symlink_to(s.outside)
    return act


def removed(s: Served) -> Callable[[], None]:
    return lambda: shutil.rmtree(s.kb)


@pytest.mark.parametrize("swap", [renamed_and_linked_outside, removed])
async def test_a_root_swapped_during_a_reindex_fails_cleanly_and_deletes_nothing(
        served: Served, swap: Callable[[Served], Callable[[], None]]) -> None:
    """Indexed, then changed on disk so the next Reindex reads files; as it reads the
    first one the root is renamed and replaced by a symlink to a directory outside the
    allowed root (or removed): FAILED_PRECONDITION naming the source and its root and
    saying it changed; nothing from outside is indexed, no document is deleted, the
    source's status says what happened, and a Reindex once the root is back works."""
    s = served
    assert (await reindex(s.stub))[-1].added == len(WORDS)
    for rel in WORDS:
        with (s.kb / rel).open("a") as f:
            f.write("Edited.\n")
    on_first_ingest(s.r, swap(s))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await reindex(s.stub)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = info.value.details() or ""
    assert f"source 'kb': its root {s.kb} changed during the scan" in message
    assert "no document was deleted" in message
    assert len(await s.r.documents("kb")) == len(WORDS)
    assert (await s.r.search(OUTSIDE_DIR_WORD)).hits == []
    [source] = (await s.stub.ListSources(rpb.ListSourcesRequest())).sources
    assert "changed during the scan" in source.last_error
    # Put back (the old directory, or a fresh copy), the next Reindex goes through.
    if s.kb.is_symlink():
        s.kb.unlink()
        os.rename(s.allowed / "kb.old", s.kb)
        last = (await reindex(s.stub))[-1]
        assert (last.changed, last.deleted, last.failed_total) == (len(WORDS), 0, 0)
    else:
        s.kb.mkdir()
        (s.kb / "back.md").write_text("Keyword returnedheron.\n")
        last = (await reindex(s.stub))[-1]
        assert (last.added, last.deleted) == (1, len(WORDS))
    [source] = (await s.stub.ListSources(rpb.ListSourcesRequest())).sources
    assert source.last_error == ""


async def reindex_once_root_is(s: Served, target: Path) -> grpc.aio.AioRpcError:
    """Index the source, replace its root by a symlink to ``target``, and return the
    error of the Reindex that follows (one must come)."""
    await reindex(s.stub)
    os.rename(s.kb, s.allowed / "kb.old")
    s.kb.symlink_to(target)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await reindex(s.stub)
    return info.value


async def test_a_root_made_a_symlink_loop_is_failed_precondition(served: Served) -> None:
    """A root replaced by a symlink to itself before the Reindex: FAILED_PRECONDITION
    saying it cannot be resolved, not INTERNAL; the documents stay."""
    s = served
    error = await reindex_once_root_is(s, s.kb)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot be resolved" in (error.details() or "")
    assert len(await s.r.documents("kb")) == len(WORDS)


async def test_a_root_replaced_by_a_symlink_outside_is_refused(served: Served) -> None:
    """A root replaced by a symlink out of the allowed roots between two Reindexes is
    refused as outside them (PERMISSION_DENIED, as before); nothing outside is read."""
    s = served
    error = await reindex_once_root_is(s, s.outside)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (await s.r.search(OUTSIDE_DIR_WORD)).hits == []
    assert len(await s.r.documents("kb")) == len(WORDS)


def make_files(bulk: Path) -> None:
    """30,000 files with long names in 3 folders: 10 with text, 40 binary, the rest
    empty."""
    pad = "n" * 120
    for d in range(3):
        folder = bulk / f"part{d}"
        folder.mkdir(parents=True)
        for i in range(10_000):
            name = folder / f"{pad}-{i:05}.md"
            if d == 0 and i < 10:
                name.write_text(f"Keyword bulkword{i}.\n")
            elif d == 1 and i < 40:
                name.write_bytes(b"\x00\x01\x02\x03" * 64)
            else:
                os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))


# Making and scanning 30,000 files takes ~6 s on a quiet machine, 16 s on a loaded one.
@pytest.mark.timeout(patience(60))
async def test_a_reindex_of_30k_files_streams_small_messages_with_exact_counts(
        served: Served) -> None:
    """30,000 files (long names: 29,950 empty, 40 binary, 10 with text) in a source: every
    streamed message, read by a client with gRPC's default 4 MiB limit, is under 64 KiB;
    the last counts every file (skipped_total, failed_total) while listing the first few
    (at most 100 of each kind, 32 KiB in all). Listing them all made the last message
    ~5 MB here, which that client refused (RESOURCE_EXHAUSTED); 100k files, 5.6 MB and
    more, now make messages of the same size as these."""
    s = served
    bulk = s.allowed / "bulk"
    await asyncio.to_thread(make_files, bulk)  # seconds of work: off the event loop
    await s.stub.AddSource(rpb.AddSourceRequest(id="bulk", path=str(bulk)))
    messages = await reindex(s.stub, "bulk")
    sizes = [m.ByteSize() for m in messages]
    assert max(sizes) < MESSAGE_BOUND, sizes
    last = messages[-1]
    assert last.done
    assert (last.seen, last.added, last.failed_total, last.skipped_total) == (
        50, 10, 40, 29_950)
    assert 0 < len(last.failed) <= 40 and len(last.skipped) == 100  # within 32 KiB
    assert all(issue.reason == "empty file: nothing to index" for issue in last.skipped)
    assert last.limit_reached == ""
