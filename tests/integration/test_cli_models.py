"""Clients that name a model (issue 31), against a real daemon subprocess whose pool holds
every GGUF of the models directory: ``llamad chat --model`` and the Python client's
``model=`` are answered by the model named (loaded on demand), ask's sources are on
search's score scale and name their section; ``llamad --version`` and ``llamad models
--help`` as installed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from clients import AsyncClient, Client
from tests.conftest import ROOT, models_dir
from tests.integration.test_cli import COMMAND, daemon_serving, llamad, one_line_error
from tests.support.terminal import Terminal, in_tmux

pytestmark = pytest.mark.integration

SMOL, GEMMA, MINILM = ("SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m",
                       "all-MiniLM-L6-v2-f16")


@pytest.fixture(scope="module")
def address(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running daemon whose catalog is every model of the models directory (SmolLM2 the
    generation default, gemma not resident until named)."""
    with daemon_serving(tmp_path_factory, LLAMAD_MODELS_DIR=str(models_dir()),
                        LLAMAD_GENERATION_PARALLEL="1") as addr:
        yield addr


def _models(address: str) -> dict[str, str]:
    result = llamad(address, "models", "ps", "--json")
    assert result.returncode == 0, result.stderr
    return {m["name"]: m["state"] for m in json.loads(result.stdout)["models"]}


def test_cli_chat_names_a_model_that_answers(address: str) -> None:
    """chat --model gemma: gemma (not resident before) is loaded and answers, as each
    chunk's model_name and `models ps` say; without --model the default answers."""
    assert _models(address)[GEMMA] == "unloaded"
    result = llamad(address, "chat", "--model", GEMMA, "--user", "Say hi.", "--max-tokens",
                    "4", "--temperature", "0", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    chunks = [json.loads(line) for line in result.stdout.splitlines()]
    assert {c["model_name"] for c in chunks} == {GEMMA}
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    assert _models(address)[GEMMA] == "ready"
    result = llamad(address, "generate", "Hello", "--max-tokens", "2", "--json")
    assert {json.loads(line)["model_name"] for line in result.stdout.splitlines()} == {SMOL}
    result = llamad(address, "generate", "Hello", "--model", "no-such-model")
    assert result.returncode == 4
    assert GEMMA in one_line_error(result)  # NOT_FOUND names the models that exist
    result = llamad(address, "embed", "disk full", "--model", MINILM, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model_name"] == MINILM


def test_python_client_model_keyword(address: str) -> None:
    """model= on the blocking and the asyncio client reaches the named model."""
    with Client(address, timeout=180) as client:
        result = client.generate("The capital of France is", model=GEMMA, max_tokens=3,
                                 temperature=0).collect()
        assert result.model_name == GEMMA and result.model == f"{GEMMA}.gguf"
        result = client.chat([("user", "Hi")], model=SMOL, max_tokens=2).collect()
        assert result.model_name == SMOL
        assert client.tokenize("hello", model=GEMMA).model_name == GEMMA
        assert any(m.name == GEMMA and m.state == "ready" for m in client.list_models())

    async def chat() -> str:
        async with AsyncClient(address, timeout=180) as llamad_:
            return (await llamad_.chat([("user", "Hi")], model=GEMMA,
                                       max_tokens=2).collect()).model_name

    import asyncio

    assert asyncio.run(chat()) == GEMMA


def test_ask_names_model_section_and_search_scale(address: str, tmp_path: Path) -> None:
    """ask --model: done names the model; each source shows its section and the score
    search gives the same chunk (one scale, in [0, 1])."""
    corpus = tmp_path / "kb"
    corpus.mkdir()
    (corpus / "web01.md").write_text(
        "# web01 runbook\n\n## Disk full\n\nWhen web01 reports No space left on device, "
        "rotate the nginx logs with logrotate -f /etc/logrotate.d/nginx.\n")
    assert llamad(address, "ingest", str(corpus), "--source", "kb").returncode == 0
    question = "web01 no space left on device nginx logs"
    result = llamad(address, "search", question, "--json", "--source", "kb")
    hits = {h["chunk_id"]: h for h in json.loads(result.stdout)["hits"]}
    result = llamad(address, "ask", question, "--model", GEMMA, "--source", "kb",
                    "--max-tokens", "8", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    sources = next(e for e in events if e["event"] == "sources")
    done = next(e for e in events if e["event"] == "done")
    assert done["model_name"] == GEMMA
    cited = sources["citations"][0]
    assert cited["heading"] and "Disk full" in cited["heading"]
    assert 0 < cited["score"] <= 1
    assert cited["score"] == pytest.approx(hits[cited["chunk_id"]]["score"])
    result = llamad(address, "ask", question, "--source", "kb", "--max-tokens", "4",
                    timeout=180)
    line = result.stdout.split("Sources:\n", 1)[1].splitlines()[0]
    assert line.startswith("[S1] web01 runbook: Disk full — ")  # not the title twice
    assert f"({cited['score']:.3f})" in line


def test_version_and_models_help(address: str) -> None:
    result = llamad(address, "--version")
    assert (result.returncode, result.stdout.strip()) == (
        0, f"llamad {metadata.version('llamad')}")
    result = llamad(address, "models", "--help")
    assert result.returncode == 0
    verbs = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")}
    assert {"ps", "load", "unload", "prepare", "list", "verify"} <= verbs


def _in_a_terminal(address: str, *args: str) -> Terminal:
    """Run ``llamad ARGS`` in a real terminal (a tmux session 160 columns wide)."""
    shown = in_tmux([*COMMAND, *args], cwd=ROOT, env={**os.environ, "LLAMAD_ADDRESS": address},
                    timeout=120)
    assert shown.status == 0, shown.screen
    return shown


def test_progress_in_a_real_terminal_not_with_json(address: str, tmp_path: Path) -> None:
    """In a real terminal (tmux): ingest's and reindex's bar (total counted here, rate,
    ETA), erased at the end with the final counts left on screen, ask's waiting line and
    a model load's elapsed time, both erased; with --json in the same terminal: none of
    it, only the JSON."""
    corpus = tmp_path / "many"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"note{i:02d}.md").write_text(f"# Note {i}\n\nhost web{i:02d} disk {i}\n")
    shown = _in_a_terminal(address, "ingest", str(corpus), "--source", "many")
    assert "many:" in shown.drawn and "/40" in shown.drawn and "files/s" in shown.drawn, \
        shown.drawn
    assert "many: 40 files: 40 added" in shown.screen  # the final counts
    assert "%|" not in shown.screen and "/40 [" not in shown.screen, shown.screen  # erased
    shown = _in_a_terminal(address, "reindex", "--source", "many")
    assert "/40" in shown.drawn and "files/s" in shown.drawn, shown.drawn
    assert "%|" not in shown.screen and "many: 40 files" in shown.screen, shown.screen
    shown = _in_a_terminal(address, "reindex", "--source", "many", "--json")
    assert "/40" not in shown.drawn and "files/s" not in shown.drawn
    lines = [line.strip() for line in shown.screen.splitlines() if line.startswith("{")]
    assert [json.loads(line)["source_id"] for line in lines] == ["many"]
    shown = _in_a_terminal(address, "ask", "disk of web07", "--source", "many",
                           "--max-tokens", "4")
    assert "searching the documents, then waiting for the model (" in shown.drawn
    assert "searching the documents" not in shown.screen  # erased once the answer starts
    shown = _in_a_terminal(address, "ask", "disk of web07", "--source", "many",
                           "--max-tokens", "4", "--json")
    assert "searching the documents" not in shown.drawn
    shown = _in_a_terminal(address, "models", "load", MINILM)
    assert f"loading {MINILM} (00:" in shown.drawn  # drawn from the start, each 0.5 s
    assert f"{MINILM}: ready" in shown.screen and "loading" not in shown.screen
    shown = _in_a_terminal(address, "models", "load", MINILM, "--json")
    assert "loading" not in shown.drawn and '"state"' in shown.screen
