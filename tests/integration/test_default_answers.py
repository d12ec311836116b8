"""The default experience: `llamad serve` on the prepared default generation model, with
the configured Chat and Ask sampling defaults (no sampling set by the caller), answers
without degenerate repetition; and the chat template the real child formats with."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon import Daemon
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, control_pb2
from llamad_protocol.v1 import common_pb2 as cpb
from llamad_protocol.v1 import inference_pb2 as ipb
from tests.conftest import model_path, models_dir
from tests.support.child_http import child_http
from tests.support.corpus import index_corpus, write_corpus
from tests.support.daemon import Clients, config_env, serving
from tests.support.repetition import degenerate

pytestmark = pytest.mark.integration

GEMMA = "gemma-3-270m-q4_k_m.gguf"

ASK = ("How do I fix a full disk on web01?", "What do I check when db02 lags behind?",
       "How do I renew the TLS certificate on web01?")
CHAT = ("In one sentence, how do I restart nginx?", "What does df -h show?",
        "How do I see the last 50 lines of a log file?")


@pytest.fixture
async def default_model(tmp_path: Path, llama_server: str
                        ) -> AsyncIterator[tuple[Daemon, Clients]]:
    """A daemon on the models directory's default generation model, a runbook corpus
    indexed."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    env = config_env("llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
                     LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path),
                     LLAMAD_MODELS_DIR=str(models_dir()), LLAMAD_GENERATION_PARALLEL="1")
    del env["LLAMAD_GENERATION_MODEL"]
    async with serving(env) as (daemon, c):
        await index_corpus(c, corpus)
        yield daemon, c


async def generation_child(c: Clients) -> tuple[str, int]:
    """The generation child's socket and pid."""
    status = await c.control.Status(control_pb2.StatusRequest())
    child = next(ch for ch in status.children if ch.role == cpb.CHILD_ROLE_GENERATION)
    return child.socket, child.pid


async def test_chat_and_ask_on_the_default_model_do_not_degenerate(default_model) -> None:  # type: ignore[no-untyped-def]
    """With only max_tokens and a seed set (the configured temperature and repetition
    guard doing the rest; the seed makes the sampled answers reproducible), no Ask or Chat
    answer repeats a line more than twice, a phrase more than 4 times or a character more
    than 24 times; each answer says something."""
    _, c = default_model
    stub = answer_pb2_grpc.AnswerServiceStub(c.channel)
    sampling = ipb.SamplingParams(max_tokens=256, seed=7)
    for question in ASK:
        events = [e async for e in stub.Ask(apb.AskRequest(question=question,
                                                          sampling=sampling))]
        text = "".join(e.text for e in events if e.WhichOneof("event") == "text")
        assert text.strip(), question
        assert degenerate(text) == [], (question, text)
    for question in CHAT:
        request = ipb.ChatRequest(messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER,
                                                            content=question)],
                                  sampling=sampling)
        text = "".join([m.text async for m in c.inference.Chat(request)])
        assert text.strip(), question
        assert degenerate(text) == [], (question, text)


async def test_a_gemma_without_a_template_is_formatted_in_gemmas_turns(
        tmp_path: Path, llama_server: str) -> None:
    """gemma-3-270m's GGUF has no chat template: its real child renders a conversation in
    Gemma's turn format (llamad's known template), not ChatML and not the bare name of a
    template; the system message opens the user's turn."""
    env = config_env("llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
                     LLAMAD_GENERATION_MODEL=str(model_path(GEMMA)),
                     LLAMAD_EMBEDDING_ENABLED="false", LLAMAD_GENERATION_PARALLEL="1")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "How do I restart nginx?"}]
    async with serving(env, "generation") as (_, c):
        http = child_http(*await generation_child(c))
        async with http:
            prompt = (await http.post("/apply-template", json={"messages": messages})
                      ).json()["prompt"]
    assert prompt == ("<start_of_turn>user\nBe brief.\n\nHow do I restart nginx?"
                      "<end_of_turn>\n<start_of_turn>model\n")
