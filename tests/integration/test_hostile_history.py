"""Hostile conversation history: secrets a user pasted into an Ask's earlier turns (a
password, an AWS key pair, a secret in the question and the attachment) are redacted before
the request reaches the generation endpoint, a recording OpenAI-compatible server behind a
real daemon, and appear in neither the search query, the audit record nor the daemon's log.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.support.daemon import Clients, config_env, make_daemon

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


# --- secrets in a conversation's history ----------------------------------------------------


async def test_secrets_in_ask_history_never_reach_the_generation_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ask with a password in a user turn and an AWS key pair in an assistant turn (and a
    secret in the question and the attachment), through a real daemon whose generation
    role is an endpoint — a recording OpenAI-compatible server on a loopback port: the
    chat request it received holds every turn with its secret redacted, and neither the
    request, the search query, the audit record nor the daemon's log holds any of the
    secrets."""
    # This section was appended to the module: its imports are its own.
    import json
    import string

    from tests.support.fake_openai import serve_fake_openai

    rng = random.Random(1805)

    def fake(alphabet: str, n: int) -> str:  # built at run time: no scanner flags a literal
        return "".join(rng.choice(alphabet) for _ in range(n - 2)) + "Q7"

    password = "hunter2x" + fake(string.ascii_letters, 12)
    aws_key = "AK" + "IA" + fake(string.ascii_uppercase, 16)
    aws_secret = fake(string.ascii_letters + string.digits + "/+", 40)
    question_key = "s" + "k-" + fake(string.ascii_letters + string.digits, 48)
    attachment_password = fake(string.ascii_letters + string.digits, 20)
    secrets = [password, aws_key, aws_secret, question_key, attachment_password]
    history = [
        apb.Turn(role=pb.CHAT_ROLE_USER,
                 content=f"Last week I logged in to db02 with password={password} and it "
                         "worked."),
        apb.Turn(role=pb.CHAT_ROLE_ASSISTANT,
                 content=f"Noted. The backup job uses aws_access_key_id = {aws_key}\n"
                         f"aws_secret_access_key = {aws_secret}\nfor the NAS sync."),
    ]
    with serve_fake_openai() as (url, seen):
        daemon = make_daemon(config_env(
            "llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
            LLAMAD_GENERATION_MODE="endpoint", LLAMAD_GENERATION_ENDPOINT_URL=url,
            LLAMAD_EMBEDDING_MODE="disabled",
            # One document in the index: its BM25 scores are small, but it is relevant.
            LLAMAD_ANSWER_MIN_TEXT_SCORE="0.01"))
        c = Clients(await daemon.start())
        queries: list[str] = []
        try:
            assert daemon.retriever is not None
            search = daemon.retriever.search

            async def recorded(query: str, **kw: Any) -> Any:  # what the indexes are asked
                queries.append(query)
                return await search(query, **kw)

            daemon.retriever.search = recorded  # type: ignore[method-assign]
            await c.wait_serving("generation", timeout=30)
            r = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
            await r.AddSource(rpb.AddSourceRequest(id="notes"))
            await r.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="notes", id="notes/web01", title="web01 disk full",
                text="When web01 reports no space left on device, rotate the nginx logs."))
            stub = answer_pb2_grpc.AnswerServiceStub(c.channel)
            events = [e async for e in stub.Ask(apb.AskRequest(
                question=f"Why is the web01 disk full? (my key is {question_key})",
                task=apb.TASK_TYPE_DIAGNOSE, history=history,
                attachment=("df -h\n/dev/sda1 100% /var\n"
                            f"export DB_PASSWORD={attachment_password}\n"),
                sampling=pb.SamplingParams(max_tokens=8)))]
        finally:
            await c.close()
            await daemon.shutdown()

    done = events[-1].done
    assert "".join(e.text for e in events if e.WhichOneof("event") == "text") == \
        "The answer is 42. "
    cited = [s for e in events if e.WhichOneof("event") == "sources"
             for s in e.sources.citations]
    assert [s.document_id for s in cited] == ["notes/web01"]
    asked = [body for path, body, _ in seen
             if path.endswith("/chat/completions") and "Last week" in json.dumps(body)]
    assert asked, [path for path, _, _ in seen]
    messages = asked[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == ("Last week I logged in to db02 with "
                                      "password=[REDACTED:password] and it worked.")
    assert "The backup job uses aws_access_key_id = [REDACTED:" in messages[2]["content"]
    assert "aws_secret_access_key = [REDACTED:" in messages[2]["content"]
    assert "web01 disk full" in messages[3]["content"]  # the source reached the prompt
    assert len(queries) == 1 and "Why is the web01 disk full?" in queries[0]
    wire = json.dumps(seen) + "\n".join(queries)
    audit = (tmp_path / "state" / "audit" / "answers.jsonl").read_text()
    assert json.loads(audit.splitlines()[-1])["prompt_sha256"] == done.prompt_sha256
    logged = capsys.readouterr()
    for secret in secrets:
        assert secret not in wire, secret
        assert secret not in audit, secret
        assert secret not in logged.out + logged.err, secret
