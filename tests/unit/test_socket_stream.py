"""supervisor.http._socket.SocketStream, the child connection LoopbackHTTP reads and
writes, on a real socket pair: its reads keep StreamReader's contract (pieces as they
come, separators, exact sizes, the end, the limit); a hold reads nothing before its time
and then all that came at once; closing wakes a waiting read; a peer that sends faster than
the reader reads is not buffered without bound (issue 27)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from supervisor.http._socket import CHUNK, HIGH_WATER, SocketStream


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SocketStream, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(True)
    stream = SocketStream(ours, limit=64)
    yield stream, theirs
    stream.close()
    theirs.close()


async def test_reads_keep_the_stream_readers_contract(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    peer.sendall(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nhello")
    assert await stream.readuntil(b"\r\n") == b"HTTP/1.1 200 OK\r\n"
    assert await stream.readuntil(b"\r\n") == b"A: b\r\n"
    assert await stream.readexactly(2) == b"\r\n"
    assert await stream.read(3) == b"hel"
    assert await stream.read(100) == b"lo"
    later = asyncio.get_running_loop().call_later(0.05, peer.sendall, b"wor")
    assert await asyncio.wait_for(stream.read(100), 5) == b"wor"  # waits for a piece
    later.cancel()
    peer.sendall(b"ld\r")
    reading = asyncio.ensure_future(stream.readuntil(b"\r\n"))  # the separator split
    await asyncio.sleep(0.05)
    assert not reading.done()
    peer.sendall(b"\nend")
    assert await asyncio.wait_for(reading, 5) == b"ld\r\n"
    peer.shutdown(socket.SHUT_WR)
    with pytest.raises(asyncio.IncompleteReadError) as short:
        await asyncio.wait_for(stream.readexactly(5), 5)
    assert short.value.partial == b"end"
    assert await stream.read(10) == b""
    assert stream.at_eof()


async def test_a_line_past_the_limit_is_refused(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    peer.sendall(b"x" * 100)
    with pytest.raises(asyncio.LimitOverrunError):
        await asyncio.wait_for(stream.readuntil(b"\r\n"), 5)


async def test_the_end_before_a_separator_is_an_incomplete_read(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    peer.sendall(b"HTTP/1.1 2")
    peer.close()
    with pytest.raises(asyncio.IncompleteReadError) as short:
        await asyncio.wait_for(stream.readuntil(b"\r\n"), 5)
    assert short.value.partial == b"HTTP/1.1 2"


async def test_a_hold_reads_nothing_before_its_time_then_all_that_came(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    loop = asyncio.get_running_loop()
    peer.sendall(b"first")
    assert await stream.read(100) == b"first"
    until = loop.time() + 0.2
    stream.hold(until)
    reading = asyncio.ensure_future(stream.read(100))
    for piece in (b"a", b"b", b"c"):
        peer.sendall(piece)
        await asyncio.sleep(0.02)
    assert not reading.done()  # held although data came
    assert await asyncio.wait_for(reading, 5) == b"abc"  # one read for all of it
    assert loop.time() >= until
    stream.hold(loop.time() + 60)
    stream.release()  # ended early: the next read does not wait
    peer.sendall(b"now")
    assert await asyncio.wait_for(stream.read(100), 1) == b"now"


async def test_closing_wakes_a_held_or_waiting_read(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, _peer = pair
    stream.hold(asyncio.get_running_loop().time() + 60)
    held = asyncio.ensure_future(stream.read(100))
    await asyncio.sleep(0.02)
    stream.close()  # the read timeout's abort, or the stream's owner leaving
    with pytest.raises(ConnectionAbortedError):
        await asyncio.wait_for(held, 1)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    other = SocketStream(ours, limit=64)
    waiting = asyncio.ensure_future(other.read(100))
    await asyncio.sleep(0.02)
    other.close()
    with pytest.raises(ConnectionAbortedError):
        await asyncio.wait_for(waiting, 1)
    with pytest.raises(ConnectionAbortedError):
        await other.send(b"x")
    theirs.close()


async def test_a_cancelled_read_loses_nothing(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    reading = asyncio.ensure_future(stream.read(100))
    await asyncio.sleep(0.02)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    peer.sendall(b"kept")
    await asyncio.sleep(0.02)
    assert await asyncio.wait_for(stream.read(100), 1) == b"kept"


async def test_a_fast_peer_is_not_buffered_without_bound(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    peer.setblocking(False)
    reading = asyncio.ensure_future(stream.read(1))
    await asyncio.sleep(0.02)  # found nothing: it watches the socket from now on
    sent = 0
    with pytest.raises(BlockingIOError):
        # Nobody reads after the first byte: the kernel's buffers fill once the stream
        # stopped taking (a transport's flow control, at HIGH_WATER).
        for _ in range(200):  # 12.5 MiB: far past the bound and the kernel's buffers
            sent += peer.send(b"y" * 65536)
            await asyncio.sleep(0)
    assert await reading == b"y"
    assert stream.buffered <= HIGH_WATER + CHUNK
    got = 1
    while got < sent:
        got += len(await asyncio.wait_for(stream.read(1 << 20), 5))
    assert got == sent


async def test_a_reset_peer_is_a_connection_error(
        pair: tuple[SocketStream, socket.socket]) -> None:
    stream, peer = pair
    await stream.send(b"GET / HTTP/1.1\r\n\r\n")
    assert peer.recv(100).startswith(b"GET /")
    peer.close()
    with pytest.raises(ConnectionError):
        for _ in range(100):  # the first send may still be taken
            await stream.send(b"x" * 65536)
