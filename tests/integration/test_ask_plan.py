"""Ask as operators run it (issue 30), against one real daemon (real llama-server
generation and embedding children, real gRPC and HTTP clients): one source per document,
an over-long conversation trimmed instead of refused, the dry run over gRPC and HTTP,
and an operator's template directory, checked again on reload.

Generations are short (max_tokens 16) and nothing here depends on how fast the model is.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import string
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from daemon import Daemon
from daemon.config import load
from daemon.config.answer_templates import load_templates
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from tests.conftest import ROOT
from tests.support.corpus import index_corpus, write_corpus
from tests.support.daemon import config_env, served

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

# A runbook long enough for several chunks (the default chunk is 1,200 characters), each
# about the same thing, so one question retrieves more than one chunk of it.
_SECTIONS = [
    ("Symptoms", "Replication lag on db01 shows as the replica db02 falling behind the "
                 "primary db01; pg_stat_replication on db01 reports a growing replay_lag."),
    ("Check the network", "Replication lag on db01 is often the network: check the link "
                          "between db01 and db02 with iperf3 and look for retransmits."),
    ("Check the replica's disk", "Replication lag on db01 can be the replica's disk: run "
                                 "iostat -x 1 on db02 and look at await on the WAL volume."),
    ("Fix", "To fix replication lag on db01, pause the nightly vacuum on db02, then "
            "restart the walreceiver with pg_ctl reload, and watch replay_lag fall."),
]
DB01 = "# db01 replication\n\n" + "\n\n".join(
    f"## {title}\n\n" + (body + " ") * 9 for title, body in _SECTIONS)
PREAMBLE = "You answer for the ACME operators, ZEBRA-PREAMBLE. Answer only from the sources."
NO_CONTEXT = "ACME's runbooks have nothing on: {question}"


class Asked:
    def __init__(self, events: list[apb.AskResponse]) -> None:
        kinds = [e.WhichOneof("event") for e in events]
        self.order = kinds
        self.text = "".join(e.text for e in events if e.WhichOneof("event") == "text")
        self.plan = next((e.plan for e in events if e.WhichOneof("event") == "plan"), None)
        self.sources = next(e.sources for e in events if e.WhichOneof("event") == "sources")
        self.done = next(e.done for e in events if e.WhichOneof("event") == "done")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[tuple[Daemon, answer_pb2_grpc.AnswerServiceStub, Path]]:
    """One daemon whose answer templates come from an operator directory (re-read on
    reload), with the test corpus and the long db01 runbook indexed; 1-token probes off."""
    root = tmp_path_factory.mktemp("ask")
    corpus, templates = root / "corpus", root / "templates"
    write_corpus(corpus)
    (corpus / "runbooks" / "db01.md").write_text(DB01)
    templates.mkdir()
    (templates / "system.txt").write_text(PREAMBLE + "\n")
    (templates / "no_context.txt").write_text(NO_CONTEXT + "\n")
    env = config_env("llama-server", LLAMAD_STATE_DIR=str(root / "state"),
                     LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(root),
                     LLAMAD_HTTP_LISTEN="127.0.0.1:0",
                     LLAMAD_ANSWER_TEMPLATES_DIR=str(templates))
    daemon = Daemon(load(None, env=env), reload=lambda: load(None, env=env))
    async with served(daemon) as c:
        await index_corpus(c, corpus)
        yield daemon, answer_pb2_grpc.AnswerServiceStub(c.channel), templates


async def ask(stub: answer_pb2_grpc.AnswerServiceStub, question: str, *,
              max_tokens: int = 16, **kw: Any) -> Asked:
    request = apb.AskRequest(question=question,
                             sampling=ipb.SamplingParams(max_tokens=max_tokens), **kw)
    return Asked([e async for e in stub.Ask(request)])


QUESTION = "How do I fix replication lag on db01?"


async def test_a_document_is_one_source_with_its_chunks(running) -> None:  # type: ignore[no-untyped-def]
    """Several chunks of db01.md retrieved: one citation for it, holding every chunk id in
    document order; no document is cited twice; the prompt fences it once."""
    _, stub, _ = running
    plan = await ask(stub, QUESTION, top_k=8, dry_run=True)
    assert plan.plan is not None
    kept = [h for h in plan.plan.hits if h.verdict == apb.HIT_VERDICT_KEPT]
    db01 = [h for h in kept if h.document_id == "docs/runbooks/db01.md"]
    assert len(db01) >= 2, [(h.chunk_id, h.verdict) for h in plan.plan.hits]
    assert len({h.label for h in db01}) == 1  # one label for all of its chunks
    documents = [c.document_id for c in plan.sources.citations]
    assert len(documents) == len(set(documents))
    cited = next(c for c in plan.sources.citations
                 if c.document_id == "docs/runbooks/db01.md")
    assert cited.label == db01[0].label
    assert sorted(cited.chunk_ids) == sorted(h.chunk_id for h in db01)
    ordinals = {h.chunk_id: h.ordinal for h in db01}
    assert [ordinals[i] for i in cited.chunk_ids] == sorted(ordinals.values())
    assert cited.chunk_id in cited.chunk_ids
    user = plan.plan.sections[-1].content
    assert user.count(f'<source label="{cited.label}"') == 1
    # The answer itself cites the same way (a real generation, 16 tokens).
    answered = await ask(stub, QUESTION, top_k=8)
    assert [c.document_id for c in answered.sources.citations] == documents
    assert answered.done.usage.completion_tokens > 0


async def test_the_dry_run_shows_hits_budget_and_prompt_without_generating(running) -> None:  # type: ignore[no-untyped-def]
    """A plan (every hit with its verdict, the sections redacted, the tokens), the sources
    and done, no text; a tight budget leaves chunks over_budget; hits under the floor are
    said; the answer cache is untouched (the real Ask after it generates)."""
    daemon, stub, _ = running
    rng = random.Random(30)
    secret = "DB_PASSWORD=" + "".join(rng.choice(string.ascii_letters + string.digits)
                                      for _ in range(18)) + "Q7"
    question = f"{QUESTION} (our config has {secret})"
    plan = await ask(stub, question, top_k=10, dry_run=True)
    assert plan.order == ["plan", "sources", "done"]
    assert plan.text == "" and plan.done.dry_run
    assert plan.done.usage.completion_tokens == 0
    assert plan.plan is not None and plan.plan.prompt_tokens == plan.done.usage.prompt_tokens
    assert 0 < plan.plan.prompt_tokens <= plan.plan.budget
    assert [s.role for s in plan.plan.sections] == [ipb.CHAT_ROLE_SYSTEM, ipb.CHAT_ROLE_USER]
    assert sum(s.tokens for s in plan.plan.sections) < plan.plan.prompt_tokens
    assert all(secret[12:] not in s.content for s in plan.plan.sections)
    assert "[REDACTED:" in plan.plan.sections[-1].content
    settings = daemon.config.settings.answer
    for h in plan.plan.hits:
        floor = ((h.HasField("vector_score") and h.vector_score >= settings.min_vector_score)
                 or (h.HasField("text_score") and h.text_score >= settings.min_text_score))
        assert (h.verdict == apb.HIT_VERDICT_BELOW_FLOOR) == (not floor), h
    # A budget one token short of that prompt: the lowest-ranked chunk goes.
    context = plan.plan.budget + 16
    tight = await ask(stub, question, top_k=10, dry_run=True,
                      max_tokens=context - plan.plan.prompt_tokens + 1)
    assert tight.plan is not None
    over = [h for h in tight.plan.hits if h.verdict == apb.HIT_VERDICT_OVER_BUDGET]
    assert len(over) == tight.done.chunks_dropped >= 1
    assert tight.plan.prompt_tokens <= tight.plan.budget < plan.plan.prompt_tokens
    # Nothing was generated, so nothing was cached: the real Ask generates.
    real = await ask(stub, question, top_k=10)
    assert not real.done.cached and real.done.usage.completion_tokens > 0
    assert real.done.prompt_sha256 == plan.done.prompt_sha256
    audit = daemon.config.state_dir / "audit" / "answers.jsonl"
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r.get("dry_run", False) for r in records[-3:]] == [True, True, False]


async def test_the_dry_run_over_http(running) -> None:  # type: ignore[no-untyped-def]
    daemon, _, _ = running
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{daemon.http_port}",
                                 trust_env=False, timeout=120) as http:
        whole = await http.post("/v1/llamad/ask", json={
            "question": QUESTION, "top_k": 8, "dry_run": True, "sampling": {"max_tokens": 16}})
        assert whole.status_code == 200, whole.text
        body = whole.json()
        assert body["text"] == "" and body["done"]["dry_run"] is True
        verdicts = {h["verdict"] for h in body["plan"]["hits"]}
        assert "HIT_VERDICT_KEPT" in verdicts
        assert [s["role"] for s in body["plan"]["sections"]] == ["CHAT_ROLE_SYSTEM",
                                                                 "CHAT_ROLE_USER"]
        assert body["plan"]["prompt_tokens"] == body["done"]["usage"]["prompt_tokens"]
        streamed = await http.post("/v1/llamad/ask", json={
            "question": QUESTION, "dryRun": True, "stream": True})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: {")]
        assert [next(iter(e)) for e in events] == ["plan", "sources", "done"]
        refused = await http.post("/v1/llamad/ask", json={"question": "q", "dry_run": "yes"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "dry_run"


async def llamad(address: str, *args: str) -> tuple[int, str, str]:
    """The ``llamad`` CLI run as a subprocess (the event loop keeps serving meanwhile)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", *args, cwd=ROOT,
        env={**os.environ, "LLAMAD_ADDRESS": address}, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_dry_run_from_the_command_line(running) -> None:  # type: ignore[no-untyped-def]
    """``llamad ask --dry-run``: the hits with their verdicts, the prompt's tokens and
    sections, the sources; no answer. ``--json`` gives the plan event."""
    daemon, _, _ = running
    code, out, err = await llamad(daemon.address, "ask", QUESTION, "--dry-run", "--top-k", "8")
    assert code == 0, err
    assert out.startswith("Hits (rank order):\n")
    assert re.search(r"^  S1 +kept +[01]\.\d{3}  docs/runbooks/db01\.md#", out, re.M), out
    assert re.search(r"^Prompt: \d+ tokens of a \d+-token budget, templates system/", out,
                     re.M)
    assert "--- system (" in out and PREAMBLE in out and "--- user (" in out
    assert "\nSources:\n[S1] " in out
    code, out, err = await llamad(daemon.address, "ask", QUESTION, "--dry-run", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in events] == ["plan", "sources", "done"]
    assert events[0]["hits"][0]["verdict"] in ("kept", "below_floor", "over_budget")
    assert events[-1]["dry_run"] is True


async def test_an_over_long_conversation_is_trimmed_not_refused(running) -> None:  # type: ignore[no-untyped-def]
    """Ten turns of 3,000 characters each are several times the 2,048-token context: the
    oldest go, the answer says so, and it is answered; only a question that cannot fit
    with its own answer is OUT_OF_RANGE."""
    _, stub, _ = running
    rng = random.Random(7)
    words = ["disk", "nginx", "web01", "rotate", "certbot", "uplink", "logs", "vacuum"]
    history = [apb.Turn(role=(ipb.CHAT_ROLE_USER, ipb.CHAT_ROLE_ASSISTANT)[i % 2],
                        content=f"turn {i}: " + " ".join(rng.choice(words) for _ in range(500)))
               for i in range(10)]
    answered = await ask(stub, "How do I fix a full disk on web01?", history=history)
    assert answered.done.history_turns_dropped >= 5
    assert any("conversation was trimmed" in w for w in answered.sources.warnings)
    assert answered.done.usage.completion_tokens > 0
    assert answered.done.usage.prompt_tokens <= 2048
    planned = await ask(stub, "How do I fix a full disk on web01?", history=history,
                        dry_run=True)
    assert planned.plan is not None
    kept = planned.plan.sections[1:-1]  # the turns left, between system and question
    assert kept and kept[-1].content.startswith("turn 9:")  # the newest stayed
    context = planned.plan.budget + 16  # the budget is the context less max_tokens
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await ask(stub, "How do I fix a full disk on web01 when the nginx logs fill /var? "
                  * 50, max_tokens=context - 200)
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE


async def test_operator_templates_are_used_versioned_and_checked_on_reload(running) -> None:  # type: ignore[no-untyped-def]
    """The operator's preamble is the system prompt, its no-context answer answers, the
    set's hash versions the answer and the audit record; a reload with a template
    lacking {question} is refused naming it and changes nothing; a good one applies."""
    daemon, stub, templates = running
    expected = load_templates(str(templates)).sha256
    plan = await ask(stub, QUESTION, dry_run=True)
    assert plan.plan is not None
    assert plan.plan.sections[0].content == PREAMBLE
    assert plan.done.template_version.endswith("@" + expected[:12])
    nothing = await ask(stub, "zxqv quantum banana tariff schedule for 1873")
    assert nothing.done.no_context
    assert nothing.text == NO_CONTEXT.format(
        question="zxqv quantum banana tariff schedule for 1873")
    audit = daemon.config.state_dir / "audit" / "answers.jsonl"
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert records[-1]["template_set"] == records[-2]["template_set"] == expected

    (templates / "answer.txt").write_text("Sources:\n{sources}\nAnswer briefly.\n")
    report = await daemon.reload()
    assert "{question}" in report.error
    assert "answer.txt" in report.error
    still = await ask(stub, QUESTION, dry_run=True)
    assert still.done.template_version == plan.done.template_version

    (templates / "answer.txt").write_text("Sources:\n{sources}\nOPERATOR-ASK: {question}\n")
    report = await daemon.reload()
    assert report.error == "", report.error
    now = await ask(stub, QUESTION, dry_run=True)
    assert now.plan is not None
    assert now.plan.sections[-1].content.endswith(f"OPERATOR-ASK: {QUESTION}")
    assert now.done.template_version.endswith(
        "@" + load_templates(str(templates)).sha256[:12])
    assert now.done.template_version != plan.done.template_version
