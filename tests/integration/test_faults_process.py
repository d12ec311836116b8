"""The fault matrix (docs/faults.md), seen from ``python -m daemon serve`` processes that get
real signals: a child that ignores SIGTERM or floods stdout, SIGTERM during a swap or an
ingest, and SIGKILL while a child starts (no orphan, nothing acknowledged lost).

Real daemon processes, real gRPC clients, real llama-server children on real GGUF models;
the fake child stands in only for faults a real child cannot be made to show on demand
(ignoring SIGTERM, flooding stdout).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from llamad_protocol.v1 import control_pb2, control_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from supervisor.testing import fake_child_command
from tests.conftest import DEFAULT_MODEL, model_path
from tests.support.daemon import GEN, config_env
from tests.support.daemon_process import DaemonProcess
from tests.support.load import patience
from tests.support.procs import alive, descendants, gone

pytestmark = pytest.mark.integration


def fake_llama_bin(tmp: Path, fault: str) -> str:
    """A "llama-server" that is the fake child with ``fault``: for daemon processes, which
    take their runtime from ``--llama-bin`` (the fake accepts llama-server's flags)."""
    argv = fake_child_command(port=1, model="-", fault=fault)
    python, script = argv[0], argv[1]
    path = tmp / f"llama-server-{fault}"
    path.write_text(f'#!/bin/sh\nexec "{python}" "{script}" --fault {fault} "$@"\n')
    path.chmod(0o755)
    return str(path)


# -- a child ignores SIGTERM --------------------------------------------------------------


def test_child_ignoring_sigterm_does_not_hold_up_daemon_shutdown(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """SIGTERM to the daemon whose child ignores SIGTERM: the child gets SIGKILL after
    child.stop_grace, and the daemon exits 0 within drain_grace + stop_grace."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_LLAMA_BIN=fake_llama_bin(tmp_path, "ignore-sigterm"),
                     LLAMAD_CHILD_STOP_GRACE="2", LLAMAD_DRAIN_GRACE="1",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    pid = d.wait_running().pid
    code, took = d.terminate(timeout=30)
    assert code == 0
    assert 2.0 <= took < 12, took  # the 2 s grace was waited for, and not much more
    assert gone([pid], 5) == []
    assert not descendants(d.pid)
    stopped = [r for r in d.records() if r.get("event") == "child state"
               and r.get("new") == "stopped" and r.get("role") == "generation"]
    assert stopped
    assert d.records()[-1]["event"] == "stopped"


# -- a child floods stdout ----------------------------------------------------------------


def test_flooding_child_is_drained_and_rate_limited(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """A child writing to stdout as fast as it can: the daemon stays responsive and keeps
    serving, TailLogs holds only the last child.log_lines lines, and the daemon's own log
    gets at most ~100 child lines a second plus "child output suppressed" summaries."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_LLAMA_BIN=fake_llama_bin(tmp_path, "flood-stdout"),
                     LLAMAD_CHILD_LOG_LINES="100", LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    d.wait_running()
    d.wait_event("child output suppressed", timeout=30)
    with grpc.insecure_channel(d.address) as ch:
        from llamad_protocol.v1 import inference_pb2_grpc

        control = control_pb2_grpc.ControlServiceStub(ch)
        inference = inference_pb2_grpc.InferenceServiceStub(ch)
        slowest = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            control.Status(control_pb2.StatusRequest(), timeout=10)
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.2)
        assert slowest < 2.0, slowest
        out = list(inference.Generate(pb.GenerateRequest(
            prompt="a b c", sampling=pb.SamplingParams(max_tokens=5)), timeout=30))
        assert out[-1].usage.completion_tokens == 5
        tail = list(control.TailLogs(control_pb2.TailLogsRequest(role=GEN, lines=10_000),
                                     timeout=10))
        assert len(tail) == 100
        assert tail[-1].seq > 1000  # far more lines went by than were kept
        assert all(ln.text.startswith("flood line") for ln in tail)
    records = d.records()
    per_second: dict[str, int] = {}
    for r in records:
        if r.get("event") == "child output":
            per_second[r["timestamp"][:19]] = per_second.get(r["timestamp"][:19], 0) + 1
    # 100 lines per (unaligned) one-second window: at most 200 in any clock second.
    assert max(per_second.values()) <= 200, per_second
    suppressed = sum(r["lines"] for r in records if r.get("event") == "child output suppressed")
    assert suppressed > 1000
    code, _ = d.terminate(timeout=30)
    assert code == 0


# -- SIGTERM during a swap ----------------------------------------------------------------


@pytest.mark.parametrize("drain", [0.0, 30.0], ids=["drain-cuts-the-swap", "swap-finishes"])
def test_sigterm_during_swap_exits_clean_without_orphans(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str,
        drain: float) -> None:
    """SIGTERM while a swap's new child is loading beside the old one. With a drain grace
    the swap finishes within it (DONE), else the drain cuts it (the call ends with
    CANCELLED or UNAVAILABLE, the new child is stopped half-loaded); either way the swap
    call ends, both children are stopped and reaped, and the daemon exits 0 within
    drain_grace + stop_grace."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_DRAIN_GRACE=str(drain), LLAMAD_CHILD_STOP_GRACE="3",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    old = d.wait_running().pid
    stages: list[int] = []
    ended: list[grpc.StatusCode] = []
    loading = threading.Event()

    def swap() -> None:
        with d.stub(control_pb2_grpc.ControlServiceStub) as stub:
            try:
                for p in stub.Swap(control_pb2.SwapRequest(
                        role=GEN, model_path=str(model_path(DEFAULT_MODEL))), timeout=120):
                    stages.append(p.stage)
                    if p.stage == control_pb2.SWAP_STAGE_LOADING:
                        loading.set()
                ended.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                ended.append(exc.code())
            finally:
                loading.set()

    worker = threading.Thread(target=swap)
    worker.start()
    assert loading.wait(60)
    assert control_pb2.SWAP_STAGE_DONE not in stages
    deadline = time.monotonic() + 10
    while len(children := descendants(d.pid)) < 2:  # the new child beside the old one
        assert time.monotonic() < deadline, children
        time.sleep(0.05)
    assert old in children
    code, took = d.terminate(timeout=90)
    worker.join(30)
    assert not worker.is_alive(), "the Swap call never ended"
    assert code == 0
    assert took < drain + 3 + 5, took
    assert gone(sorted(children), 5) == []
    if drain:
        assert ended == [grpc.StatusCode.OK] and stages[-1] == control_pb2.SWAP_STAGE_DONE
    else:
        assert ended in ([grpc.StatusCode.CANCELLED], [grpc.StatusCode.UNAVAILABLE]), ended
    assert d.records()[-1]["event"] == "stopped"


# -- SIGTERM during an ingest -------------------------------------------------------------


def test_sigterm_during_ingest_keeps_acknowledged_documents(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """SIGTERM while documents are pushed and a directory is being reindexed: every call
    either succeeded or got UNAVAILABLE/CANCELLED, the daemon exits 0 within drain_grace +
    stop_grace, and after a restart every acknowledged document is indexed and found."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(400):  # enough that the scan is still running at SIGTERM
        (corpus / f"note{i:03}.md").write_text(
            f"# note {i}\n\nscanword{i} " + " ".join(f"filler{j}" for j in range(60)) + "\n")
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_DRAIN_GRACE="2", LLAMAD_CHILD_STOP_GRACE="3",
                     LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path),
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    d.wait_embeddable()
    acked: list[str] = []
    outcomes: list[grpc.StatusCode] = []
    stop = threading.Event()

    def push() -> None:
        with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
            i = 0
            while not stop.is_set():
                token = f"pushword{i}"
                try:
                    stub.UpsertDocument(rpb.UpsertDocumentRequest(
                        source_id="notes", id=f"notes/{token}", title=token,
                        text=f"{token} " + " ".join(f"word{j}" for j in range(100))), timeout=60)
                except grpc.RpcError as exc:
                    outcomes.append(exc.code())
                    return
                acked.append(f"notes/{token}")
                i += 1

    def reindex() -> None:
        with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
            try:
                for _ in stub.Reindex(rpb.ReindexRequest(source_id="docs"), timeout=120):
                    pass
                outcomes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                outcomes.append(exc.code())

    with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        stub.AddSource(rpb.AddSourceRequest(id="notes"))
        stub.AddSource(rpb.AddSourceRequest(id="docs", path=str(corpus)))
    workers = [threading.Thread(target=push), threading.Thread(target=reindex)]
    for w in workers:
        w.start()
    # The pushes are background work, queued behind the scan's documents in the embedding
    # batcher (FIFO within the lane): a wait for an event, stretched on a loaded machine.
    deadline = time.monotonic() + patience(20)
    while len(acked) < 5:
        assert time.monotonic() < deadline, outcomes
        assert not set(outcomes) - {grpc.StatusCode.OK}, outcomes
        time.sleep(0.05)
    code, took = d.terminate(timeout=60)
    stop.set()
    for w in workers:
        w.join(30)
        assert not w.is_alive()
    assert code == 0, d.tail()
    assert took < 2 + 3 + 5, took
    assert set(outcomes) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                             grpc.StatusCode.OK}, outcomes
    assert not [r for r in d.records() if r.get("level") == "error"], d.tail()

    again = processes(tmp_path, env)
    again.wait_embeddable()
    with again.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        docs = {doc.id: doc for doc in stub.ListDocuments(rpb.ListDocumentsRequest()).documents}
        stuck = [doc for doc in docs.values() if doc.state == rpb.DOCUMENT_STATE_PROCESSING]
        assert not stuck, stuck

        def found(doc_id: str, word: str) -> bool:
            hits = stub.Search(rpb.SearchRequest(query=word, top_k=5)).hits
            return any(h.document_id == doc_id and h.text_rank == 1 for h in hits)

        for doc_id in acked:
            assert docs[doc_id].state == rpb.DOCUMENT_STATE_INDEXED, docs[doc_id]
            assert found(doc_id, doc_id.split("/")[1]), doc_id
        for doc in docs.values():  # everything that says "indexed" is searchable
            if doc.id.startswith("docs/") and doc.state == rpb.DOCUMENT_STATE_INDEXED:
                assert found(doc.id, "scanword" + str(int(doc.id[-6:-3]))), doc.id
        status = stub.Status(rpb.RetrievalStatusRequest())
        # Calls the drain let finish were embedded too (not left BM25-only for good).
        assert status.embedded_chunks == status.chunks == status.vectors, status
    code, _ = again.terminate(timeout=60)
    assert code == 0


# -- the daemon is killed while a child starts --------------------------------------------


def _processes_with(needle: str) -> dict[int, bytes]:
    """Live processes whose command line holds ``needle``, with their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read()
            except OSError:
                continue
            if needle.encode() in cmdline:
                found[int(entry)] = cmdline
    return found


def test_sigkill_while_a_child_starts_leaves_no_orphan(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """kill -9 of the daemon between spawning a child and the child arming its
    parent-death signal (an instant, widened here to 2 s by a slow ``setpriv`` on PATH):
    the child finds itself orphaned and exits instead of running on for good."""
    real = shutil.which("setpriv")
    if real is None:
        pytest.skip("needs util-linux setpriv")
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "setpriv").write_text(f'#!/bin/sh\nsleep 2\nexec "{real}" "$@"\n')
    (slow / "setpriv").chmod(0o755)
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"),
                     PATH=f"{slow}{os.pathsep}{os.environ['PATH']}")
    d = processes(tmp_path, env)
    argv = str(d.wait_event("launching child")["argv"])
    alias = argv.split("--alias ")[1].split(maxsplit=1)[0]
    d.kill()
    try:
        deadline = time.monotonic() + 15
        while (left := _processes_with(alias)) and time.monotonic() < deadline:
            running = [c for c in left.values() if c.startswith(llama_server.encode())]
            assert not running, f"the child outlived the daemon: {running}"
            time.sleep(0.2)
        assert not left, left
    finally:
        for pid in _processes_with(alias):
            os.kill(pid, signal.SIGKILL)
