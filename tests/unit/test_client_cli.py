"""The ``llamad`` client verbs in-process against a fake daemon: what they print, on which
stream, and the documented exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from clients.testing import FakeLlamad
from tests.support.cli_run import Run


def corpus(root: Path) -> Path:
    (root / "runbooks").mkdir(parents=True)
    (root / "runbooks" / "web01.md").write_text("# web01\n\nDisk full: rotate nginx logs.\n")
    (root / "vpn.txt").write_text("VPN tunnel flapping: set dpd 30.\n")
    return root


def test_status_table_and_json(llamad: Run) -> None:
    """status: a header, one aligned row per child, the retrieval line; --json parses."""
    status, out, err = llamad("status")
    assert status == 0
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("llamad 0.0.0-fake at 127.0.0.1:")
    assert lines[1].split()[:4] == ["ROLE", "STATE", "PID", "MODEL"]
    assert lines[2].split()[:4] == ["generation", "running", "4243", "fake-model.gguf"]
    assert lines[1].index("STATE") == lines[2].index("running")  # aligned
    assert "1/2" in lines[2] and "1/2+" not in lines[2]  # busy/slots
    assert "1/1+2" in lines[3]  # busy/slots + calls sent ahead to the child's queue
    assert lines[-1].startswith("retrieval: 0 sources")
    assert "generation: chat template the model's own (tokenizer.chat_template)" in lines
    assert not any(line.startswith("embedding: chat template") for line in lines)
    status, out, _ = llamad("status", "--json")
    doc = json.loads(out)
    assert [c["role"] for c in doc["children"]] == ["generation", "embedding"]
    assert doc["children"][0]["state"] == "running"
    assert doc["children"][0]["chat_template"].startswith("the model's own")
    assert doc["retrieval"]["embedding_model"] == "fake-embed.gguf@0123"


def test_generate_streams_text_and_json_lines(llamad: Run) -> None:
    """generate prints the text (newline-terminated); --json gives one object per chunk."""
    status, out, err = llamad("generate", "hello", "--max-tokens", "4")
    assert (status, out, err) == (0, "The quick brown fox\n", "")
    status, out, _ = llamad("generate", "-", "--max-tokens", "2", "--json", stdin="hi")
    chunks = [json.loads(line) for line in out.splitlines()]
    assert [c["text"] for c in chunks] == ["The", " quick", ""]
    assert chunks[-1]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_chat_from_flags_and_from_stdin(llamad: Run, fake: FakeLlamad) -> None:
    """chat sends --system/--user in order; without --user it reads one turn per line."""
    assert llamad("chat", "--system", "terse", "--user", "hi", "--max-tokens", "2")[:2] == (
        0, "The quick\n")
    status, out, _ = llamad("chat", "--max-tokens", "1", stdin="first\n\nsecond\n")
    assert (status, out) == (0, "The\nThe\n")
    assert fake.calls["InferenceService/Chat"] == 3


def test_ask_prints_answer_then_numbered_sources(llamad: Run, tmp_path: Path) -> None:
    """ask streams the answer, then `[S1] title — path (score)` lines."""
    assert llamad("ingest", str(corpus(tmp_path)), "--source", "docs")[0] == 0
    status, out, err = llamad("ask", "disk full on web01")
    assert status == 0
    assert err == ""
    answer, sources = out.split("\n\nSources:\n")
    assert answer.strip() == "Rotate the nginx logs [S1]."
    assert sources.splitlines() == ["[S1] web01 — runbooks/web01.md (1.000)"]
    status, out, _ = llamad("ask", "disk", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert {e["event"] for e in events[:-2]} == {"text"}
    assert events[-2]["event"] == "sources"
    assert events[-2]["citations"][0]["label"] == "S1"
    assert events[-1]["event"] == "done"


def test_ingest_then_search_and_sources(llamad: Run, tmp_path: Path) -> None:
    """ingest adds the directory and prints the final counts (no progress off a TTY);
    search prints a table, or JSON; sources lists the source."""
    status, out, err = llamad("ingest", str(corpus(tmp_path)), "--source", "docs",
                              "--category", "runbook")
    assert status == 0
    assert err == ""  # progress only on a terminal
    assert out.startswith("docs: 2 files: 2 added, 0 changed, 0 unchanged, 0 deleted,")
    assert "files/s" in out
    status, out, _ = llamad("search", "nginx logs")
    header, row = out.splitlines()
    assert header.split() == ["CITATION", "TITLE:", "SECTION", "PATH", "DATED", "FOUND", "BY",
                              "SCORE", "BM25", "VECTOR"]
    assert row.split()[:5] == ["docs:runbooks/web01.md#0", "web01", "runbooks/web01.md", "-",
                               "hybrid"]
    status, out, _ = llamad("search", "nginx", "--json")
    doc = json.loads(out)
    assert doc["mode"] == "hybrid"
    assert doc["hits"][0]["chunk_id"] == "docs:runbooks/web01.md#0"
    status, out, _ = llamad("sources", "--json")
    assert [(s["id"], s["kind"], s["documents"]) for s in json.loads(out)] == [
        ("docs", "directory", 2)]
    status, out, _ = llamad("reindex", "--source", "docs", "--json")
    assert json.loads(out)["unchanged"] == 2


def test_ingest_names_the_source_after_the_directory(llamad: Run, tmp_path: Path) -> None:
    """Without --source, the source id is the directory's name made an id ('My Docs' is
    my-docs); ingesting that directory again updates it; another directory of the same
    name, or a name that makes no id, is a usage error that says to give --source."""
    docs = corpus(tmp_path / "team" / "My Docs")
    status, out, err = llamad("ingest", str(docs))
    assert (status, err) == (0, "")
    assert out.startswith("my-docs: 2 files: 2 added,")
    status, out, _ = llamad("ingest", str(docs / "runbooks" / ".."))
    assert status == 0 and out.startswith("my-docs: 2 files: 0 added, 0 changed, 2 unchanged")
    other = corpus(tmp_path / "elsewhere" / "my docs")
    status, out, err = llamad("ingest", str(other))
    assert (status, out) == (2, "")
    assert err == (f"llamad: ingest: source 'my-docs' already exists for {docs}: give this "
                   "directory its own id with --source ID\n")
    assert llamad("ingest", str(other), "--source", "other-docs")[0] == 0
    unnamed = tmp_path / "\u6587\u66f8"
    unnamed.mkdir()
    status, out, err = llamad("ingest", str(unnamed))
    assert (status, out) == (2, "")
    assert err.startswith("llamad: ingest: the name '\u6587\u66f8' makes no source id")
    assert err.endswith(": give one with --source ID\n")
    status, out, _ = llamad("sources", "--json")
    assert sorted(s["id"] for s in json.loads(out)) == ["my-docs", "other-docs"]


def test_sources_disable_and_enable(llamad: Run, tmp_path: Path) -> None:
    """sources --disable ID says so and the listing marks it; --enable undoes it; an
    unknown id is the not-found exit status."""
    assert llamad("ingest", str(corpus(tmp_path)), "--source", "kb")[0] == 0
    status, out, _ = llamad("sources", "--disable", "kb")
    assert status == 0
    assert out.startswith("kb: disabled (")
    assert "kb (disabled)" in llamad("sources")[1]
    assert llamad("sources", "--enable", "kb")[1].startswith("kb: enabled (")
    assert "(disabled)" not in llamad("sources")[1]
    assert llamad("sources", "--disable", "nope")[0] == 4


def test_reprocess_says_what_it_started_or_why_not(llamad: Run, tmp_path: Path) -> None:
    """reprocess: the daemon's reason when nothing needs embedding; an unknown document
    is one line and the not-found exit status; both scopes at once are refused."""
    status, out, _ = llamad("reprocess")
    assert (status, out) == (0, "nothing to embed: every chunk has a vector of the current "
                             "embedding model\n")
    status, _, err = llamad("reprocess", "--document", "nope")
    assert status == 4
    assert err.startswith("llamad: reprocess: ") and "nope" in err
    with pytest.raises(SystemExit):
        llamad("reprocess", "--document", "a", "--source", "b")


def test_swap_streams_stages_and_fails_in_one_line(llamad: Run, tmp_path: Path) -> None:
    """swap prints one line per stage; a failed swap exits 1 with one error line."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    status, out, err = llamad("swap", "generation", str(model))
    assert status == 0
    assert [line.split()[1] for line in out.splitlines()] == [
        "validating", "launching", "probing", "swapping", "done"]
    status, out, err = llamad("swap", "generation", "/nonexistent.gguf")
    assert status == 1
    assert err.count("\n") == 1
    assert err.startswith("llamad: swap: aborted: swap failed: /nonexistent.gguf")
    assert "failed" in out
    assert llamad("swap", "generation")[0] == 2
    assert llamad("swap", "generation", "x.gguf", "--rollback")[0] == 2


def test_logs_last_n_lines(llamad: Run) -> None:
    """logs -n N prints the latest N lines."""
    status, out, _ = llamad("logs", "generation", "-n", "5")
    assert status == 0
    assert [line.split()[-2:] for line in out.splitlines()] == [
        ["line", str(n)] for n in range(26, 31)]
    status, out, _ = llamad("logs", "embedding", "-n", "2", "--json")
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["line 29", "line 30"]


def test_exit_codes(llamad: Run, fake: FakeLlamad, tmp_path: Path) -> None:
    """3 unreachable, 5 invalid argument, 6 busy (with the hint), 2 usage and config
    errors, 1 other failures; always one line on stderr, never a traceback."""
    cases = [
        (("status", "--address", "127.0.0.1:1"), 3, "llamad: status: cannot reach the daemon"),
        (("search", ""), 5, "llamad: search: invalid argument: query is empty"),
        (("generate", "hi"), 6, "llamad: generate: busy: full (retry in 1.5s)"),
        (("status", "--token-file", str(tmp_path / "none")), 2,
         "llamad: status: cannot read the token file"),
        (("ingest", str(tmp_path / "missing"), "--source", "x"), 2, "is not a directory"),
        (("status",), 1, "llamad: status: timed out: "),
        (("status",), 3, "llamad: status: unavailable: draining (retry in 0.25s)"),
    ]
    fake.fail("InferenceService/Generate", grpc.StatusCode.RESOURCE_EXHAUSTED, "full",
              retry_after_ms=1500)
    for args, expected, message in cases:
        if expected == 1:
            fake.fail("ControlService/Status", grpc.StatusCode.DEADLINE_EXCEEDED, "too slow")
        if message.endswith("draining (retry in 0.25s)"):
            fake.fail("ControlService/Status", grpc.StatusCode.UNAVAILABLE, "draining",
                      times=10, retry_after_ms=250)
        status, out, err = llamad(*args)
        assert status == expected, (args, err)
        assert message in err, err
        assert err.count("\n") == 1
        assert "Traceback" not in err
        assert out == ""


def test_models_list_is_delegated(llamad: Run, tmp_path: Path) -> None:
    """llamad models ... runs python -m models in-process, with its own options."""
    status, out, _ = llamad("models", "list", "--json", "--dest", str(tmp_path))
    assert status == 0
    doc = json.loads(out)
    assert {m["status"] for m in doc["models"]} == {"missing"}
    assert llamad("models", "frobnicate")[0] == 2


def test_models_ps_load_unload_talk_to_the_daemon(llamad: Run, fake: FakeLlamad) -> None:
    """llamad models ps|load|unload are the daemon's catalog (beside the local files'
    prepare|list|verify): a table or JSON, a load and an unload by name, NOT_FOUND's
    exit status for a name the daemon does not have."""
    status, out, _ = llamad("models", "ps")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "ROLE", "STATE"]
    assert any(line.startswith("fake-model *") and "ready" in line for line in lines)
    assert any(line.startswith("fake-other") and "unloaded" in line for line in lines)
    status, out, _ = llamad("models", "load", "fake-other")
    assert (status, out) == (0, "fake-other: ready\n")
    doc = json.loads(llamad("models", "ps", "--json")[1])
    states = {m["name"]: m["state"] for m in doc["models"]}
    assert states == {"fake-model": "ready", "fake-embed": "ready", "fake-other": "ready"}
    assert fake.calls["ControlService/ListModels"] == 2
    status, out, _ = llamad("models", "unload", "fake-other", "--json")
    assert status == 0 and json.loads(out)["state"] == "unloaded"
    status, _, err = llamad("models", "load", "nope")
    assert status == 4
    assert "'nope' does not exist" in err
    assert llamad("models", "load")[0] == 2  # NAME missing
