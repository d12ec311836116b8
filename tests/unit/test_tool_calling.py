"""Tool calling below the APIs: the validation both APIs share (daemon.checks.tools and the
tool parts of messages), the request body a child is sent, the stream's tool-call pieces
read back, /props read into whether tools are taken, and llamad's chatml-tools
template rendered with Jinja."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jinja2
import orjson
import pytest

from daemon.checks import tools, validation
from daemon.config import ConfigError, Limits
from daemon.errors import InvalidArgument
from daemon.models.backend import ChildBackend
from daemon.models.children import make_setup
from llamad_protocol.v1 import inference_pb2 as pb
from supervisor import (
    BundledRuntime,
    InferenceClient,
    LlamaServerRuntime,
    Message,
    Sampling,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolUse,
    Turn,
    choose_chat_template,
    read_gguf_info,
)
from supervisor._runtime import BUNDLED_API, LLAMA_SERVER_API
from supervisor._templates import template_file
from supervisor._tools import join_tool_deltas, messages_json, parse_tool_deltas
from tests.support.config_load import load, write_toml
from tests.support.models import write_model

LIMITS = Limits()
WEATHER = pb.Tool(name="get_weather", description="Weather of a city",
                  parameters='{"type": "object", "properties": {"city": {"type": "string"}}}')
USER = pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="Weather in Paris?")


def offered(**fields: Any) -> ToolUse | None:
    return tools.chat_tools(pb.ChatRequest(messages=[USER], **fields), LIMITS)


def refusal(**fields: Any) -> str:
    with pytest.raises(InvalidArgument) as info:
        offered(**fields)
    return str(info.value)


# --- tools and tool_choice -------------------------------------------------------------

def test_tools_are_read_with_their_choice() -> None:
    """Tools, a mode and parallel_tool_calls are read as given; no tools is None."""
    use = offered(tools=[WEATHER], tool_choice=pb.ToolChoice(
        mode=pb.TOOL_CHOICE_MODE_REQUIRED), parallel_tool_calls=False)
    assert use == ToolUse((Tool("get_weather", "Weather of a city", WEATHER.parameters),),
                          "required", parallel=False)
    assert offered(tools=[WEATHER]).choice == "auto"  # type: ignore[union-attr]
    assert offered() is None
    assert offered(tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)) is None


def test_bad_tools_are_refused_naming_the_field() -> None:
    """An empty or malformed name, a name given twice, parameters that are not JSON or
    not an object, too many tools: each refusal names the tool and field."""
    assert "tools[0].name" in refusal(tools=[pb.Tool(name="")])
    assert "tools[0].name" in refusal(tools=[pb.Tool(name="get weather")])
    assert "tools[1].name" in refusal(tools=[WEATHER, WEATHER]) and "twice" in \
        refusal(tools=[WEATHER, WEATHER])
    assert "tools[0].parameters" in refusal(tools=[pb.Tool(name="f", parameters="{bad")])
    assert "must be a JSON object" in refusal(tools=[pb.Tool(name="f", parameters="[1]")])
    many = [pb.Tool(name=f"f{i}") for i in range(LIMITS.max_tools + 1)]
    assert "limits.max_tools" in refusal(tools=many)


def test_a_tool_choice_must_name_an_offered_tool() -> None:
    """A named function that is not among the tools is refused, naming the known ones;
    asking for a call with no tools is refused too."""
    message = refusal(tools=[WEATHER], tool_choice=pb.ToolChoice(function="get_time"))
    assert "tool_choice" in message and "get_time" in message and "get_weather" in message
    assert "tools is empty" in refusal(tool_choice=pb.ToolChoice(function="get_weather"))
    assert "tools is empty" in refusal(
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED))


def test_a_named_function_is_sent_alone_as_required() -> None:
    """llama-server takes no named tool_choice: that tool alone goes, with required."""
    other = pb.Tool(name="get_time")
    use = offered(tools=[WEATHER, other], tool_choice=pb.ToolChoice(function="get_time"),
                  parallel_tool_calls=True)
    assert use is not None
    body = use.to_json()
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is True
    assert [t["function"]["name"] for t in body["tools"]] == ["get_time"]
    assert body["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}
    auto = offered(tools=[WEATHER])
    assert auto is not None and "parallel_tool_calls" not in auto.to_json()
    assert auto.to_json()["tools"][0]["function"]["parameters"]["properties"] == {
        "city": {"type": "string"}}


# --- messages ---------------------------------------------------------------------------

CALL = pb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


def chat(*messages: pb.ChatMessage) -> list[Any]:
    return validation.chat_messages(pb.ChatRequest(messages=list(messages)), LIMITS)


def chat_refusal(*messages: pb.ChatMessage) -> str:
    with pytest.raises(InvalidArgument) as info:
        chat(*messages)
    return str(info.value)


def test_a_history_with_a_call_and_its_result_is_read() -> None:
    """An assistant message with tool calls and the tool message answering it become
    Turns; plain messages stay pairs."""
    out = chat(USER, pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, tool_calls=[CALL]),
               pb.ChatMessage(role=pb.CHAT_ROLE_TOOL, content="18 C", tool_call_id="call_1"))
    assert out == [("user", "Weather in Paris?"),
                   Turn("assistant", "", (ToolCall("call_1", "get_weather",
                                                   '{"city": "Paris"}'),)),
                   Turn("tool", "18 C", tool_call_id="call_1")]
    assert messages_json(out)[1:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}]


def test_bad_tool_messages_are_refused_naming_the_field() -> None:
    """A tool message without tool_call_id, tool calls on a user message, a tool_call_id
    on a user message, a call whose arguments are not a JSON object, a call without id."""
    assert "messages[1].tool_call_id is empty" in chat_refusal(
        USER, pb.ChatMessage(role=pb.CHAT_ROLE_TOOL, content="18 C"))
    assert "messages[0].tool_calls" in chat_refusal(
        pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="x", tool_calls=[CALL]))
    assert "messages[0].tool_call_id" in chat_refusal(
        pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="x", tool_call_id="c"))
    bad = pb.ToolCall(id="c", name="get_weather", arguments='{"city": ')
    assert "messages[1].tool_calls[0].arguments" in chat_refusal(
        USER, pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, tool_calls=[bad]), USER)
    anonymous = pb.ToolCall(name="get_weather", arguments="{}")
    assert "messages[1].tool_calls[0].id" in chat_refusal(
        USER, pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, tool_calls=[anonymous]), USER)


# --- the stream and the child's capabilities --------------------------------------------

def test_streamed_tool_call_pieces_are_read() -> None:
    """llama-server's delta.tool_calls: the first piece has id and name, later ones more
    arguments; malformed entries are skipped."""
    assert parse_tool_deltas([
        {"index": 0, "id": "abc", "type": "function",
         "function": {"name": "get_weather", "arguments": "{"}},
        {"index": 0, "function": {"arguments": '"city"'}}, "junk", {"index": "x"}]) == (
        ToolCallDelta(0, "abc", "get_weather", "{"), ToolCallDelta(0, "", "", '"city"'))
    assert parse_tool_deltas(None) == ()


@contextlib.asynccontextmanager
async def canned(answers: dict[bytes, bytes]) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback HTTP server answering each request line's path from ``answers`` (the
    whole response after the status line), recording the requests' bodies."""
    bodies: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        bodies.append(await reader.readexactly(length))
        path = head.split(b" ")[1]
        body = answers.get(path, b'{"error": "not found"}')
        status = b"200 OK" if path in answers else b"404 Not Found"
        kind = b"text/event-stream" if body.startswith(b"data:") else b"application/json"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind +
                     b"\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", bodies
    finally:
        server.close()
        await server.wait_closed()


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


async def test_a_child_is_sent_the_tools_and_its_calls_come_back() -> None:
    """The body carries tools, the choice and the history's calls; the stream's
    delta.tool_calls come back as Chunk.tool_calls, the finish reason as given."""
    stream = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "x1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '"city": "Paris"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    use = ToolUse((Tool("get_weather"),), "required", parallel=False)
    history: list[Message] = [
        ("user", "hi"), Turn("assistant", "", (ToolCall("a", "get_weather", "{}"),)),
        Turn("tool", "18 C", tool_call_id="a"), ("user", "again?")]
    async with canned({b"/v1/chat/completions": stream}) as (url, bodies):
        client = InferenceClient(url, model_id="m", api=LLAMA_SERVER_API, loopback=True)
        try:
            chunks = [c async for c in client.stream_chat(history, Sampling(), use)]
        finally:
            await client.aclose()
    sent = orjson.loads(bodies[0])
    assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["messages"][2] == {"role": "tool", "content": "18 C", "tool_call_id": "a"}
    # The canned answer comes in one piece: its events are one chunk (issue 27), the
    # pieces of the call's arguments joined; read apart, they would join the same.
    assert join_tool_deltas([d for c in chunks[:-1] for d in c.tool_calls]) == (
        ToolCallDelta(0, "x1", "get_weather", '{"city": "Paris"}'),)
    assert chunks[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize(("props", "takes"), [
    ({"chat_template_caps": {"supports_tool_calls": True}}, True),
    ({"chat_template_caps": {"supports_tool_calls": False}}, False),
    ({}, False),
    (None, False),  # no /props at all (404)
])
async def test_props_say_whether_a_child_takes_tools(props: dict[str, Any] | None,
                                                     takes: bool) -> None:
    """supports_tool_calls true clears the refusal; false, absent, or no /props keep
    tools refused with the reason; a bundled-runtime client refuses from the start."""
    answers = {b"/props": orjson.dumps(props)} if props is not None else {}
    async with canned(answers) as (url, _):
        client = InferenceClient(url, model_id="m", api=LLAMA_SERVER_API, loopback=True)
        try:
            assert client.tools_refusal  # not known before /props is read
            await client.read_chat_caps()
        finally:
            await client.aclose()
    assert (client.tools_refusal == "") is takes
    bundled = InferenceClient("http://127.0.0.1:1", model_id="m", api=BUNDLED_API)
    assert "llama-cpp-python" in bundled.tools_refusal
    await bundled.aclose()


async def test_a_model_without_tool_support_refuses_tools_naming_itself() -> None:
    """A child whose template renders no tools refuses a chat with tools, and a history
    with tool calls, by INVALID_ARGUMENT naming the model and why; never sent."""
    client = InferenceClient("http://127.0.0.1:1", model_id="m", model_name="gemma.gguf",
                             api=LLAMA_SERVER_API)
    client.tools_refusal = "its chat template does not render tools"
    backend = ChildBackend(client, None)
    try:
        with pytest.raises(InvalidArgument, match=r"tools: the model 'gemma.gguf' cannot "
                                                  "take tools: its chat template"):
            backend.stream_chat([("user", "hi")], Sampling(), ToolUse((Tool("f"),)))
        with pytest.raises(InvalidArgument, match=r"messages: the model 'gemma.gguf'"):
            backend.stream_chat([Turn("tool", "x", tool_call_id="a"), ("user", "hi")],
                                Sampling())
    finally:
        await client.aclose()


# --- the template -----------------------------------------------------------------------

def render(messages: list[dict[str, Any]], tools_: list[dict[str, Any]] | None) -> str:
    # A chat prompt, not HTML: escaping would change it (llama.cpp does not escape).
    env = jinja2.Environment()  # noqa: S701
    env.filters["tojson"] = lambda v: orjson.dumps(v).decode()
    return env.from_string(template_file("chatml-tools").read_text()).render(
        messages=messages, tools=tools_, add_generation_prompt=True)


def test_the_tool_template_renders_tools_calls_and_results() -> None:
    """chatml-tools lists the tools in the system turn (after the caller's system text),
    writes an assistant's calls (object or string arguments) between <tool_call> tags,
    groups tool results in one user turn, and is plain ChatML without tools."""
    tool = ToolUse((Tool("get_weather", "Weather", '{"type": "object"}'),)).to_json()
    calls = [{"id": "a", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"id": "b", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]
    prompt = render([{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": "", "tool_calls": calls},
                     {"role": "tool", "content": "18 C", "tool_call_id": "a"},
                     {"role": "tool", "content": "21 C", "tool_call_id": "b"}], tool["tools"])
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n")
    assert prompt.count("<|im_start|>system") == 1
    assert '<tools>\n{"type":"function","function":{"name":"get_weather"' in prompt
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city":"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n') in prompt
    assert ("<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n"
            "21 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n") in prompt
    plain = render([{"role": "user", "content": "hi"}], None)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# --- choosing the tool template ---------------------------------------------------------

def test_a_models_table_gives_it_the_tool_template(tmp_path: Path) -> None:
    """chat_template = "chatml-tools" in a [models.NAME] table reaches that model's
    llama-server as --chat-template-file (whatever its GGUF carries; plain ChatML on the
    bundled runtime); the other models keep auto; an unknown name is a configuration
    error naming the setting."""
    folder = tmp_path / "models"
    folder.mkdir()
    write_model(folder / "gen-a.gguf")
    write_model(folder / "gen-b.gguf")
    env = {"LLAMAD_MODELS_DIR": str(folder), "LLAMAD_GENERATION_MODEL": str(
        folder / "gen-a.gguf"), "LLAMAD_EMBEDDING_MODE": "disabled"}
    toml = write_toml(tmp_path, f'[models.tools]\nmodel = "{folder / "gen-b.gguf"}"\n'
                                'chat_template = "chatml-tools"\n')
    catalog = load(models=False, env=env, file=toml).catalog
    entry, other = catalog.find("tools"), catalog.find("gen-a")
    assert entry is not None and other is not None
    assert (entry.child.chat_template, other.child.chat_template) == ("chatml-tools", "auto")
    setup = make_setup("generation", entry.path, LlamaServerRuntime("llama-server"),
                       entry.child)
    argv = setup.runtime.command(setup.spec, socket=Path("/run/c.sock"), alias="a")
    assert argv[argv.index("--chat-template-file") + 1].endswith("chatml-tools.jinja")
    bundled = BundledRuntime().command(setup.spec, socket=Path("/run/c.sock"), alias="a")
    assert bundled[bundled.index("--chat_format") + 1] == "chatml"
    configured = choose_chat_template(read_gguf_info(folder / "gen-b.gguf"), "chatml-tools")
    assert configured.usable and "chatml-tools" in configured.describe()
    bad = write_toml(tmp_path, f'[models.tools]\nmodel = "{folder / "gen-b.gguf"}"\n'
                               'chat_template = "hermes"\n')
    with pytest.raises(ConfigError, match="chat_template"):
        load(models=False, env=env, file=bad)


def test_pieces_of_one_call_join_those_of_another_stay_apart() -> None:
    """Joined deltas: a piece that continues the call just before it (same index, no id or
    name) is appended to it; a new call, or another index, stays its own delta."""
    joined = join_tool_deltas([
        ToolCallDelta(0, "a", "f", "{"), ToolCallDelta(0, "", "", "}"),
        ToolCallDelta(1, "b", "g", "["), ToolCallDelta(1, "", "", "]"),
        ToolCallDelta(0, "", "", "x")])
    assert joined == (ToolCallDelta(0, "a", "f", "{}"), ToolCallDelta(1, "b", "g", "[]"),
                      ToolCallDelta(0, "", "", "x"))
