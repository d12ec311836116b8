"""Generation controls on a real llama-server child (SmolLM2-135M), through the daemon
and the asyncio client: structured output that validates against its schema, a GBNF
grammar, logprobs with alternatives, a seed that reproduces sampled text, stop strings,
a logit bias by text, and the child's own refusal of a malformed grammar. Few calls,
few tokens each: the machine is small and shared."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import jsonschema
import pytest
import pytest_asyncio

from clients import AsyncClient, errors
from tests.support.daemon import config_env, make_daemon

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SCHEMA = {
    "type": "object",
    "properties": {"service": {"type": "string"}, "port": {"type": "integer"}},
    "required": ["service", "port"],
    "additionalProperties": False,
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llamad(llama_server: str) -> AsyncIterator[AsyncClient]:
    """One daemon with a generation child only, for the whole module."""
    daemon = make_daemon(config_env("llama-server", LLAMAD_EMBEDDING_MODE="disabled"))
    address = await daemon.start()
    try:
        async with AsyncClient(address) as client:
            await client.wait_serving("generation", timeout=120)
            yield client
    finally:
        await daemon.shutdown()


async def test_json_schema_output_validates(llamad: AsyncClient) -> None:
    """With a JSON schema, Chat and Generate produce JSON that parses and validates
    against it (llama-server turns the schema into a grammar). Greedy: with the default
    sampling the model sometimes rambled inside the "service" string past the token
    budget (an unterminated string, the grammar's output cut, not a wrong one)."""
    chat = await llamad.chat([("user", "Which port does nginx listen on? Answer as JSON.")],
                             max_tokens=96, temperature=0.0, json_schema=SCHEMA).collect()
    assert chat.finish_reason == "stop"
    jsonschema.validate(json.loads(chat.text), SCHEMA)
    generated = await llamad.generate("nginx listens on port 80. As JSON:", max_tokens=96,
                                      temperature=0.0,
                                      json_schema=json.dumps(SCHEMA)).collect()
    assert generated.finish_reason == "stop"
    jsonschema.validate(json.loads(generated.text), SCHEMA)
    anything = await llamad.chat([("user", "Describe nginx as JSON.")], max_tokens=24,
                                 response_format="json_object").collect()
    assert anything.text.lstrip().startswith("{")


async def test_a_grammar_constrains_the_output(llamad: AsyncClient) -> None:
    """root ::= "yes" | "no" leaves the model nothing else to say, on both routes."""
    grammar = 'root ::= "yes" | "no"'
    chat = await llamad.chat([("user", "Is the sky blue?")], max_tokens=8,
                             grammar=grammar).collect()
    generated = await llamad.generate("Is water wet? Answer:", max_tokens=8,
                                      grammar=grammar).collect()
    assert chat.text in ("yes", "no") and generated.text in ("yes", "no")
    assert chat.finish_reason == "stop"


async def test_logprobs_come_back_with_alternatives(llamad: AsyncClient) -> None:
    """Each generated token carries its log-probability and at most top_logprobs
    alternatives, likeliest first; the chosen tokens spell the text."""
    result = await llamad.generate("The capital of France is", max_tokens=4, logprobs=True,
                                   top_logprobs=3).collect()
    assert len(result.logprobs) == result.usage.completion_tokens == 4
    assert "".join(e.chosen.token for e in result.logprobs) == result.text
    for entry in result.logprobs:
        assert entry.chosen.logprob <= 0 and math.isfinite(entry.chosen.logprob)
        assert entry.chosen.id is not None
        assert 1 <= len(entry.top) <= 3
        assert [t.logprob for t in entry.top] == sorted((t.logprob for t in entry.top),
                                                        reverse=True)
    # Greedy: the chosen token is the likeliest alternative.
    assert all(e.top[0].token == e.chosen.token for e in result.logprobs)
    only = await llamad.chat([("user", "Hi")], max_tokens=2, logprobs=True).collect()
    assert only.logprobs and all(e.top == () for e in only.logprobs)


async def test_a_seed_reproduces_sampled_text(llamad: AsyncClient) -> None:
    """At temperature 1, the same seed gives the same text twice."""
    async def sample(seed: int) -> str:
        stream = llamad.generate("Once upon a time", max_tokens=12, temperature=1.0, seed=seed)
        return (await stream.collect()).text

    first = await sample(1234)
    assert first and await sample(1234) == first


async def test_stop_strings_and_a_logit_bias_by_text(llamad: AsyncClient) -> None:
    """Counting stops before the stop string (finish "stop"); a -100 bias on the text
    " 5" keeps the greedy continuation of "1, 2, 3, 4," from being " 5"."""
    counting = "1, 2, 3, 4,"
    plain = await llamad.generate(counting, max_tokens=16).collect()
    assert plain.text.startswith(" 5")
    stopped = await llamad.generate(counting, max_tokens=16, stop=[" 7"]).collect()
    assert stopped.finish_reason == "stop" and "7" not in stopped.text
    assert stopped.text.startswith(" 5, 6")
    biased = await llamad.generate(counting, max_tokens=4,
                                   logit_bias={" 5": -100.0}).collect()
    assert not biased.text.startswith(" 5")


async def test_penalties_and_dry_reach_the_child(llamad: AsyncClient) -> None:
    """min_p, the penalties and DRY are taken by llama-server (no refusal, text back);
    a malformed grammar is the child's INVALID_ARGUMENT, naming the grammar."""
    result = await llamad.chat(
        [("user", "List three colors.")], max_tokens=12, min_p=0.05, repeat_penalty=1.1,
        repeat_last_n=64, presence_penalty=0.2, frequency_penalty=0.2, dry_multiplier=0.8,
        dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=128).collect()
    assert result.text and result.usage.completion_tokens >= 1
    with pytest.raises(errors.InvalidArgument, match="grammar"):
        await llamad.generate("x", max_tokens=2, grammar='root ::= ("yes"').collect()
