"""The floor under a relay's CPU per token (``bench.bench_relay_cost --floor``): what an
asyncio process spends per wake-up on this machine when it does nothing but the wake-up,
when it writes one server-sent event per wake-up (aiohttp), and when it sends one gRPC
message per wake-up (grpc.aio), each in a process of its own woken by a timer every
``interval`` seconds (a model's pace: ~70 tokens/s). A relay that gets one token per
wake-up from its child cannot cost less per token than these (it also reads the child).

Beside them, in a second process without an event loop: a plain thread that sleeps (what
a wake-up costs a process that runs no loop), and grpcio's synchronous server sending one
message per wake-up from its handler thread (does leaving grpc.aio make a message
cheaper?).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import httpx
from aiohttp import web

from bench._relay_cost import cpu_ns

KINDS = ("asyncio wake-up only", "aiohttp SSE event", "grpc.aio message")
SYNC_KINDS = ("thread wake-up only", "sync grpc message")


async def _sleeper(port_out: Any, count: int, interval: float) -> None:
    app = web.Application()

    async def idle(_request: web.Request) -> web.Response:
        for _ in range(count):
            await asyncio.sleep(interval)
        return web.Response(text="ok")

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(count):
            await asyncio.sleep(interval)
            await response.write(b'data: {"text": "token"}\n\n')
        await response.write_eof()
        return response

    app.router.add_post("/idle", idle)
    app.router.add_post("/events", events)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()

    async def messages(_request: bytes, _context: Any) -> AsyncIterator[bytes]:
        for _ in range(count):
            await asyncio.sleep(interval)
            yield b"token"

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "floor.Floor", {"Stream": grpc.unary_stream_rpc_method_handler(messages)})])
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_out.put((site._server.sockets[0].getsockname()[1],  # type: ignore[union-attr]
                  grpc_port))
    await asyncio.Event().wait()


def _serve(port_out: Any, count: int, interval: float) -> None:
    asyncio.run(_sleeper(port_out, count, interval))


def _serve_sync(port_out: Any, count: int, interval: float) -> None:
    """The synchronous kinds: a unary call whose handler thread sleeps ``count`` times,
    and a stream whose handler thread sends a message after each sleep."""
    def sleeps(_request: bytes, _context: Any) -> bytes:
        for _ in range(count):
            time.sleep(interval)
        return b"ok"

    def messages(_request: bytes, _context: Any) -> Any:
        for _ in range(count):
            time.sleep(interval)
            yield b"token"

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("floor.Floor", {
        "Sleep": grpc.unary_unary_rpc_method_handler(sleeps),
        "Stream": grpc.unary_stream_rpc_method_handler(messages)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_out.put(port)
    threading.Event().wait()


async def floors(count: int = 300, interval: float = 0.014) -> dict[str, float]:
    """CPU µs per wake-up of each kind (:data:`KINDS`), in a fresh server process."""
    queue: Any = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(queue, count, interval), daemon=True)
    proc.start()
    try:
        http_port, grpc_port = await asyncio.to_thread(queue.get, True, 60)
        pid = proc.pid
        assert pid is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}",
                                     trust_env=False, timeout=300) as http, \
                grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stream = channel.unary_stream("/floor.Floor/Stream")

            async def idle() -> None:
                await http.post("/idle")

            async def events() -> None:
                async with http.stream("POST", "/events") as resp:
                    async for _ in resp.aiter_raw():
                        pass

            async def messages() -> None:
                async for _ in stream(b""):
                    pass

            runs: list[Callable[[], Coroutine[Any, Any, None]]] = [idle, events, messages]
            out: dict[str, float] = {}
            for kind, run in zip(KINDS, runs, strict=True):
                before = cpu_ns(pid)
                await run()
                out[kind] = (cpu_ns(pid) - before) / 1e3 / count
    finally:
        proc.kill()
        proc.join()
    return out | await _sync_floors(count, interval)


async def _sync_floors(count: int, interval: float) -> dict[str, float]:
    """CPU µs per wake-up of each of :data:`SYNC_KINDS`, in a fresh process."""
    queue: Any = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve_sync, args=(queue, count, interval), daemon=True)
    proc.start()
    try:
        port = await asyncio.to_thread(queue.get, True, 60)
        pid = proc.pid
        assert pid is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            sleep, stream = channel.unary_unary("/floor.Floor/Sleep"), \
                channel.unary_stream("/floor.Floor/Stream")

            async def idle() -> None:
                await sleep(b"")

            async def messages() -> None:
                async for _ in stream(b""):
                    pass

            out: dict[str, float] = {}
            for kind, run in zip(SYNC_KINDS, (idle, messages), strict=True):
                before = cpu_ns(pid)
                await run()
                out[kind] = (cpu_ns(pid) - before) / 1e3 / count
            return out
    finally:
        proc.kill()
        proc.join()


def floor_lines(found: dict[str, float], interval: float) -> list[str]:
    cells = ", ".join(f"{kind} **{us:.0f} µs**" for kind, us in found.items())
    return ["", f"Floor (`--floor`): a process woken every {interval * 1000:g} ms by a "
            f"timer, CPU per wake-up: {cells} (the first three in an asyncio process, the "
            "last two in one without an event loop). A relay that gets one token per "
            "wake-up cannot cost less per token (it also reads its child)."]
