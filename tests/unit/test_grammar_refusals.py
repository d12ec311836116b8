"""Where the grammar and schema checks sit in a call: gRPC's validation and the HTTP API's
parsing refuse the issue-25 grammar and a 300-level schema (response_format, a tool's
parameters) as InvalidArgument naming the field, never as an encoder's internal error;
the limits are the ``[limits]`` options'."""

from __future__ import annotations

import json

import pytest

from daemon.checks import tools, validation
from daemon.config import Limits
from daemon.errors import InvalidArgument
from daemon.httpapi import _parse
from daemon.httpapi._errors import ParamError
from llamad_protocol.v1 import inference_pb2 as pb
from tests.support.hostile import deep_schema

HOSTILE = "root ::= ([a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* )+"


def test_grpc_validation_refuses_the_hostile_grammar() -> None:
    """sampling.grammar is named, with the reason; a usual grammar passes."""
    with pytest.raises(InvalidArgument, match=r"^sampling.grammar repeats something that "
                                              r"can match the empty string"):
        validation.sampling(pb.SamplingParams(grammar=HOSTILE), Limits())
    ok = validation.sampling(pb.SamplingParams(grammar='root ::= "yes" | "no"'), Limits())
    assert ok.grammar == 'root ::= "yes" | "no"'


def test_walk_limit_is_the_option() -> None:
    """limits.max_grammar_walks decides: 4095 walks pass at 5000, not at 4000."""
    grammar = "root ::= ([a-z]+ [a-z]+)+"
    validation.sampling(pb.SamplingParams(grammar=grammar), Limits(max_grammar_walks=5000))
    with pytest.raises(InvalidArgument, match="max_grammar_walks"):
        validation.sampling(pb.SamplingParams(grammar=grammar), Limits(max_grammar_walks=4000))


def test_grpc_deep_schema_is_invalid_argument() -> None:
    """300 levels: refused by max_schema_depth, naming the field; 20 levels pass."""
    fmt = pb.ResponseFormat(type=pb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
                            json_schema=json.dumps(deep_schema(300)))
    with pytest.raises(InvalidArgument, match=r"^sampling.response_format.json_schema nests "
                                              r"deeper than 64 levels"):
        validation.sampling(pb.SamplingParams(response_format=fmt), Limits())
    fmt.json_schema = json.dumps(deep_schema(20))
    assert validation.sampling(pb.SamplingParams(response_format=fmt), Limits()).json_schema


def test_grpc_tool_parameters_are_checked() -> None:
    """A tool's parameters get the schema checks, named tools[i].parameters."""
    request = pb.ChatRequest(tools=[pb.Tool(name="f", parameters=json.dumps(deep_schema(300)))])
    with pytest.raises(InvalidArgument, match=r"^tools\[0\].parameters nests deeper"):
        tools.chat_tools(request, Limits())
    request = pb.ChatRequest(tools=[pb.Tool(name="f", parameters=json.dumps(
        {"type": "object", "properties": {"x": {"type": "string", "pattern": "^(a*)*$"}}}))])
    with pytest.raises(InvalidArgument, match=r"pattern at /properties/x/pattern"):
        tools.chat_tools(request, Limits())


def test_http_parse_refuses_by_param() -> None:
    """The HTTP API's body: grammar, response_format's schema and a tool's parameters are
    400s naming OpenAI's parameter (a 300-level schema would fail JSON encoding)."""
    base = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidArgument, match=r"sampling\.grammar"):
        _parse.sampling({**base, "grammar": HOSTILE}, Limits(), chat=True)
    with pytest.raises(ParamError, match="nests deeper than 64") as err:
        _parse.sampling({**base, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": deep_schema(300)}}}, Limits(), chat=True)
    assert err.value.param == "response_format.json_schema"
    with pytest.raises(ParamError) as err:
        _parse.chat_messages({**base, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": deep_schema(300)}}]}, Limits())
    assert err.value.param == "tools[0].function.parameters"
    with pytest.raises(ParamError) as err:
        _parse.chat_messages({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function",
             "function": {"name": "f", "arguments": deep_schema(300)}}]},
            {"role": "tool", "tool_call_id": "1", "content": "x"},
            {"role": "user", "content": "hi"}]}, Limits())
    assert err.value.param == "messages[1].tool_calls[0].function.arguments"
