"""The ``llamad`` command as operators and scripts use it: the installed console script,
run as a subprocess against a real daemon subprocess (real llama-server children)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import Client
from tests.conftest import ROOT
from tests.support.daemon import config_env

pytestmark = pytest.mark.integration

SCRIPT = Path(sys.executable).with_name("llamad")
COMMAND = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "daemon"]


class Daemon:
    """``python -m daemon serve`` with its log in a file (never a pipe: a full pipe would
    block the daemon)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daemon", "serve"], cwd=ROOT,
                env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=fh)

    def address(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") == "listening":
                    return str(record["address"])
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        raise AssertionError("the daemon never listened")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def daemon_serving(tmp_path_factory: pytest.TempPathFactory, **env: str) -> Iterator[str]:
    """A daemon subprocess (llama-server children, settings ``env`` on top), serving; its
    address. Its state and log are in a fresh temporary directory; directory sources
    (ingest) may live anywhere under pytest's temporary directory."""
    tmp = tmp_path_factory.mktemp("daemon")
    daemon = Daemon(config_env("llama-server", LLAMAD_STATE_DIR=str(tmp / "state"),
                               LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(
                                   tmp_path_factory.getbasetemp()), **env),
                    tmp / "daemon.log")
    try:
        addr = daemon.address()
        with Client(addr) as client:
            client.wait_serving("", timeout=120)
        yield addr
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def address(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running daemon (both children) for the module; its address."""
    # History retention runs every second (not 60 s), so its test need not wait long.
    with daemon_serving(tmp_path_factory, LLAMAD_RETRIEVAL_RETENTION_INTERVAL="1") as addr:
        yield addr


def llamad(address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the console script with LLAMAD_ADDRESS set; stdout and stderr captured."""
    return subprocess.run(
        [*COMMAND, *args], cwd=ROOT, env={**os.environ, "LLAMAD_ADDRESS": address},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        check=False)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("llamad: ")
    return lines[0]


def test_console_script_is_installed() -> None:
    """`llamad` is the console script of the venv running the tests."""
    assert SCRIPT.is_file(), f"{SCRIPT} missing: pip install -e ."


def test_status_table_and_json(address: str) -> None:
    """status prints an aligned table of the children; --json is parseable."""
    result = llamad(address, "status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("llamad ") and address in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert rows["generation"][1] == "running"
    assert rows["embedding"][1] == "running"
    assert lines[1].index("STATE") == lines[2].index("running")
    assert lines[-1].startswith("retrieval: ")
    result = llamad(address, "status", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert {c["role"]: c["state"] for c in doc["children"]} == {
        "generation": "running", "embedding": "running"}
    assert doc["children"][0]["pid"] > 0
    assert doc["retrieval"]["sources"] >= 0


def test_generate_streams_to_stdout(address: str) -> None:
    """generate prints the generated text; --json prints one object per chunk."""
    result = llamad(address, "generate", "The capital of France is", "--max-tokens", "8",
                    "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert result.stderr == ""  # no progress or usage off a terminal
    result = llamad(address, "generate", "Hello", "--max-tokens", "4", "--json")
    chunks = [json.loads(line) for line in result.stdout.splitlines()]
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    assert chunks[-1]["finish_reason"] in ("stop", "length")


def test_ingest_then_search(address: str, tmp_path: Path) -> None:
    """ingest adds and indexes a directory (final counts on stdout); search finds it,
    as a table and as JSON; sources lists it."""
    corpus = tmp_path / "corpus"
    (corpus / "runbooks").mkdir(parents=True)
    (corpus / "runbooks" / "web01.md").write_text(
        "# web01\n\n## Disk full\n\nWhen web01 reports No space left on device, rotate the "
        "nginx logs with logrotate -f /etc/logrotate.d/nginx.\n")
    (corpus / "vpn.md").write_text("# VPN\n\nThe tunnel flaps: set dpd 30 on the gateway.\n")
    result = llamad(address, "ingest", str(corpus), "--source", "runbooks")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("runbooks: 2 files: 2 added,")
    assert "files/s" in result.stdout
    result = llamad(address, "search", "web01 no space left on device")
    assert result.returncode == 0, result.stderr
    header, first = result.stdout.splitlines()[:2]
    assert header.split()[:4] == ["CITATION", "TITLE:", "SECTION", "PATH"]
    assert first.startswith("runbooks/runbooks/web01.md#")
    result = llamad(address, "search", "nginx logrotate", "--json", "--top-k", "2")
    doc = json.loads(result.stdout)
    assert doc["hits"][0]["document_id"] == "runbooks/runbooks/web01.md"
    assert doc["mode"] in ("hybrid", "text")
    result = llamad(address, "sources", "--json")
    assert any(s["id"] == "runbooks" and s["documents"] == 2 for s in json.loads(result.stdout))


def test_ingest_names_the_source_after_the_directory(address: str, tmp_path: Path) -> None:
    """ingest without --source: the source is named after the directory."""
    notes = tmp_path / "Team_Notes"
    notes.mkdir()
    (notes / "vpn.md").write_text("# VPN\n\nThe tunnel flaps: set dpd 30 on the gateway.\n")
    result = llamad(address, "ingest", str(notes))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("team_notes: 1 files: 1 added,")


def test_review_before_indexing(address: str, tmp_path: Path) -> None:
    """ingest --review: the file waits in review_required, unsearchable; approve makes it
    searchable; a changed file waits again while the approved version stays searchable;
    reject withdraws the document, and a rescan of the unchanged file keeps it rejected."""
    kb = tmp_path / "vendor"
    kb.mkdir()
    guide = kb / "guide.md"
    guide.write_text("# Guide\n\nReset the zorblax controller by holding the red button.\n")
    result = llamad(address, "ingest", str(kb), "--source", "vendor", "--review")
    assert result.returncode == 0, result.stderr
    doc_id = "vendor/guide.md"

    def found(query: str) -> set[str]:
        result = llamad(address, "search", query, "--json", "--top-k", "20", "--mode",
                        "text")  # BM25: a vector search returns the nearest of any text
        assert result.returncode == 0, result.stderr
        return {h["document_id"] for h in json.loads(result.stdout)["hits"]}

    def state() -> str:
        result = llamad(address, "documents", "--source", "vendor", "--json")
        return str({d["id"]: d["state"] for d in json.loads(result.stdout)}[doc_id])

    assert doc_id not in found("zorblax controller red button")
    waiting = llamad(address, "documents", "--state", "review_required")
    assert waiting.returncode == 0, waiting.stderr
    assert any(line.split()[:2] == [doc_id, "review_required"]
               for line in waiting.stdout.splitlines())
    result = llamad(address, "approve", doc_id, "--note", "checked")
    assert (result.returncode, result.stdout) == (0, f"{doc_id}: indexed\n"), result.stderr
    assert doc_id in found("zorblax controller red button")
    guide.write_text("# Guide\n\nThe frobnicator replaces the zorblax entirely.\n")
    assert llamad(address, "reindex", "--source", "vendor").returncode == 0
    assert state() == "review_required"
    assert doc_id in found("red button")            # the approved version, still served
    assert doc_id not in found("frobnicator")
    result = llamad(address, "reject", doc_id, "--note", "not ours")
    assert result.returncode == 0, result.stderr
    assert doc_id not in found("zorblax controller red button")
    assert llamad(address, "reindex", "--source", "vendor").returncode == 0
    assert state() == "rejected"
    again = llamad(address, "approve", doc_id)
    assert again.returncode == 1
    assert one_line_error(again).startswith(f"llamad: approve: refused: document '{doc_id}' "
                                            "is rejected")


def test_history_source_records_and_retention(address: str, tmp_path: Path) -> None:
    """sources --add --history --max-items 2; three shell-session records pushed with
    llamad push, each dated by --date, are found with their dates; retention prunes the
    oldest in the background (counted on the source) and --dated-since selects by date."""
    result = llamad(address, "sources", "--add", "shell", "--history", "--max-items", "2")
    assert (result.returncode, result.stdout) == (
        0, "shell: history source (2 items; 0 pruned)\n"), result.stderr
    days = ("2026-11-28T08:00:00+00:00", "2026-11-29T08:00:00+00:00",
            "2026-11-30T08:00:00+00:00")
    for i, day in enumerate(days):
        record = tmp_path / f"session{i}.txt"
        record.write_text(f"$ systemctl status quuxd\nquuxd.service failed, exit {i}\n")
        result = llamad(address, "push", "shell", str(record), "--id", f"shell/{i}",
                        "--kind", "session", "--date", day, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["document_date"] == day
    deadline = time.monotonic() + 60  # retention runs every second in this daemon
    while True:
        listed = json.loads(llamad(address, "sources", "--json").stdout)
        shell = next(s for s in listed if s["id"] == "shell")
        if shell["pruned"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (shell["kind"], shell["pruned"], shell["documents"]) == ("history", 1, 2)

    def found(*flags: str) -> dict[str, str]:
        result = llamad(address, "search", "quuxd failed", "--json", "--mode", "text",
                        *flags)
        assert result.returncode == 0, result.stderr
        return {h["document_id"]: h["document_date"]
                for h in json.loads(result.stdout)["hits"]}

    assert found() == {"shell/1": days[1], "shell/2": days[2]}
    assert found("--dated-since", "2026-11-30T00:00+00:00") == {"shell/2": days[2]}


def test_ingest_without_allowed_roots_says_how_to_allow_them(tmp_path: Path) -> None:
    """A daemon that allows no directory source: ingest exits 1 with one line naming the
    option's flag and variable, and how a running daemon takes it."""
    daemon = Daemon(config_env("llama-server", LLAMAD_GENERATION_MODE="disabled",
                               LLAMAD_EMBEDDING_MODE="disabled",
                               LLAMAD_RETRIEVAL_ALLOWED_ROOTS="",
                               LLAMAD_STATE_DIR=str(tmp_path / "state")),
                    tmp_path / "daemon.log")
    try:
        result = llamad(daemon.address(), "ingest", str(ROOT / "docs"))
    finally:
        daemon.stop()
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith("llamad: ingest: refused: directory sources are disabled until "
                           "retrieval.allowed_roots lists")
    for words in ("--retrieval-allowed-roots", "LLAMAD_RETRIEVAL_ALLOWED_ROOTS",
                  "systemctl reload llamad"):
        assert words in line


def test_logs_last_lines(address: str) -> None:
    """logs -n 5 prints the child's latest five lines."""
    result = llamad(address, "logs", "generation", "-n", "5")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 5


def test_unreachable_daemon_exits_3(address: str) -> None:
    """A daemon that is not there: exit 3, one line naming the address."""
    result = llamad("127.0.0.1:1", "status")
    assert result.returncode == 3
    assert one_line_error(result).startswith(
        "llamad: status: cannot reach the daemon at 127.0.0.1:1")


def test_bad_request_exits_5(address: str) -> None:
    """The daemon's INVALID_ARGUMENT: exit 5 and its message."""
    result = llamad(address, "search", "")
    assert result.returncode == 5
    assert one_line_error(result) == "llamad: search: invalid argument: query is empty"


def test_swap_to_missing_model_fails_in_one_line(address: str) -> None:
    """A swap to a missing model: non-zero, one error line; the old child keeps serving."""
    result = llamad(address, "swap", "generation", "/nonexistent.gguf")
    assert result.returncode != 0
    line = one_line_error(result)
    assert line.startswith("llamad: swap: ")
    assert "/nonexistent.gguf" in line
    status = json.loads(llamad(address, "status", "--json").stdout)
    assert status["children"][0]["state"] == "running"


def test_mode_disables_and_reenables_the_embedding_role(address: str) -> None:
    """`llamad mode` switches a role make-before-break and streams the stages: disabled
    refuses Embed with exit 1 and one line; embedded again serves it."""
    result = llamad(address, "mode", "embedding", "disabled", "--reason", "cli test")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split()[1] == "done"
    status = json.loads(llamad(address, "status", "--json").stdout)
    assert {c["role"]: c["mode"] for c in status["children"]}["embedding"] == "disabled"
    usage = llamad(address, "mode", "embedding", "disabled", "--url", "http://x")
    assert usage.returncode == 2 and "endpoint mode" in usage.stderr
    result = llamad(address, "mode", "embedding", "embedded", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    stages = [json.loads(line)["stage"] for line in result.stdout.splitlines()]
    assert stages[0] == "validating" and "launching" in stages and stages[-1] == "done"
    status = json.loads(llamad(address, "status", "--json").stdout)
    embedding = {c["role"]: c for c in status["children"]}["embedding"]
    assert (embedding["mode"], embedding["state"]) == ("embedded", "running")
