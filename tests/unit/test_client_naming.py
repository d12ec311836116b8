"""The clients and the CLI name a model, pass tools and every Search option (issue 31):
what reaches the (fake) daemon, and what the CLI prints of it."""

from __future__ import annotations

import asyncio
import io
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from clients import AsyncClient, Client, Message, Tool, ToolCall, ToolCallDelta
from clients._convert import ChatInput
from clients._tools import joined, tool_choice
from clients.cli._progress import Elapsed, count_files
from clients.cli._search import titled
from clients.testing import FakeLlamad
from daemon.cli import version
from llamad_protocol.v1 import inference_pb2
from tests.support.cli_run import Run


@pytest.fixture
def client(fake: FakeLlamad) -> Client:
    return Client(fake.address, timeout=10)


def test_model_on_every_inference_call(client: Client, fake: FakeLlamad) -> None:
    """model= reaches Generate, Chat, Embed, Tokenize and Ask; each answer says which
    model served (the fake serves the name asked for)."""
    with client:
        result = client.generate("hi", model="gemma-3-270m-q4_k_m", max_tokens=2).collect()
        assert fake.requests["InferenceService/Generate"].model == "gemma-3-270m-q4_k_m"
        assert result.model_name == "gemma-3-270m-q4_k_m"
        result = client.chat([("user", "hi")], model="smol", max_tokens=1).collect()
        assert fake.requests["InferenceService/Chat"].model == "smol"
        assert result.model_name == "smol"
        assert client.embed("x", model="minilm").model_name == "minilm"
        assert fake.requests["InferenceService/Embed"].model == "minilm"
        assert client.tokenize("a b", model="smol").model_name == "smol"
        done = client.ask("anything", model="smol").collect()
        assert fake.requests["AnswerService/Ask"].model == "smol"
        assert done.done is not None
        # Without model=: the empty name, the daemon's default.
        assert client.generate("hi", max_tokens=1).collect().model_name == "fake-model"
        assert fake.requests["InferenceService/Generate"].model == ""


def test_async_client_names_a_model(fake: FakeLlamad) -> None:
    async def main() -> tuple[str, str]:
        async with AsyncClient(fake.address, timeout=10) as llamad:
            result = await llamad.chat([("user", "hi")], model="smol", max_tokens=1).collect()
            embedded = await llamad.embed(["a"], model="minilm")
            await llamad.ask("q", model="gemma").collect()
            return result.model_name, embedded.model_name

    assert asyncio.run(main()) == ("smol", "minilm")
    assert fake.requests["AnswerService/Ask"].model == "gemma"


def test_chat_tools_and_tool_choice_reach_the_request(client: Client, fake: FakeLlamad) -> None:
    """Tools as Tool, as a plain mapping and in OpenAI's shape; tool_choice as a mode or
    a name; an assistant's tool calls and the tool's answer in the history."""
    weather = {"type": "function", "function": {
        "name": "weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    history: list[ChatInput] = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        Message("assistant", "", tool_calls=(ToolCall("c2", "clock", "{}"),)),
        Message("tool", "noon", tool_call_id="c2"),
    ]
    with client:
        client.chat(history, tools=[weather, Tool("clock"), {"name": "noop"}],
                    tool_choice="weather", parallel_tool_calls=False, max_tokens=1).collect()
    request = fake.requests["InferenceService/Chat"]
    assert [t.name for t in request.tools] == ["weather", "clock", "noop"]
    assert json.loads(request.tools[0].parameters)["properties"]["city"] == {"type": "string"}
    assert request.tools[0].description == "the weather in a city"
    assert request.tools[1].parameters == ""
    assert request.tool_choice.function == "weather"
    assert request.HasField("parallel_tool_calls") and not request.parallel_tool_calls
    assert [m.role for m in request.messages] == [
        inference_pb2.CHAT_ROLE_USER, inference_pb2.CHAT_ROLE_ASSISTANT,
        inference_pb2.CHAT_ROLE_TOOL, inference_pb2.CHAT_ROLE_ASSISTANT,
        inference_pb2.CHAT_ROLE_TOOL]
    call = request.messages[1].tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("c1", "weather", '{"city": "Paris"}')
    assert request.messages[2].tool_call_id == "c1"
    assert request.messages[3].tool_calls[0].name == "clock"
    assert request.messages[4].tool_call_id == "c2"


def test_tool_choice_modes_and_bad_tools() -> None:
    assert tool_choice("required").mode == inference_pb2.TOOL_CHOICE_MODE_REQUIRED  # type: ignore[union-attr]
    assert tool_choice("none").mode == inference_pb2.TOOL_CHOICE_MODE_NONE  # type: ignore[union-attr]
    assert tool_choice({"type": "function", "function": {"name": "f"}}).function == "f"  # type: ignore[union-attr]
    assert tool_choice(None) is None
    with pytest.raises(ValueError, match="tool_choice"):
        tool_choice("")
    with Client("127.0.0.1:1") as unreachable:  # refused before anything is sent
        with pytest.raises(ValueError, match="function name"):
            unreachable.chat([("user", "x")], tools=[{"description": "no name"}])
        with pytest.raises(ValueError, match="history"):
            unreachable.ask("x", history=[{"role": "tool", "content": "r",
                                           "tool_call_id": "c"}])


def test_streamed_tool_call_pieces_join_in_index_order() -> None:
    pieces = [ToolCallDelta(1, "b", "second", '{"x"'), ToolCallDelta(0, "a", "first", "{}"),
              ToolCallDelta(1, arguments=": 1}")]
    assert joined(pieces) == (ToolCall("a", "first", "{}"),
                              ToolCall("b", "second", '{"x": 1}'))


def test_every_search_option_reaches_the_request(client: Client, fake: FakeLlamad) -> None:
    since, until = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    with client:
        client.search("q", top_k=3, sources=["s"], kinds=["markdown"], categories=["c"],
                      tags=["t"], indexed_since=since, indexed_until=until, mode="text",
                      min_score=0.2, candidates=40, text_weight=2.0, vector_weight=0.5,
                      group_by_document=True, dated_since=since, dated_until=until,
                      fusion="convex")
    r = fake.requests["RetrievalService/Search"]
    assert (r.top_k, r.candidates, r.min_score, r.text_weight, r.vector_weight) == (
        3, 40, 0.2, 2.0, 0.5)
    assert r.fusion == "convex"
    assert r.group_by_document
    assert r.filters.indexed_since.ToDatetime(UTC) == since
    assert r.filters.dated_until.ToDatetime(UTC) == until
    assert list(r.filters.kinds) == ["markdown"]


# --- the CLI ----------------------------------------------------------------------------

def test_cli_model_flag_on_generate_chat_embed_ask(llamad: Run, fake: FakeLlamad) -> None:
    for argv, key in ((("generate", "hi"), "InferenceService/Generate"),
                      (("chat", "--user", "hi"), "InferenceService/Chat"),
                      (("embed", "a", "b"), "InferenceService/Embed"),
                      (("ask", "anything"), "AnswerService/Ask")):
        status, _, err = llamad(*argv, "--model", "gemma-3-270m-q4_k_m")
        assert (status, err) == (0, ""), argv
        assert fake.requests[key].model == "gemma-3-270m-q4_k_m", argv
    status, out, _ = llamad("embed", "a", "b", "--json", "--model", "minilm")
    doc = json.loads(out)
    assert doc["model_name"] == "minilm" and doc["dimension"] == 8
    assert len(doc["vectors"]) == 2
    status, out, _ = llamad("chat", "--user", "hi", "--max-tokens", "1", "--json",
                            "--model", "smol")
    assert json.loads(out.splitlines()[-1])["model_name"] == "smol"


def test_cli_chat_tools_file(llamad: Run, fake: FakeLlamad, tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "weather"}}]))
    status, _, err = llamad("chat", "--user", "hi", "--tools", str(tools),
                            "--tool-choice", "required", "--max-tokens", "1")
    assert (status, err) == (0, "")
    request = fake.requests["InferenceService/Chat"]
    assert [t.name for t in request.tools] == ["weather"]
    assert request.tool_choice.mode == inference_pb2.TOOL_CHOICE_MODE_REQUIRED
    status, _, err = llamad("chat", "--user", "hi", "--tool-choice", "auto")
    assert status == 2 and "--tool-choice goes with --tools" in err
    tools.write_text('{"name": "not an array"}')
    status, _, err = llamad("chat", "--user", "hi", "--tools", str(tools))
    assert status == 2 and "JSON array" in err


def test_cli_search_options_and_section(llamad: Run, fake: FakeLlamad, tmp_path: Path) -> None:
    """search passes every option; a hit shows its section beside the title; ask's
    sources too, on the same score scale as search."""
    (tmp_path / "web01.md").write_text("# Web01 runbook\n\n## Disk full\n\nrotate nginx logs\n")
    assert llamad("ingest", str(tmp_path), "--source", "docs")[0] == 0
    status, out, _ = llamad("search", "nginx", "--candidates", "30", "--text-weight", "2",
                            "--vector-weight", "0.5", "--indexed-since", "2026-01-01",
                            "--mode", "text", "--fusion", "dbsf")
    assert status == 0
    r = fake.requests["RetrievalService/Search"]
    assert (r.candidates, r.text_weight, r.vector_weight, r.fusion) == (30, 2.0, 0.5, "dbsf")
    assert r.filters.HasField("indexed_since")
    row = out.splitlines()[1]
    assert "web01: Disk full" in row  # the fake's title is the file name
    score = row.split()[-5]
    status, out, _ = llamad("ask", "nginx", "--mode", "text")
    source = out.split("Sources:\n", 1)[1].splitlines()[0]
    assert source == f"[S1] web01: Disk full — web01.md ({score})"
    assert score == "1.000"


def test_version_and_models_help(llamad: Run) -> None:
    with pytest.raises(SystemExit) as stopped:
        llamad("--version")
    assert stopped.value.code == 0
    status, out, _ = llamad("models", "--help")
    assert status == 0
    verbs = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert {"ps", "load", "unload", "prepare", "list", "verify"} <= verbs
    status, _, err = llamad("models")
    assert status == 2 and "ps" in err
    assert version() != ""


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    from daemon.cli import main

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"llamad {metadata.version('llamad')}"


def test_a_hit_is_titled_by_its_section() -> None:
    """Title and section once each: the heading path's leading title is not repeated."""
    assert titled("Runbook", "Runbook > Disk full > nginx") == "Runbook: Disk full > nginx"
    assert titled("Runbook", "Runbook") == "Runbook"
    assert titled("notes.txt", "") == "notes.txt"
    assert titled("", "Disk full") == "Disk full"
    assert titled("A long title", "and a long   section", 20) == "A long title: and a…"


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_scan_progress_on_a_terminal_only(llamad: Run, fake: FakeLlamad, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """ingest on a terminal draws a bar with the total (counted here, hidden files left
    out), the rate and the ETA on stderr; with --json, or off a terminal, nothing."""
    for i in range(3):
        (tmp_path / f"n{i}.md").write_text(f"# note {i}\n\nnginx {i}\n")
    assert count_files(tmp_path) == 3
    assert count_files(tmp_path / "n0.md") is None
    hidden = tmp_path.parent / f"{tmp_path.name}-hidden"
    (hidden / ".git").mkdir(parents=True)
    (hidden / ".git" / "HEAD").write_text("x")
    (hidden / ".env").write_text("x")
    (hidden / "a.md").write_text("x")
    assert count_files(hidden) == 1
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    status, out, _ = llamad("ingest", str(tmp_path), "--source", "notes")
    assert status == 0 and out.startswith("notes: 3 files")
    drawn = term.getvalue()
    assert "notes:" in drawn and "/3" in drawn and "files/s" in drawn  # total and rate
    assert "<" in drawn  # tqdm's elapsed<remaining: the ETA
    term.seek(0)
    term.truncate()
    status, out, _ = llamad("reindex", "--source", "notes", "--json")
    assert status == 0 and json.loads(out.splitlines()[-1])["source_id"] == "notes"
    assert term.getvalue() == ""


def test_model_load_shows_elapsed_on_a_terminal(llamad: Run, fake: FakeLlamad,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    fake.delay["ControlService/LoadModel"] = 1.2
    status, out, _ = llamad("models", "load", "fake-model")
    assert status == 0
    assert "loading fake-model (00:0" in term.getvalue()
    term.seek(0)
    term.truncate()
    status, out, _ = llamad("models", "load", "fake-model", "--json")
    assert status == 0 and json.loads(out)["name"]
    assert term.getvalue() == ""


def test_ask_says_what_it_waits_for_on_a_terminal_only() -> None:
    term = _Terminal()
    with Elapsed(term, "searching the documents, then waiting for the model", shown=True,
                 interval=0.05) as waiting:
        time.sleep(0.2)  # the line is redrawn while nothing has come
        waiting.done()
        drawn = term.getvalue()
    assert "searching the documents, then waiting for the model (00:00)" in drawn
    assert drawn.endswith("\r")  # erased (leave=False) before the answer
    with Elapsed(term, "x", shown=False, interval=0.01):  # --json, or not a terminal
        time.sleep(0.05)
    assert term.getvalue() == drawn


def test_fake_ask_dry_run_plans_without_generating(client: Client, fake: FakeLlamad) -> None:
    """FakeLlamad answers ask(dry_run=True) as the daemon does: a plan (every hit kept
    under its label, the prompt's sections and tokens, the budget) instead of text, the
    sources, and done marked dry_run with the prompt's tokens and none generated; a
    question nothing matches plans no sections and is no_context."""
    with client:
        client.add_source("notes")
        client.upsert_document("notes", "# Disk\n\nThe zanzibar disk fills at night.",
                               document_id="disk", title="Disk")
        result = client.ask("zanzibar disk", dry_run=True, model="smol").collect()
        assert fake.requests["AnswerService/Ask"].dry_run
        plan, done = result.plan, result.done
        assert result.answer == "" and plan is not None and done is not None
        assert [(h.document_id, h.verdict, h.label) for h in plan.hits] == [
            ("disk", "kept", "S1")]
        assert [s.role for s in plan.sections] == ["system", "user"]
        assert "zanzibar disk fills" in plan.sections[1].content
        assert plan.prompt_tokens == sum(s.tokens for s in plan.sections) > 0
        assert plan.budget > plan.prompt_tokens
        assert result.sources is not None and [c.label for c in result.sources.citations] \
            == ["S1"]
        assert done.dry_run and done.model_name == "smol"
        assert done.usage is not None
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (
            plan.prompt_tokens, 0)
        nothing = client.ask("quokka", dry_run=True).collect()
        assert nothing.plan is not None and nothing.plan.sections == ()
        assert nothing.done is not None and nothing.done.no_context and nothing.done.dry_run


def test_detokenize_through_the_clients(client: Client, fake: FakeLlamad) -> None:
    """detokenize sends the ids and the model named, and answers the text (the fake's
    words of x's for its word-length ids)."""
    with client:
        ids = client.tokenize("ab cde", model="smol").ids
        assert client.detokenize(ids, model="smol") == "xx xxx"
        sent = fake.requests["InferenceService/Detokenize"]
        assert (list(sent.tokens), sent.model) == ([2, 3], "smol")
