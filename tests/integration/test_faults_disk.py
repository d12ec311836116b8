"""The fault matrix (docs/faults.md), the disk fills up: a daemon process indexing onto a
small filesystem that fills (ingests refused clearly, acknowledged documents kept, recovery
once room is made), and the stores themselves (SQLite, the text index, hnswlib) on a full
disk, run in a private mount namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from llamad_protocol.v1 import common_pb2, retrieval_pb2_grpc
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.conftest import ROOT
from tests.support.daemon import config_env
from tests.support.daemon_process import RUNNING, DaemonProcess

pytestmark = pytest.mark.integration


# -- the disk fills up while indexing -----------------------------------------------------


class SmallDisk:
    """A size-limited filesystem (tmpfs) at ``path``, in a mount namespace of its own that
    a holder process keeps alive: processes started with :meth:`run` see it, the rest of
    the machine does not (no root needed where unprivileged user namespaces are allowed).
    """

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        if not shutil.which("unshare") or not shutil.which("nsenter"):
            pytest.skip("needs util-linux unshare and nsenter for a size-limited tmpfs")
        # A user namespace lets anyone mount a tmpfs; root can do without one (where
        # user namespaces are disabled).
        ways = [["--user", "--map-root-user", "--mount"]]
        if os.geteuid() == 0:
            ways.append(["--mount"])
        errors = []
        for flags in ways:
            self.holder = subprocess.Popen(
                ["unshare", *flags, "sh", "-c",
                 f'mount -t tmpfs -o size={size} llamad-test "{path}" && echo ok && '
                 "exec sleep infinity"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert self.holder.stdout is not None
            if self.holder.stdout.readline().strip() == "ok":
                self._enter = ["-U", "--preserve-credentials"] if "--user" in flags else []
                return
            self.holder.kill()
            errors.append(f"unshare {' '.join(flags)}: {self.holder.communicate()[1].strip()}")
        pytest.skip(f"cannot mount a size-limited tmpfs here: {'; '.join(errors)}")

    def prefix(self) -> list[str]:
        """Prepended to a command, runs it in the namespace (same credentials, same pid:
        nsenter execs it)."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", *self._enter]

    def run(self, *argv: str) -> str:
        return subprocess.run([*self.prefix(), *argv], check=True, capture_output=True,
                              text=True, timeout=60).stdout

    def fill(self, leave: int = 0) -> None:
        """Fill the filesystem, then give ``leave`` bytes back."""
        self.run("sh", "-c", f'dd if=/dev/zero of="{self.path}/filler" bs=64k 2>/dev/null; '
                             f'truncate -s -{leave} "{self.path}/filler"')

    def free(self) -> None:
        self.run("rm", "-f", str(self.path / "filler"))

    def close(self) -> None:
        self.holder.kill()
        self.holder.communicate()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "state", "32m")
    yield disk
    disk.close()


def test_disk_full_while_indexing(tmp_path: Path, small_disk: SmallDisk,
                                  processes: Callable[..., DaemonProcess],
                                  llama_server: str) -> None:
    """The state directory's filesystem fills up: ingest fails with RESOURCE_EXHAUSTED
    saying so (never INTERNAL), earlier documents stay searchable, the daemon keeps
    running; once space is freed, ingest works again (the failed document too). A SIGTERM
    while the disk is full still exits 0, and the indexes open intact afterwards."""
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_STATE_DIR=str(small_disk.path))

    def upsert(stub: Any, name: str, words: int = 200) -> grpc.StatusCode:
        try:
            stub.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="notes", id=f"notes/{name}", title=name,
                text=f"{name} " + " ".join(f"{name}w{j}" for j in range(words))), timeout=60)
        except grpc.RpcError as exc:
            codes[name] = (exc.code(), exc.details() or "")
            return exc.code()
        return grpc.StatusCode.OK

    def found(stub: Any, name: str) -> bool:
        hits = stub.Search(rpb.SearchRequest(query=name, top_k=5), timeout=30).hits
        return any(h.document_id == f"notes/{name}" and h.text_rank == 1 for h in hits)

    codes: dict[str, tuple[grpc.StatusCode, str]] = {}
    d = processes(tmp_path, env, small_disk.prefix())
    d.wait_embeddable()
    with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        stub.AddSource(rpb.AddSourceRequest(id="notes"))
        before = [f"early{i}" for i in range(3)]
        assert all(upsert(stub, name) == grpc.StatusCode.OK for name in before)

        small_disk.fill(leave=32 * 1024)
        acked: list[str] = []
        failed: list[str] = []
        for i in range(40):
            name = f"full{i}"
            code = upsert(stub, name)
            (acked if code == grpc.StatusCode.OK else failed).append(name)
            if len(failed) >= 3:
                break
        assert failed, "the disk never filled up"
        for name in failed:
            code, details = codes[name]
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, codes
            assert "no space left" in details and "free space" in details, details
        assert d.proc.poll() is None
        assert d.status(common_pb2.CHILD_ROLE_EMBEDDING).state == RUNNING
        for name in before + acked:
            assert found(stub, name), name
        docs = {doc.id: doc for doc in stub.ListDocuments(rpb.ListDocumentsRequest()).documents}
        for name in before + acked:
            assert docs[f"notes/{name}"].state == rpb.DOCUMENT_STATE_INDEXED

        small_disk.free()
        assert upsert(stub, "after0") == grpc.StatusCode.OK
        assert found(stub, "after0")
        assert upsert(stub, failed[0]) == grpc.StatusCode.OK  # the retry works
        assert found(stub, failed[0])
        for name in before + acked:
            assert found(stub, name), name

        small_disk.fill(leave=0)  # full again, for the shutdown
        assert upsert(stub, "late") == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, _ = d.terminate(timeout=60)
    assert code == 0, d.tail()
    assert not [r for r in d.records() if r.get("level") == "error"], d.tail()

    small_disk.free()
    again = processes(tmp_path, env, small_disk.prefix())
    again.wait_embeddable()
    with again.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        for name in [*before, *acked, "after0", failed[0]]:
            assert found(stub, name), name
        status = stub.Status(rpb.RetrievalStatusRequest())
        assert status.embedded_chunks == status.chunks == status.vectors, status
    code, _ = again.terminate(timeout=60)
    assert code == 0


# Run inside SmallDisk's namespace by test_indexes_recover_from_a_full_disk: the stores
# themselves, on a full disk: full before a write (SQLite fails first, nothing is behind),
# and full between SQLite's commit and tantivy's (SQLite is ahead of the text index).
_FULL_DISK_SCRIPT = '''
import asyncio, os, shutil, sys
from pathlib import Path
import numpy as np
from retrieval import Retriever, StorageFull
from retrieval.store._vectors import VectorIndex

disk = Path(sys.argv[1])

def fill(leave):
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(65536))
        except OSError:
            pass
    os.truncate(disk / "filler", max(0, os.path.getsize(disk / "filler") - leave))

def words(name, n=300):
    return f"{name} " + " ".join(f"{name}w{j}" for j in range(n))

async def scenario(root, before, between=False):
    r = Retriever(root, lambda: None)
    await r.open()
    await r.add_source("notes")
    for i in range(before):
        await r.upsert("notes", f"pre{i}", words(f"pre{i}"), doc_id=f"notes/pre{i}")
    if between:
        # The disk fills up in the window between SQLite's commit and the text index's:
        # SQLite has the document, tantivy cannot write it (no margin to guess).
        indexes = r._indexes
        store_batch = indexes._store_batch
        def store_then_fill(*args):
            indexes._store_batch = store_batch
            out = store_batch(*args)
            fill(0)
            return out
        indexes._store_batch = store_then_fill
    else:
        fill(0)
    acked, failed, behind = [], [], False
    for i in range(30):
        try:
            await r.upsert("notes", f"f{i}", words(f"f{i}"), doc_id=f"notes/f{i}")
            acked.append(f"f{i}")
        except StorageFull as exc:
            assert "no space left" in str(exc), exc
            failed.append(f"f{i}")
            behind = behind or r._indexes.behind
            if len(failed) == 3:
                break
    assert failed, "never full"
    for name in ["pre0", *acked]:
        assert (await r.search(name, k=1)).hits[0].doc_id == f"notes/{name}", name
    os.unlink(disk / "filler")
    await r.upsert("notes", "after", words("after"), doc_id="notes/after")
    await r.upsert("notes", failed[0], words(failed[0]), doc_id=f"notes/{failed[0]}")
    for name in ["pre0", *acked, "after", failed[0]]:
        assert (await r.search(name, k=1)).hits[0].doc_id == f"notes/{name}", name
    await r.close()
    return behind

asyncio.run(scenario(disk / "fresh", 2))
shutil.rmtree(disk / "fresh", ignore_errors=True)
assert asyncio.run(scenario(disk / "between", 200, between=True)), \
    "tantivy did not fail after SQLite"
shutil.rmtree(disk / "between", ignore_errors=True)

# hnswlib writes a short file on a full disk without a word: save() must notice, keep the
# previous file, and leave no temporary behind.
v = VectorIndex(disk / "v.hnsw", 384)
v.add(list(range(1, 101)), np.random.default_rng(1).random((100, 384), dtype=np.float32))
v.save()
saved = (disk / "v.hnsw").read_bytes()
v.add(list(range(101, 2001)), np.random.default_rng(2).random((1900, 384), dtype=np.float32))
fill(100_000)
try:
    v.save()
    raise AssertionError("save() on a full disk did not fail")
except OSError:
    pass
assert (disk / "v.hnsw").read_bytes() == saved
assert not (disk / "v.hnsw.tmp").exists()
assert VectorIndex(disk / "v.hnsw", 384).count() == 100
os.unlink(disk / "filler")
v.save()
assert VectorIndex(disk / "v.hnsw", 384).count() == 2000
print("survived")
'''


def test_indexes_recover_from_a_full_disk(tmp_path: Path, small_disk: SmallDisk) -> None:
    """The stores on a real full filesystem: every failure is StorageFull (SQLite's,
    tantivy's, tantivy's killed writer), documents committed before stay searchable, the
    text index catches up on what SQLite took while it could not, writes work again once
    space is freed; hnswlib's silently short file never replaces a good index."""
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK_SCRIPT)
    out = subprocess.run(
        [*small_disk.prefix(), sys.executable, str(script), str(small_disk.path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0 and "survived" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
