"""Streams on kept connections to a real llama-server child (issue 27): the daemon reuses
its UNIX connection to the child after a stream read to its end, so every later call
must still get exactly its own answer, and a stream cancelled mid-way must still stop the
child's generation (its connection is closed, never reused: that close is how llama.cpp
learns nobody reads). The reuse itself is proven against a real server in
tests/unit/test_loopback_keepalive.py."""

from __future__ import annotations

import pytest

from llamad_protocol.v1 import inference_pb2 as pb
from tests.support.abandoned import abandon_a_long_generation
from tests.support.child_http import generation_idle
from tests.support.daemon import GEN, Clients, config_env, serving

pytestmark = pytest.mark.integration


async def chat(c: Clients) -> tuple[str, int, int]:
    """A greedy 8-token chat: its text and usage."""
    msgs = [m async for m in c.inference.Chat(pb.ChatRequest(
        messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="Count from one to ten.")],
        sampling=pb.SamplingParams(max_tokens=8, temperature=0.0)), timeout=60)]
    last = msgs[-1]
    return ("".join(m.text for m in msgs), last.usage.prompt_tokens,
            last.usage.completion_tokens)


async def test_kept_connections_carry_exact_answers_and_a_cancel_still_stops_the_child(
        llama_server: str) -> None:
    env = config_env("llama-server", LLAMAD_CHILD_SLOTS="true",
                     LLAMAD_EMBEDDING_ENABLED="false")
    async with serving(env, "generation") as (_, c):
        first = await chat(c)
        assert first[0] and first[2] == 8
        for _ in range(3):  # each on the connection the one before gave back
            assert await chat(c) == first

        await abandon_a_long_generation(c)
        gen = await c.child(GEN)
        assert await generation_idle(gen.socket, gen.pid, timeout=10), "the child kept generating"

        for _ in range(2):  # nothing of the cancelled stream reaches a later call
            assert await chat(c) == first
