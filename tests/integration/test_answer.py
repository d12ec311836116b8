"""Ask end to end: real daemon, real generation and embedding children, a runbook corpus
written for the test, real clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from daemon import Daemon
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1.wire import STATUS_DETAILS_KEY
from tests.support.corpus import index_corpus, write_corpus
from tests.support.daemon import Clients, config_env, serving

pytestmark = pytest.mark.integration


class Asked:
    def __init__(self, events: list[apb.AskResponse]) -> None:
        self.text = "".join(e.text for e in events if e.WhichOneof("event") == "text")
        self.texts = [e for e in events if e.WhichOneof("event") == "text"]
        self.sources = next(e.sources for e in events if e.WhichOneof("event") == "sources")
        self.done = next(e.done for e in events if e.WhichOneof("event") == "done")
        self.order = [e.WhichOneof("event") for e in events]


@pytest.fixture
async def ready(tmp_path: Path, llama_server: str
                ) -> AsyncIterator[tuple[Daemon, Clients, answer_pb2_grpc.AnswerServiceStub]]:
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    async with serving(config_env("llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
                                  LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path))) as (daemon, c):
        await index_corpus(c, corpus)
        yield daemon, c, answer_pb2_grpc.AnswerServiceStub(c.channel)


async def ask(stub: answer_pb2_grpc.AnswerServiceStub, question: str, **kw: object) -> Asked:
    request = apb.AskRequest(question=question, sampling=ipb.SamplingParams(max_tokens=48),
                             **kw)  # type: ignore[arg-type]
    return Asked([e async for e in stub.Ask(request)])


async def test_answer_streams_and_cites_the_runbook_first(ready) -> None:  # type: ignore[no-untyped-def]
    """The answer streams; the sources cite the only runbook that has it, first; the audit
    log records the prompt hash and hits; the re-ask is a cache hit."""
    daemon, _, stub = ready
    first = await ask(stub, "How do I fix a full disk on web01?")
    assert len(first.texts) > 3  # streamed
    assert first.order.index("sources") > first.order.index("text")
    assert first.order[-1] == "done"
    assert first.sources.citations[0].document_id == "docs/runbooks/web01.md"
    assert first.sources.citations[0].label == "S1"
    assert first.sources.retrieval_mode == rpb.SEARCH_MODE_HYBRID
    assert first.done.usage.completion_tokens > 0
    # the speed is measured (tokens over first to last token), not left at 0
    assert 0 < first.done.usage.tokens_per_second < 10_000
    assert len(first.done.prompt_sha256) == 64
    assert not first.done.cached
    assert first.done.template_version.startswith("system/2+answer/1")
    again = await ask(stub, "How do I fix a full disk on web01?")
    assert again.done.cached
    assert again.done.usage.tokens_per_second == 0  # nothing generated
    assert again.text == first.text
    assert again.done.prompt_sha256 == first.done.prompt_sha256
    audit = daemon.config.state_dir / "audit" / "answers.jsonl"
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert records[-2]["prompt_sha256"] == first.done.prompt_sha256
    assert records[-2]["hits"][0]["chunk_id"].startswith("docs/runbooks/web01.md#")
    assert records[-1]["cached"] is True


async def test_nothing_relevant_says_so_without_generating(ready) -> None:  # type: ignore[no-untyped-def]
    """A question the knowledge base cannot answer gets the 'nothing on it' answer, no
    sources, and no generation."""
    _, _, stub = ready
    result = await ask(stub, "zxqv quantum banana tariff schedule for 1873")
    assert result.done.no_context
    assert list(result.sources.citations) == []
    assert "nothing on this" in result.text
    assert result.done.usage.completion_tokens == 0


async def test_secrets_in_attachment_never_reach_the_prompt(ready) -> None:  # type: ignore[no-untyped-def]
    """An attachment with a credential is redacted before prompt assembly (the prompt hash
    equals the one for the already-redacted attachment)."""
    _, _, stub = ready
    secret = "s3cr3t-" + "Z" * 12
    raw = await ask(stub, "Why is web01 disk full?", task=apb.TASK_TYPE_DIAGNOSE,
                    attachment=f"df -h\n/dev/sda1 100% /var\nexport DB_PASSWORD={secret}\n",
                    no_cache=True)
    pre = await ask(stub, "Why is web01 disk full?", task=apb.TASK_TYPE_DIAGNOSE,
                    attachment="df -h\n/dev/sda1 100% /var\n"
                               "export DB_PASSWORD=[REDACTED:password]\n", no_cache=True)
    assert raw.done.prompt_sha256 == pre.done.prompt_sha256
    assert secret not in raw.text


async def test_oversized_attachment_is_clipped_and_sources_dropped(ready) -> None:  # type: ignore[no-untyped-def]
    """Over budget: sources go first, then the attachment is clipped head-and-tail."""
    _, _, stub = ready
    log = "\n".join(f"line {i}: kernel: EXT4-fs error (device sda1) block {i}"
                    for i in range(1500))
    result = await ask(stub, "What do these errors mean?", task=apb.TASK_TYPE_EXPLAIN_OUTPUT,
                       attachment=log)
    assert result.done.attachment_clipped
    assert result.done.usage.prompt_tokens <= 2048


async def test_ask_degrades_and_fails_clearly(ready) -> None:  # type: ignore[no-untyped-def]
    """Embedding child down: BM25-only and said so. Generation down: UNAVAILABLE + hint."""
    daemon, _, stub = ready
    await daemon.children["embedding"].supervisor.stop()
    result = await ask(stub, "How do I renew the TLS certificate on web01?", no_cache=True)
    assert result.sources.retrieval_mode == rpb.SEARCH_MODE_TEXT
    assert any("BM25-only" in w for w in result.sources.warnings)
    assert result.sources.citations[0].document_id == "docs/runbooks/web01.md"
    await daemon.children["generation"].supervisor.stop()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ask(stub, "anything")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ask(stub, "")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The field at fault is in a BadRequest detail, not to be read off the message.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ask(stub, "why?", history=[apb.Turn(role=ipb.CHAT_ROLE_USER, content="a")] * 11)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("11 history turns")
    assert bad_request_fields(err.value) == ["history"]


def bad_request_fields(error: grpc.aio.AioRpcError) -> list[str]:
    """The fields of the google.rpc.BadRequest detail in an error's status."""
    details = dict(error.trailing_metadata() or ())[STATUS_DETAILS_KEY]
    assert isinstance(details, bytes)
    fields = []
    for detail in status_pb2.Status.FromString(details).details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            fields += [v.field for v in bad.field_violations]
    return fields


async def test_an_ask_under_way_when_the_drain_begins_finishes(ready) -> None:  # type: ignore[no-untyped-def]
    """A shutdown that begins while an Ask retrieves lets it generate and finish (the
    drain's promise); a new Ask is refused with UNAVAILABLE."""
    daemon, _, stub = ready
    assert daemon.retriever is not None
    search = daemon.retriever.search

    async def search_then_drain(*args: object, **kw: object) -> object:
        result = await search(*args, **kw)
        daemon.router.draining = True  # what Daemon.drain sets first
        return result

    daemon.retriever.search = search_then_drain
    try:
        asked = await ask(stub, "Which command rotates the nginx logs on web01?")
        assert asked.order[-1] == "done"
        assert asked.done.usage.completion_tokens > 0 and not asked.done.cached
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ask(stub, "What about the database?")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (err.value.details() or "")
    finally:
        daemon.retriever.search = search
        daemon.router.draining = False


async def test_ask_naming_a_model_is_answered_by_it(ready) -> None:  # type: ignore[no-untyped-def]
    """AskRequest.model (issue 14): a catalog model that is not resident is loaded and
    generates the answer; an unknown name is NOT_FOUND, an embedding model
    INVALID_ARGUMENT."""
    daemon, _, stub = ready
    gemma = "gemma-3-270m-q4_k_m"
    assert daemon.pool.model(gemma) is None
    answered = await ask(stub, "How do I fix a full disk on web01?", model=gemma)
    assert answered.done.usage.completion_tokens > 0
    model = daemon.pool.model(gemma)
    assert model is not None and daemon.pool.is_resident(gemma)
    assert model.admission.served_by(model.serving_pid) > 0
    for name, code in (("nope", grpc.StatusCode.NOT_FOUND),
                       ("all-MiniLM-L6-v2-f16", grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ask(stub, "How do I fix a full disk on web01?", model=name)
        assert refused.value.code() is code
