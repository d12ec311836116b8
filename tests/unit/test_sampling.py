"""Generation controls in the form each runtime takes them (supervisor._sampling): the
JSON sent to llama-server's two routes, to the bundled runtime and to an OpenAI endpoint;
refusals naming the parameter and the runtime; logprobs read back from stream events in
llama-server's and OpenAI's forms."""

from __future__ import annotations

import json

import pytest

from supervisor import (
    BUNDLED,
    LLAMA_CPP,
    OPENAI,
    ChildBadRequestError,
    EndpointClient,
    LogitBias,
    Sampling,
    TokenLogprob,
    TokenLogprobs,
    UnsupportedParameterError,
)
from supervisor._sampling import EXTENDED, parse_logprobs
from tests.support.fake_openai import serve_fake_openai

SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                     "required": ["ok"]})

EVERYTHING = Sampling(
    max_tokens=8, temperature=0.7, seed=42, stop=("\n",), min_p=0.05, repeat_penalty=1.1,
    repeat_last_n=64, presence_penalty=0.5, frequency_penalty=-0.5,
    logit_bias=(LogitBias(15, -100.0), LogitBias(" hello", 2.5)), logprobs=True,
    top_logprobs=3, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
    dry_penalty_last_n=128)


def test_plain_sampling_is_sent_as_before() -> None:
    """A request without the new controls sends exactly the base fields, whatever the
    dialect (no check can refuse it)."""
    plain = Sampling(max_tokens=4, temperature=0.0, top_k=5, seed=1, stop=("x",))
    expected = {"max_tokens": 4, "temperature": 0.0, "top_k": 5, "seed": 1, "stop": ["x"]}
    for dialect in (LLAMA_CPP, BUNDLED, OPENAI):
        assert plain.to_json(dialect) == expected
        assert plain.to_json(dialect, chat=True) == expected
    assert plain.requested() == []


def test_llama_server_completion_fields() -> None:
    """llama-server's /v1/completions gets its native names: the penalties and DRY as
    they are, logit_bias as [token or text, bias] pairs (a text is tokenized there),
    n_probs for logprobs."""
    body = EVERYTHING.to_json(LLAMA_CPP)
    assert body == {
        "max_tokens": 8, "temperature": 0.7, "seed": 42, "stop": ["\n"], "min_p": 0.05,
        "repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "dry_multiplier": 0.8, "dry_base": 1.75,
        "dry_allowed_length": 2, "dry_penalty_last_n": 128,
        "logit_bias": [[15, -100.0], [" hello", 2.5]], "n_probs": 3}
    assert EVERYTHING.to_json(LLAMA_CPP, chat=True) == body  # same fields on chat


def test_top_logprobs_zero_still_asks_for_the_chosen_token() -> None:
    """llama-server's n_probs 0 returns nothing: logprobs with 0 alternatives asks for 1
    (the alternatives are cut when read back)."""
    assert Sampling(logprobs=True, top_logprobs=0).to_json(LLAMA_CPP)["n_probs"] == 1


def test_structured_output_per_route() -> None:
    """A JSON schema goes as json_schema on /v1/completions (which ignores
    response_format) and as OpenAI's response_format on chat; json_object is any object;
    a grammar is sent as is."""
    schema = Sampling(response_format="json_schema", json_schema=SCHEMA, schema_name="answer")
    assert schema.to_json(LLAMA_CPP)["json_schema"] == json.loads(SCHEMA)
    assert "response_format" not in schema.to_json(LLAMA_CPP)
    assert schema.to_json(LLAMA_CPP, chat=True)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": json.loads(SCHEMA)}}
    anything = Sampling(response_format="json_object")
    assert anything.to_json(LLAMA_CPP)["json_schema"] == {}
    assert anything.to_json(LLAMA_CPP, chat=True)["response_format"] == {"type": "json_object"}
    grammar = 'root ::= "yes" | "no"'
    assert Sampling(grammar=grammar).to_json(LLAMA_CPP)["grammar"] == grammar


def test_an_openai_endpoint_gets_openai_forms() -> None:
    """An OpenAI endpoint gets logit_bias as an object of token ids, logprobs as
    logprobs/top_logprobs on chat and as the legacy integer on completions."""
    s = Sampling(presence_penalty=1.0, frequency_penalty=0.2,
                 logit_bias=(LogitBias(15, -100.0), LogitBias(7, 3.0)),
                 logprobs=True, top_logprobs=2)
    chat = s.to_json(OPENAI, chat=True)
    assert chat["logit_bias"] == {"15": -100.0, "7": 3.0}
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 2)
    assert "n_probs" not in chat
    assert s.to_json(OPENAI)["logprobs"] == 2
    fmt = Sampling(response_format="json_object")
    assert fmt.to_json(OPENAI, chat=True)["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(("sampling", "chat", "named"), [
    (Sampling(grammar='root ::= "a"'), True, "sampling.grammar"),
    (Sampling(min_p=0.1), True, "sampling.min_p"),
    (Sampling(dry_multiplier=0.8), True, "sampling.dry_multiplier"),
    (Sampling(logit_bias=(LogitBias("no", -5.0),)), True, "sampling.logit_bias by text"),
    (Sampling(response_format="json_object"), False, "sampling.response_format"),
])
def test_an_openai_endpoint_refuses_llama_cpp_controls(sampling: Sampling, chat: bool,
                                                       named: str) -> None:
    """What only llama.cpp takes is refused for an OpenAI endpoint, naming the parameter
    and the runtime (response_format on Generate, which OpenAI's completions lack)."""
    with pytest.raises(UnsupportedParameterError) as info:
        sampling.to_json(OPENAI, chat=chat)
    assert named in str(info.value)
    assert OPENAI.runtime in str(info.value)
    if not chat:
        assert "on Generate" in str(info.value)


def test_the_bundled_runtime_refuses_what_it_would_ignore() -> None:
    """llama-cpp-python's server ignores unknown fields: DRY, logprobs and structured
    output are refused (all named at once), while min_p, penalties and a grammar go."""
    with pytest.raises(UnsupportedParameterError) as info:
        EVERYTHING.to_json(BUNDLED)
    assert info.value.params == ["repeat_last_n", "logit_bias_text", "logprobs",
                                 "dry_multiplier", "dry_base", "dry_allowed_length",
                                 "dry_penalty_last_n"]
    ok = Sampling(min_p=0.1, repeat_penalty=1.2, presence_penalty=0.1, grammar='root ::= "a"',
                  logit_bias=(LogitBias(3, 1.0),))
    assert ok.to_json(BUNDLED)["logit_bias"] == {"3": 1.0}


def test_llama_cpp_takes_every_control() -> None:
    """Every extended parameter is one llama-server takes."""
    assert set(EXTENDED) == LLAMA_CPP.accepts
    EVERYTHING.check(LLAMA_CPP, chat=False)


def test_an_endpoint_learns_it_is_llama_cpp_from_its_model_list() -> None:
    """An endpoint whose /v1/models entry says owned_by llamacpp takes llama.cpp's
    controls; any other model keeps OpenAI's, and a refusal names the endpoint."""
    client = EndpointClient("http://10.0.0.5:8080/v1", api_key=None)
    grammar = Sampling(grammar='root ::= "a"')
    with pytest.raises(UnsupportedParameterError, match=r"endpoint http://10\.0\.0\.5:8080"):
        grammar.check(client.dialect, chat=True)
    client.use_model("m", {"id": "m", "owned_by": "llamacpp"})
    grammar.check(client.dialect, chat=True)
    assert client.dialect.llama_cpp
    client.use_model("other", {"id": "other", "owned_by": "vllm"})
    assert not client.dialect.llama_cpp


def test_llama_server_logprobs_are_read_with_alternatives_cut() -> None:
    """llama-server's form (choices[i].logprobs.content, on both routes): the chosen
    token with its id and bytes, alternatives cut to what was asked."""
    event = {"content": [{
        "id": 9906, "token": "Hello", "bytes": [72, 101, 108, 108, 111], "logprob": -0.25,
        "top_logprobs": [
            {"id": 9906, "token": "Hello", "bytes": [72, 101, 108, 108, 111], "logprob": -0.25},
            {"id": 13347, "token": "Hi", "bytes": [72, 105], "logprob": -1.5},
            {"id": 10, "token": "Hey", "bytes": [72, 101, 121], "logprob": -3.0}]}]}
    (entry,) = parse_logprobs(event, 2)
    assert entry.chosen == TokenLogprob("Hello", -0.25, b"Hello", 9906)
    assert [t.token for t in entry.top] == ["Hello", "Hi"]
    assert parse_logprobs(event, 0) == (TokenLogprobs(entry.chosen, ()),)


def test_openai_legacy_completion_logprobs_are_read() -> None:
    """OpenAI's legacy completions form: tokens, token_logprobs and a dict of
    alternatives per token, sorted likeliest first."""
    event = {"tokens": [" yes"], "token_logprobs": [-0.1],
             "top_logprobs": [{" no": -2.5, " yes": -0.1}], "text_offset": [0]}
    (entry,) = parse_logprobs(event, 5)
    assert entry.chosen == TokenLogprob(" yes", -0.1, b" yes", None)
    assert [(t.token, t.logprob) for t in entry.top] == [(" yes", -0.1), (" no", -2.5)]


def test_absent_or_malformed_logprobs_are_no_tokens() -> None:
    """null, a string or entries without a numeric logprob give nothing (never an
    exception in the middle of a stream)."""
    assert parse_logprobs(None, 3) == ()
    assert parse_logprobs("x", 3) == ()
    assert parse_logprobs({"content": [{"token": "a"}, 5]}, 3) == ()


async def test_an_openai_endpoint_is_sent_only_what_it_takes() -> None:
    """Against a strict OpenAI-style server: a grammar is refused before anything is
    sent; logprobs and logit_bias go in OpenAI's form; a seed the server rejects is the
    caller's error, not dropped and retried without it."""
    with serve_fake_openai(reject=("stream_options", "seed")) as (url, seen):
        client = EndpointClient(url, api_key=None)
        try:
            models = await client.discover()
            client.use_model(str(models[0]["id"]), models[0])

            def posts() -> list[dict[str, object]]:
                return [b for p, b, _ in seen if p.endswith("/chat/completions")]

            with pytest.raises(UnsupportedParameterError, match=r"sampling\.grammar"):
                client.stream_chat([("user", "hi")], Sampling(grammar='root ::= "a"'))
            assert posts() == []
            asked = Sampling(max_tokens=2, logprobs=True, top_logprobs=2,
                             logit_bias=(LogitBias(15, -100.0),))
            text = "".join([c.text async for c in client.stream_chat([("user", "hi")], asked)])
            assert text
            body = posts()[-1]
            assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
            assert body["logit_bias"] == {"15": -100.0} and "n_probs" not in body
            with pytest.raises(ChildBadRequestError, match="seed"):
                _ = [c async for c in client.stream_chat([("user", "hi")],
                                                         Sampling(max_tokens=2, seed=3))]
            assert "seed" in posts()[-1]  # the last try still carried it
        finally:
            await client.aclose()
