"""Streamed answers through supervisor.http._loopback.LoopbackHTTP (and InferenceClient's streams
to a child, which use it) against a real asyncio TCP server that sends its answer in the
pieces it is told, waiting for the test between them: each piece is read as it comes,
whatever the chunk boundaries; a silent server times out, a slow reader does not; leaving
a stream closes its connection; a body cut short is named."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import pytest

from supervisor import ChildRequestError, InferenceClient, Sampling
from supervisor._runtime import LLAMA_SERVER_API
from supervisor.http import HTTPTransportError, LoopbackHTTP, Streamed
from supervisor.http._read import TOKENS_PER_EVENT, pause_length, token_rate
from tests.support.load import patience
from tests.support.loopback import loopback_servers

CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" \
    b"Transfer-Encoding: chunked\r\n\r\n"


@dataclass
class Server:
    """Sends each item of ``pieces`` (bytes) once the test puts it; None: hang up."""

    port: int = 0
    pieces: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    requests: list[bytes] = field(default_factory=list)
    eof: asyncio.Event = field(default_factory=asyncio.Event)  # the client closed


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[], Awaitable[Server]]]:
    async def start() -> Server:
        state = Server()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            state.requests.append(head + await reader.readexactly(length))
            closed = asyncio.ensure_future(reader.read(1))
            try:
                while True:
                    getting = asyncio.ensure_future(state.pieces.get())
                    await asyncio.wait({getting, closed}, return_when=asyncio.FIRST_COMPLETED)
                    if closed.done():
                        getting.cancel()
                        state.eof.set()
                        return
                    piece = getting.result()
                    if piece is None:
                        return
                    writer.write(piece)
                    await writer.drain()
            finally:
                closed.cancel()
                writer.close()

        state.port = await listen(handle)
        return state

    async with loopback_servers() as listen:
        yield start


@pytest.fixture
async def served(serve: Callable[[], Awaitable[Server]]
                 ) -> AsyncIterator[tuple[Server, LoopbackHTTP]]:
    """A server of :func:`serve` and a LoopbackHTTP to it (closed at the end)."""
    server = await serve()
    http = LoopbackHTTP("127.0.0.1", server.port)
    try:
        yield server, http
    finally:
        await http.aclose()


async def next_piece(body: AsyncIterator[bytes]) -> bytes:
    return await asyncio.wait_for(anext(body), patience(5))


async def test_a_chunked_body_is_read_piece_by_piece_whatever_the_boundaries(
        served: tuple[Server, LoopbackHTTP]) -> None:
    server, http = served
    server.pieces.put_nowait(CHUNKED_HEAD + b"6\r\ndata:1\r\n")
    async with http.stream("POST", "/v1/completions", b'{"stream": true}', 5) as answer:
        assert answer.status == 200
        assert answer.headers["content-type"] == "text/event-stream"
        body = answer.body
        # The first event comes before the server sends anything more.
        assert await next_piece(body) == b"data:1"
        server.pieces.put_nowait(b"8;ext=1\r\ndata")  # a chunk split across segments
        assert await next_piece(body) == b"data"
        server.pieces.put_nowait(b":234\r")  # and its CRLF split too
        assert await next_piece(body) == b":234"
        server.pieces.put_nowait(b"\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")  # several at once
        rest = b"".join([piece async for piece in body])
        assert rest == b"abcde"
    assert server.requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"Accept: text/event-stream" in server.requests[0]
    assert server.requests[0].endswith(b'\r\n\r\n{"stream": true}')


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",  # the body ends with the connection
])
async def test_a_sized_or_close_delimited_body_is_read_as_it_comes(
        served: tuple[Server, LoopbackHTTP], head: bytes) -> None:
    server, http = served
    server.pieces.put_nowait(head + b"01234")
    async with http.stream("GET", "/", None, 5) as answer:
        assert await next_piece(answer.body) == b"01234"
        server.pieces.put_nowait(b"56789")
        if b"Connection: close" in head:
            server.pieces.put_nowait(None)
        assert b"".join([piece async for piece in answer.body]) == b"56789"


async def test_an_error_status_comes_with_its_body(served: tuple[Server, LoopbackHTTP]
                                                   ) -> None:
    server, http = served
    error = b'{"error": {"message": "bad grammar"}}'
    server.pieces.put_nowait(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(error), error))
    async with http.stream("POST", "/v1/completions", b"{}", 5) as answer:
        assert (answer.status, await answer.read()) == (400, error)


@contextlib.asynccontextmanager
async def past_the_first_piece(served: tuple[Server, LoopbackHTTP], timeout: float
                               ) -> AsyncIterator[Streamed]:
    """A chunked stream (``timeout``: its silence bound) whose first piece, ``a``, has
    been read."""
    server, http = served
    server.pieces.put_nowait(CHUNKED_HEAD + b"1\r\na\r\n")
    async with http.stream("POST", "/", b"{}", timeout) as answer:
        assert await next_piece(answer.body) == b"a"
        yield answer


async def test_a_silent_server_times_out_a_slow_reader_does_not(
        served: tuple[Server, LoopbackHTTP]) -> None:
    server, _ = served
    async with past_the_first_piece(served, 0.3) as answer:
        server.pieces.put_nowait(b"1\r\nb\r\n")
        await asyncio.sleep(0.6)  # the reader is busy elsewhere: no read is waiting
        assert await next_piece(answer.body) == b"b"
        with pytest.raises(HTTPTransportError) as err:  # now the server says nothing
            await next_piece(answer.body)
    assert err.value.kind == "timeout" and "0.3 s" in str(err.value)
    await asyncio.wait_for(server.eof.wait(), patience(5))


async def test_leaving_a_stream_early_closes_its_connection(
        served: tuple[Server, LoopbackHTTP]) -> None:
    server, _ = served
    async with past_the_first_piece(served, 5):
        pass
    await asyncio.wait_for(server.eof.wait(), patience(5))  # how llama.cpp learns to stop


@pytest.mark.parametrize(("rest", "kind", "words"), [
    (b"10\r\nabc", "dropped", "dropped by the child"),  # hung up mid-chunk
    (b"zz\r\n", "protocol", "bad chunk size"),
    (b"1\r\naXY", "protocol", "not followed by CRLF"),
])
async def test_a_broken_body_is_named(served: tuple[Server, LoopbackHTTP], rest: bytes,
                                      kind: str, words: str) -> None:
    server, http = served
    server.pieces.put_nowait(CHUNKED_HEAD + rest)
    server.pieces.put_nowait(None)
    async with http.stream("POST", "/", b"{}", 5) as answer:
        with pytest.raises(HTTPTransportError) as err:
            await answer.read()
    assert err.value.kind == kind and words in str(err.value)


def sse(event: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_a_childs_chat_stream_goes_through_the_loopback_client(
        serve: Callable[[], Awaitable[Server]]) -> None:
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True)
    events = [sse({"choices": [{"delta": {"content": text}, "finish_reason": None}]})
              for text in ("Hel", "lo")]
    last = sse({"choices": [{"delta": {}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
    stream = client.stream_chat([("user", "hi")], Sampling(max_tokens=2))
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        server.pieces.put_nowait(CHUNKED_HEAD + chunk(events[0]))
        first = await asyncio.wait_for(anext(stream), patience(5))
        assert (first.text, first.tokens) == ("Hel", 1)
        # An event split across two chunks, then the last one and [DONE] in one.
        server.pieces.put_nowait(chunk(events[1][:9]) + chunk(events[1][9:]))
        server.pieces.put_nowait(chunk(last + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        rest = [c async for c in stream]
    assert [(c.text, c.finish_reason) for c in rest] == [("lo", None), ("", "length")]
    assert (rest[-1].prompt_tokens, rest[-1].completion_tokens) == (7, 2)
    body = orjson.loads(server.requests[0].split(b"\r\n\r\n", 1)[1])
    assert body["stream"] is True and body["messages"] == [{"role": "user", "content": "hi"}]
    assert client.in_flight == 0
    # Read to its end: its connection waits for the next request (issue 27) until the
    # client closes.
    await asyncio.sleep(0.05)
    assert not server.eof.is_set()
    await client.aclose()
    await asyncio.wait_for(server.eof.wait(), patience(5))
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True)

    server.pieces.put_nowait(CHUNKED_HEAD + chunk(b"data: {\"choices\": [{\"delta\""))
    server.pieces.put_nowait(None)  # the child died mid-event
    with pytest.raises(ChildRequestError, match="dropped by the child"):
        async for _ in client.stream_chat([("user", "hi")], Sampling(max_tokens=2)):
            pass
    await client.aclose()


async def test_chunks_that_came_while_the_reader_was_busy_are_one_piece(
        served: tuple[Server, LoopbackHTTP]) -> None:
    """A fast server's chunks that wait in the socket while the reader is busy elsewhere
    are taken in one read, as one piece (one write or message downstream, issue 27)."""
    server, http = served
    server.pieces.put_nowait(CHUNKED_HEAD + chunk(b"data:1\n\n"))
    async with http.stream("POST", "/", b"{}", 5) as answer:
        assert await next_piece(answer.body) == b"data:1\n\n"
        # 39 chunks in one write, waiting in the socket while the reader is elsewhere.
        server.pieces.put_nowait(b"".join(chunk(b"data:%d\n\n" % i) for i in range(2, 41))
                                 + b"0\r\n\r\n")
        await asyncio.sleep(0.2)
        pieces = [piece async for piece in answer.body]
        assert b"".join(pieces) == b"".join(b"data:%d\n\n" % i for i in range(2, 41))
        assert len(pieces) == 1  # one read, one piece: not one per chunk


def delta(content: str | None = None, **more: object) -> bytes:
    body: dict[str, object] = {} if content is None else {"content": content}
    choice = {"delta": body | more, "finish_reason": None}
    return sse({"choices": [choice]})


def logprob(token: str, value: float) -> dict[str, object]:
    return {"token": token, "logprob": value, "bytes": list(token.encode()),
            "top_logprobs": [{"token": token, "logprob": value, "bytes": []}]}


async def test_events_that_came_together_are_relayed_as_one_chunk(
        serve: Callable[[], Awaitable[Server]]) -> None:
    """Several events in one piece (a relay lagging behind its child) are one Chunk: the
    texts and logprobs in order, the tokens counted, the pieces of a tool call's arguments
    joined; the next event alone is a chunk of its own; usage and finish come last."""
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True)
    sampling = Sampling(max_tokens=9, logprobs=True, top_logprobs=1)
    stream = client.stream_chat([("user", "hi")], sampling)
    call = {"index": 0, "id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\""}}
    together = b"".join([
        sse({"choices": [{"delta": {"content": "A"}, "finish_reason": None,
                          "logprobs": {"content": [logprob("A", -0.5)]}}]}),
        sse({"choices": [{"delta": {"content": " b"}, "finish_reason": None,
                          "logprobs": {"content": [logprob(" b", -1.5)]}}]}),
        delta(tool_calls=[call]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
    ])
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        server.pieces.put_nowait(CHUNKED_HEAD + chunk(together))
        first = await asyncio.wait_for(anext(stream), patience(5))
        server.pieces.put_nowait(chunk(delta("!")))
        second = await asyncio.wait_for(anext(stream), patience(5))
        last = sse({"choices": [{"delta": {}, "finish_reason": "tool_calls"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
        server.pieces.put_nowait(chunk(last + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        rest = [c async for c in stream]
    assert (first.text, first.tokens, first.finish_reason) == ("A b", 4, None)
    assert [(p.chosen.token, p.chosen.logprob) for p in first.logprobs] == [
        ("A", -0.5), (" b", -1.5)]
    assert [(d.index, d.id, d.name, d.arguments) for d in first.tool_calls] == [
        (0, "c1", "f", "{\"a\": 1}")]
    assert (second.text, second.tokens) == ("!", 1)
    assert [(c.text, c.finish_reason, c.completion_tokens) for c in rest] == [
        ("", "tool_calls", 5)]
    await client.aclose()


async def test_an_error_after_tokens_in_one_piece_comes_after_them(
        serve: Callable[[], Awaitable[Server]]) -> None:
    """A child's error event in the same piece as tokens: the tokens are relayed first,
    then the error is raised (as when each came alone)."""
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True)
    error = sse({"error": {"code": 500, "message": "boom", "type": "server_error"}})
    server.pieces.put_nowait(CHUNKED_HEAD + chunk(delta("x") + delta("y") + error))
    got: list[str] = []
    with pytest.raises(ChildRequestError, match="boom"):
        async for piece in client.stream_chat([("user", "hi")], Sampling(max_tokens=9)):
            got.append(piece.text)
    assert got == ["xy"]
    await client.aclose()


INTERVAL = 0.5  # s; the server's separate writes land well inside one pause


async def put_apart(server: Server, pieces: list[bytes], gap: float = 0.02) -> None:
    """Send ``pieces`` as separate writes ``gap`` apart (a child's tokens one by one)."""
    for piece in pieces:
        server.pieces.put_nowait(piece)
        await asyncio.sleep(gap)


async def test_a_paced_stream_joins_what_came_during_its_interval(
        serve: Callable[[], Awaitable[Server]]) -> None:
    """With a stream interval the first chunk is not held; what the child sends one event
    at a time after it is read once the interval has passed, as one chunk: texts, tokens,
    logprobs in order and a tool call's pieces joined; once the finish was read nothing
    waits for another interval, and the connection is reused after the end (issue 27)."""
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True, stream_interval=INTERVAL)
    sampling = Sampling(max_tokens=9, logprobs=True, top_logprobs=1)
    call = {"index": 0, "id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\""}}
    loop = asyncio.get_running_loop()
    stream = client.stream_chat([("user", "hi")], sampling)
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        server.pieces.put_nowait(CHUNKED_HEAD + chunk(delta(role="assistant")))
        server.pieces.put_nowait(chunk(sse({"choices": [{
            "delta": {"content": "A"}, "finish_reason": None,
            "logprobs": {"content": [logprob("A", -0.5)]}}]})))
        first = await asyncio.wait_for(anext(stream), 5)
        handed = loop.time()
        assert (first.text, first.tokens) == ("A", 1)  # a role delta alone is no chunk
        apart = asyncio.ensure_future(put_apart(server, [
            chunk(sse({"choices": [{"delta": {"content": " b"}, "finish_reason": None,
                                    "logprobs": {"content": [logprob(" b", -1.5)]}}]})),
            chunk(delta(tool_calls=[call])),
            chunk(delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]))]))
        second = await asyncio.wait_for(anext(stream), 5)
        waited = loop.time() - handed
        await apart
        last = sse({"choices": [{"delta": {}, "finish_reason": "tool_calls"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
        server.pieces.put_nowait(chunk(delta("!") + last))  # [DONE] apart from the finish
        third = await asyncio.wait_for(anext(stream), 5)
        finish_read = loop.time()
        loop.call_later(0.05, server.pieces.put_nowait,
                        chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        rest = [c async for c in stream]
        ended = loop.time() - finish_read
    assert waited >= INTERVAL * 0.9  # held: one read for the three events
    assert (second.text, second.tokens) == (" b", 3)
    assert [(p.chosen.token, p.chosen.logprob) for p in second.logprobs] == [(" b", -1.5)]
    assert [(d.index, d.id, d.name, d.arguments) for d in second.tool_calls] == [
        (0, "c1", "f", "{\"a\": 1}")]
    assert (third.text, third.tokens) == ("!", 1)
    assert [(c.finish_reason, c.completion_tokens) for c in rest] == [("tool_calls", 5)]
    assert ended < INTERVAL / 2  # once the finish was read, nothing is held any more
    await asyncio.sleep(0.05)
    assert not server.eof.is_set()  # read to its end: kept for the next request
    await client.aclose()


async def test_leaving_a_paced_stream_closes_its_connection_at_once(
        serve: Callable[[], Awaitable[Server]]) -> None:
    """A stream whose reading is paused (a long interval) and left by its reader (a client
    gone) closes the child's connection at once, not after the pause."""
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True, stream_interval=60.0)
    stream = client.stream_chat([("user", "hi")], Sampling(max_tokens=9))
    server.pieces.put_nowait(CHUNKED_HEAD + chunk(delta("x")))
    assert (await asyncio.wait_for(anext(stream), 5)).text == "x"
    waiting = asyncio.ensure_future(anext(stream))  # paused for 60 s
    server.pieces.put_nowait(chunk(delta("y")))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    waiting.cancel()  # the relay's task cancelled: its client left
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(server.eof.wait(), 5)  # how llama.cpp learns to stop
    assert client.in_flight == 0
    await client.aclose()


async def test_an_error_after_a_pause_comes_after_the_tokens_before_it(
        serve: Callable[[], Awaitable[Server]]) -> None:
    """A child's error event that came during a pause: the tokens before it are relayed
    as one chunk, then the error is raised."""
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True, stream_interval=INTERVAL)
    error = sse({"error": {"code": 500, "message": "boom", "type": "server_error"}})
    server.pieces.put_nowait(CHUNKED_HEAD + chunk(delta("w")))
    got: list[str] = []
    sending: list[asyncio.Future[None]] = []
    with pytest.raises(ChildRequestError, match="boom"):
        async for piece in client.stream_chat([("user", "hi")], Sampling(max_tokens=9)):
            got.append(piece.text)
            if len(got) == 1:
                sending.append(asyncio.ensure_future(put_apart(
                    server, [chunk(delta("x")), chunk(delta("y")), chunk(error)])))
    await sending[0]
    assert got == ["w", "xy"]
    await client.aclose()


def test_a_slow_streams_pause_grows_to_two_tokens_time_up_to_its_longest() -> None:
    """The pause after a chunk: the interval for a fast stream or one whose pace is not
    known yet; for a slow one the time of TOKENS_PER_EVENT tokens, never past
    ``longest``, and never longer than the interval when ``longest`` is not above it."""
    assert TOKENS_PER_EVENT == 2
    assert pause_length(0.04, 0.12, 0.0) == 0.04  # pace not known yet
    assert pause_length(0.04, 0.12, 100.0) == 0.04  # 2 tokens in 20 ms: fast
    assert pause_length(0.04, 0.12, 25.0) == pytest.approx(0.08)
    assert pause_length(0.04, 0.12, 5.0) == 0.12  # 400 ms for two: capped
    assert pause_length(0.04, 0.0, 5.0) == 0.04  # no longest: the interval alone
    rate = token_rate(0.0, 1, 0.1)
    assert rate == pytest.approx(10.0)  # the first chunk's pace as it is
    assert token_rate(rate, 3, 0.1) == pytest.approx(20.0)  # then smoothed
    assert token_rate(rate, 1, 0.0) == rate  # no time passed: nothing learnt


async def test_a_slow_stream_is_relayed_about_two_tokens_an_event(
        serve: Callable[[], Awaitable[Server]]) -> None:
    """A child that sends a token every 60 ms (many streams sharing it): with an interval
    of 40 ms alone every event would carry one token; with a longest of 300 ms the pause
    grows to two tokens' time and the events carry two or more (a loaded machine only
    joins more). Every token arrives, in order (issue 27)."""
    server = await serve()
    client = InferenceClient(f"http://127.0.0.1:{server.port}", model_id="m",
                             api=LLAMA_SERVER_API, loopback=True, stream_interval=0.04,
                             stream_interval_max=0.3)
    words = [f"w{i} " for i in range(16)]
    server.pieces.put_nowait(CHUNKED_HEAD + chunk(delta(words[0])))
    feeding = asyncio.ensure_future(put_apart(server, [
        *(chunk(delta(w)) for w in words[1:]),
        chunk(sse({"choices": [{"delta": {}, "finish_reason": "stop"}]})
              + b"data: [DONE]\n\n") + b"0\r\n\r\n"], gap=0.06))
    got = [c async for c in client.stream_chat([("user", "hi")], Sampling(max_tokens=99))]
    await feeding
    texts = [c for c in got if c.text]
    assert "".join(c.text for c in texts) == "".join(words)
    steady = sorted(c.tokens for c in texts[3:])  # once its pace was seen
    assert steady[len(steady) // 2] >= 2, [c.tokens for c in texts]
    await client.aclose()
