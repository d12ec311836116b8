"""Generation controls through a real in-process gRPC server, the real router and
admission, and a scripted backend: what reaches the backend, the INVALID_ARGUMENT each
bad value gets (naming the field and its limit), the refusal of a control the runtime
cannot take (naming it and the runtime, before the backend streams), logprobs relayed,
and Ask refusing what would break a cited answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest

from daemon.config import Limits
from daemon.grpcapi.inference import InferenceServicer
from daemon.models.admission import Admission
from daemon.models.router import InferenceRouter
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import inference_pb2_grpc
from supervisor import BUNDLED, OPENAI, Dialect, LogitBias, TokenLogprob, TokenLogprobs
from tests.support.backend import FakeBackend, FakeRole
from tests.support.inprocess import serving

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}},
          "required": ["answer"]}


class Inference:
    def __init__(self, channel: grpc.aio.Channel, role: FakeRole) -> None:
        self.stub = inference_pb2_grpc.InferenceServiceStub(channel)
        self.role = role
        assert isinstance(role.served, FakeBackend)
        self.backend = role.served

    async def generate(self, **fields: object) -> list[ipb.GenerateResponse]:
        request = ipb.GenerateRequest(prompt="Say hello", sampling=ipb.SamplingParams(
            max_tokens=3, **fields))  # type: ignore[arg-type]
        return [msg async for msg in self.stub.Generate(request)]

    async def chat(self, **fields: object) -> list[ipb.GenerateResponse]:
        request = ipb.ChatRequest(
            messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content="Hi")],
            sampling=ipb.SamplingParams(max_tokens=3, **fields))  # type: ignore[arg-type]
        return [msg async for msg in self.stub.Chat(request)]

    async def refused(self, fields: dict[str, object], *, chat: bool = False) -> str:
        """The INVALID_ARGUMENT message the call ends with; the backend never streamed."""
        before = len(self.backend.samplings)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await (self.chat(**fields) if chat else self.generate(**fields))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert len(self.backend.samplings) == before
        return info.value.details() or ""


def r(value: float | None) -> float | None:
    """A float32 field's value as the decimal it was written as."""
    return None if value is None else round(value, 6)


@pytest.fixture
async def inference() -> AsyncIterator[Inference]:
    role = FakeRole(FakeBackend())
    router = InferenceRouter({"generation": role})
    servicer = InferenceServicer(router, Limits(max_grammar_chars=200, max_top_logprobs=5,
                                                max_logit_bias=2))
    async with serving(lambda s: inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            servicer, s)) as channel:
        yield Inference(channel, role)


async def test_every_control_reaches_the_backend(inference: Inference) -> None:
    """Each field of SamplingParams arrives in the backend's Sampling, as given."""
    await inference.chat(
        min_p=0.05, repeat_penalty=1.1, repeat_last_n=64, presence_penalty=0.5,
        frequency_penalty=-0.25, logprobs=True, top_logprobs=2, seed=7, stop=["\n"],
        logit_bias=[ipb.LogitBias(token=15, bias=-100), ipb.LogitBias(text="no", bias=2)],
        dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=256)
    (s,) = inference.backend.samplings
    assert (r(s.min_p), r(s.repeat_penalty), s.repeat_last_n) == (0.05, 1.1, 64)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, -0.25)
    assert (s.logprobs, s.top_logprobs, s.seed, s.stop) == (True, 2, 7, ("\n",))
    assert s.logit_bias == (LogitBias(15, -100.0), LogitBias("no", 2.0))
    assert (r(s.dry_multiplier), s.dry_base, s.dry_allowed_length,
            s.dry_penalty_last_n) == (0.8, 1.75, 2, 256)
    assert s.response_format is None and s.grammar is None


async def test_unset_controls_stay_the_runtimes(inference: Inference) -> None:
    """Fields not set are None (the runtime's default), so nothing extra is sent."""
    await inference.generate()
    (s,) = inference.backend.samplings
    assert s.requested() == []


async def test_structured_output_reaches_the_backend(inference: Inference) -> None:
    """A JSON schema arrives compacted with its name; json_object and a grammar as
    given."""
    await inference.chat(response_format=ipb.ResponseFormat(
        type=ipb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, json_schema=json.dumps(SCHEMA, indent=2),
        name="answer"))
    await inference.generate(response_format=ipb.ResponseFormat(
        type=ipb.RESPONSE_FORMAT_TYPE_JSON_OBJECT))
    await inference.generate(grammar='root ::= "yes" | "no"')
    schema, obj, grammar = inference.backend.samplings
    assert schema.response_format == "json_schema" and schema.schema_name == "answer"
    assert schema.json_schema is not None and json.loads(schema.json_schema) == SCHEMA
    assert (obj.response_format, obj.json_schema) == ("json_object", None)
    assert grammar.grammar == 'root ::= "yes" | "no"'


@pytest.mark.parametrize(("fields", "says"), [
    ({"min_p": 1.5}, "sampling.min_p must be in 0..1, got 1.5"),
    ({"repeat_penalty": -1.0}, "sampling.repeat_penalty must be in (0, 10]"),
    ({"repeat_penalty": 0.0}, "sampling.repeat_penalty must be in (0, 10]"),
    ({"presence_penalty": -3.0}, "sampling.presence_penalty must be in -2..2"),
    ({"frequency_penalty": float("nan")}, "sampling.frequency_penalty must be in -2..2"),
    ({"dry_base": 0.5}, "sampling.dry_base must be in 1..10"),
    ({"dry_multiplier": -0.1}, "sampling.dry_multiplier must be in 0..10"),
    ({"top_logprobs": 2}, "sampling.top_logprobs needs sampling.logprobs set"),
    ({"logprobs": True, "top_logprobs": 6},
     "sampling.top_logprobs must be at most 5 (limits.max_top_logprobs), got 6"),
    ({"logit_bias": [ipb.LogitBias(token=1, bias=1)] * 3},
     "the limit is 2 (limits.max_logit_bias)"),
    ({"logit_bias": [ipb.LogitBias(token=1, bias=101)]},
     "sampling.logit_bias[0].bias must be in -100..100"),
    ({"logit_bias": [ipb.LogitBias(bias=1)]}, "sampling.logit_bias[0] names no token"),
    ({"grammar": 'root ::= "' + "a" * 200 + '"'},
     "the limit is 200 (limits.max_grammar_chars)"),
    ({"grammar": "yes | no"}, "needs a 'root ::= ...' rule"),
    ({"response_format": ipb.ResponseFormat(type=ipb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
                                            json_schema="{not json")},
     "sampling.response_format.json_schema is not valid JSON"),
    ({"response_format": ipb.ResponseFormat(type=ipb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
                                            json_schema="[1, 2]")},
     "must be a JSON object (a schema), not a list"),
    ({"response_format": ipb.ResponseFormat(type=ipb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA)},
     "sampling.response_format.json_schema is empty"),
    ({"response_format": ipb.ResponseFormat(
        type=ipb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA, json_schema=json.dumps(
            {"description": "x" * 300}))},
     "the limit is 200 (limits.max_grammar_chars)"),
    ({"response_format": ipb.ResponseFormat(type=ipb.RESPONSE_FORMAT_TYPE_JSON_OBJECT),
      "grammar": 'root ::= "a"'}, "set one"),
])
async def test_bad_values_are_refused_naming_the_field(
        inference: Inference, fields: dict[str, object], says: str) -> None:
    """Each out-of-range or malformed control is INVALID_ARGUMENT saying which field and
    what it may be (with the named limit where one applies); nothing is streamed."""
    assert says in await inference.refused(fields)


@pytest.mark.parametrize(("dialect", "fields", "chat", "says"), [
    (OPENAI, {"grammar": 'root ::= "a"'}, True, "sampling.grammar is not supported by"),
    (OPENAI, {"min_p": 0.1, "dry_multiplier": 0.5}, True,
     "sampling.min_p, sampling.dry_multiplier are not supported by"),
    (OPENAI, {"response_format": ipb.ResponseFormat(
        type=ipb.RESPONSE_FORMAT_TYPE_JSON_OBJECT)}, False, "on Generate"),
    (BUNDLED, {"logprobs": True}, True, "sampling.logprobs is not supported by the bundled"),
])
async def test_a_control_the_runtime_cannot_take_is_refused(
        inference: Inference, dialect: Dialect, fields: dict[str, object], chat: bool,
        says: str) -> None:
    """A runtime that cannot honour a control gets no call: INVALID_ARGUMENT names the
    parameters and the runtime instead of the control being silently dropped."""
    inference.backend.dialect = dialect
    message = await inference.refused(fields, chat=chat)
    assert says in message
    assert dialect.runtime in message


async def test_a_control_the_runtime_cannot_take_is_refused_before_it_queues(
        inference: Inference) -> None:
    """The refusal does not wait for a slot: with the slot and the queue full, it is
    still INVALID_ARGUMENT at once (not RESOURCE_EXHAUSTED, not a wait)."""
    inference.backend.dialect = OPENAI
    admission = inference.role.admission = Admission("generation", 1, 0)
    async with admission.slot(None):
        message = await inference.refused({"grammar": 'root ::= "a"'}, chat=True)
    assert "sampling.grammar is not supported" in message


async def test_what_an_openai_endpoint_takes_goes_through(inference: Inference) -> None:
    """OpenAI's own controls (penalties, logit_bias by id, logprobs, response_format on
    chat) pass for an OpenAI endpoint."""
    inference.backend.dialect = OPENAI
    await inference.chat(presence_penalty=1.0, logprobs=True, top_logprobs=1,
                         logit_bias=[ipb.LogitBias(token=3, bias=1)],
                         response_format=ipb.ResponseFormat(
                             type=ipb.RESPONSE_FORMAT_TYPE_JSON_OBJECT))
    assert len(inference.backend.samplings) == 1


async def test_logprobs_are_relayed_per_piece(inference: Inference) -> None:
    """Each piece's tokens come back in its message: the chosen token with its id and
    bytes, and the alternatives in order."""
    hello = TokenLogprob("Hello", -0.5, b"Hello", 9906)
    hi = TokenLogprob("Hi", -1.25, b"Hi", None)
    inference.backend.logprobs = [(TokenLogprobs(hello, (hello, hi)),), (), ()]
    messages = await inference.generate(logprobs=True, top_logprobs=2)
    first = messages[0].logprobs
    assert len(first) == 1
    chosen = first[0].chosen
    assert (chosen.token, chosen.logprob, chosen.bytes, chosen.id) == ("Hello", -0.5,
                                                                       b"Hello", 9906)
    assert [(t.token, t.HasField("id")) for t in first[0].top_logprobs] == [
        ("Hello", True), ("Hi", False)]
    assert [len(m.logprobs) for m in messages[1:]] == [0, 0, 0]
