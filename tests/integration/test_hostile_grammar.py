"""Issue 25's hostile grammar and deep schemas against real llama-server children
(SmolLM2-135M): refused before the child (INVALID_ARGUMENT on gRPC, 400 on the HTTP API,
naming the field and why) while a bystander's chat on the other slot is served; a call
whose deadline passes mid-generation frees its slot at once; a child stuck inside one
token (a costly grammar let through by raising limits.max_grammar_walks) is replaced
after recycle.cancel_grace, make-before-break, and counted."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
import pytest_asyncio

from daemon import Daemon
from llamad_protocol.v1 import common_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import SMALL_MODEL, model_path
from tests.support.child_http import generation_idle
from tests.support.daemon import Clients, config_env, make_daemon, serving
from tests.support.endless import never_end
from tests.support.hostile import deep_schema

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GEN = common_pb2.CHILD_ROLE_GENERATION
READ = "read-token-0123456789abcdef"
HOSTILE = "root ::= ([a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* )+"
# Refused only by the walk count (8 ways to read each letter): 10-11 s for one token's
# mask on SmolLM2's vocabulary, with llama.cpp's sampler in-process.
# Eight ways to read each letter cost SmolLM2's child 10-11 s for one token here (8^L
# parses of an L-letter token); sixteen ways cost 2^L times that (thousands of times for
# its longer tokens), so the child is still inside that token long after the 3 s deadline
# and the 3 s grace on any machine, not only on one as slow as this one.
AMBIGUOUS = "root ::= (" + " | ".join(["[a-z]"] * 16) + ")+"
COUNT = "Count from 1 to 1000: 1, 2, 3, 4, 5,"


def _chat(text: str, **sampling: object) -> pb.ChatRequest:
    return pb.ChatRequest(messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=text)],
                          sampling=pb.SamplingParams(**sampling))  # type: ignore[arg-type]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two_slots(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                    ) -> AsyncIterator[tuple[Daemon, Clients]]:
    """A daemon with a 2-slot generation child, the HTTP API and a read token."""
    state = tmp_path_factory.mktemp("state")
    tokens = state / "tokens"
    tokens.write_text(f"read {READ}\n")
    tokens.chmod(0o600)
    env = config_env("llama-server", LLAMAD_STATE_DIR=str(state),
                     LLAMAD_EMBEDDING_MODE="disabled", LLAMAD_HTTP_LISTEN="127.0.0.1:0",
                     LLAMAD_AUTH_TOKEN_FILE=str(tokens))
    async with serving(env, "generation") as (daemon, clients):
        yield daemon, clients


def _md() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {READ}"),)


async def test_hostile_grammar_is_refused_and_the_bystander_is_served(
        two_slots: tuple[Daemon, Clients]) -> None:
    """The issue's grammar (and an ambiguous one), sent again and again on gRPC and HTTP,
    is INVALID_ARGUMENT / 400 naming the grammar and why, at once; a 4-token chat on the
    other slot meanwhile finishes well within the 60 s the issue's bystander timed out at."""
    daemon, c = two_slots
    url = f"http://127.0.0.1:{daemon.http_port}/v1/chat/completions"

    async def bystander() -> float:
        started = time.monotonic()
        out = [m async for m in c.inference.Chat(_chat("Say hello.", max_tokens=4),
                                                 metadata=_md(), timeout=60)]
        assert out[-1].usage.completion_tokens >= 1
        return time.monotonic() - started

    async def hostile() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            for grammar, why in ((HOSTILE, "can match the empty string"),
                                 (AMBIGUOUS, "too ambiguous")) * 3:
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    _ = [m async for m in c.inference.Chat(
                        _chat("hi", max_tokens=8, grammar=grammar), metadata=_md(),
                        timeout=30)]
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "sampling.grammar" in str(err.value.details())
                assert why in str(err.value.details())
                answer = await http.post(url, headers={"Authorization": f"Bearer {READ}"},
                                         json={"model": SMALL_MODEL, "max_tokens": 8,
                                               "grammar": grammar,
                                               "messages": [{"role": "user",
                                                             "content": "hi"}]})
                assert answer.status_code == 400, answer.text
                assert "grammar" in answer.json()["error"]["message"]
                assert time.monotonic() - started < 5  # refused before any child work

    seconds, _ = await asyncio.gather(bystander(), hostile())
    assert seconds < 20


async def test_deep_schemas_are_invalid_argument(two_slots: tuple[Daemon, Clients]) -> None:
    """A schema 300 levels deep is INVALID_ARGUMENT (it was INTERNAL) on gRPC, and 400 on
    the HTTP API for response_format and for a tool's parameters, naming the field."""
    daemon, c = two_slots
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in c.inference.Chat(pb.ChatRequest(
            messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hi")],
            sampling=pb.SamplingParams(max_tokens=4, response_format=pb.ResponseFormat(
                type=pb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
                json_schema=json.dumps(deep_schema(300))))), metadata=_md(), timeout=30)]
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling.response_format.json_schema nests deeper than 64 levels" in str(
        err.value.details())
    url = f"http://127.0.0.1:{daemon.http_port}/v1/chat/completions"
    base = {"model": SMALL_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        fmt = await http.post(url, headers={"Authorization": f"Bearer {READ}"}, json={
            **base, "response_format": {"type": "json_schema", "json_schema": {
                "name": "deep", "schema": deep_schema(300)}}})
        tool = await http.post(url, headers={"Authorization": f"Bearer {READ}"}, json={
            **base, "tools": [{"type": "function", "function": {
                "name": "f", "parameters": deep_schema(300)}}]})
    assert fmt.status_code == 400, fmt.text
    assert fmt.json()["error"]["param"] == "response_format.json_schema"
    assert "nests deeper than 64" in fmt.json()["error"]["message"]
    assert tool.status_code == 400, tool.text
    assert tool.json()["error"]["param"] == "tools[0].function.parameters"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def one_slot(llama_server: str) -> AsyncIterator[tuple[Daemon, Clients]]:
    """A daemon with a 1-slot generation child that lets costly grammars through (to make
    a stuck child) and replaces a child 3 s after a cancel it did not take."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_MODE="disabled",
                     LLAMAD_GENERATION_PARALLEL="1", LLAMAD_CHILD_SLOTS="true",
                     LLAMAD_LIMITS_MAX_GRAMMAR_WALKS=str(10**18),
                     LLAMAD_RECYCLE_CANCEL_GRACE="3", LLAMAD_SWAP_DRAIN_TIMEOUT="2",
                     # The cancel watch's path alone: with token probes a stuck child that a
                     # call waits on is taken out of service first (issue 28, tested in
                     # test_outcomes_real.py).
                     LLAMAD_CHILD_TOKEN_PROBE_TIMEOUT="0")
    daemon = make_daemon(env)
    clients = Clients(await daemon.start())
    try:
        await clients.wait_serving("generation")
        yield daemon, clients
    finally:
        await clients.close()
        await daemon.shutdown()


async def test_a_deadline_mid_generation_frees_the_slot(
        one_slot: tuple[Daemon, Clients]) -> None:
    """A generation that cannot end (end tokens banned, 3000 tokens) whose 2 s deadline
    passes stops in the child: its one slot is idle at once, and the next call is served
    promptly; the child is not replaced (it took the cancel)."""
    daemon, c = one_slot
    sup = daemon.children["generation"].supervisor
    pid = sup.pid
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt=COUNT, sampling=pb.SamplingParams(
                max_tokens=3000, logit_bias=never_end(model_path(SMALL_MODEL)))), timeout=2)]
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert await generation_idle(sup.socket, pid, timeout=10), "the child kept generating"
    started = time.monotonic()
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)), timeout=30)]
    assert out[-1].usage.completion_tokens >= 1
    assert time.monotonic() - started < 20
    await asyncio.sleep(4)  # past the grace: the watch saw the loop answer
    assert sup.pid == pid
    assert daemon.metrics.registry.get_sample_value(
        "llamad_stuck_replacements_total", {"role": "generation"}) == 0


async def test_a_child_stuck_in_one_token_is_replaced(one_slot: tuple[Daemon, Clients]) -> None:
    """A call whose grammar costs hours per token is cancelled by its 3 s deadline; the
    child cannot take the cancel (its loop is inside that token), so 3 s later a new child
    is started beside it and takes over, the stuck one is stopped, the replacement is
    counted, and calls are served again."""
    daemon, c = one_slot
    pid = daemon.children["generation"].supervisor.pid
    with pytest.raises(grpc.aio.AioRpcError) as err:
        # llama.cpp checks the sampled token against the grammar first and applies the
        # grammar to the whole vocabulary only when it is refused: a "." made certain is.
        _ = [m async for m in c.inference.Chat(_chat(
            "hi", max_tokens=16, grammar=AMBIGUOUS,
            logit_bias=[pb.LogitBias(text=".", bias=100.0)]), timeout=3)]
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 120
    while (status := await c.child(GEN)).pid in (0, pid):
        assert time.monotonic() < deadline, "the stuck child was never replaced"
        await asyncio.sleep(0.2)
    assert "stuck" in status.last_swap.reason
    assert daemon.metrics.registry.get_sample_value(
        "llamad_stuck_replacements_total", {"role": "generation"}) == 1
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)), timeout=60)]
    assert out[-1].usage.completion_tokens >= 1
    deadline = time.monotonic() + 30
    while True:  # the stuck process is stopped (SIGKILL after the stop grace) and reaped
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the stuck child was left running"
        await asyncio.sleep(0.2)
