"""A gRPC call the drain cuts may still be ending after the server has stopped (a swap
stopping the child it was loading): the daemon's shutdown waits for it, so that the
call's summary line comes before the daemon's last line, ``stopped``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from daemon.grpcapi import rpc


class Context:
    """What a call's frame reads of grpc's context."""

    def time_remaining(self) -> float | None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


class Servicer:
    metrics = None

    def __init__(self) -> None:
        self.started = asyncio.Event()

    @rpc.unary("Slow")
    async def Slow(self, request: object, context: Any, call: rpc.Call) -> str:
        self.started.set()
        try:
            await asyncio.Event().wait()  # cut by the drain
        finally:
            # Its ending takes a while (a child to stop), whatever cancelled it.
            await asyncio.shield(asyncio.sleep(0.3))
        return "never"


async def test_a_cut_call_ends_and_logs_before_calls_ended_returns() -> None:
    servicer = Servicer()
    with capture_logs() as logs:
        task = asyncio.ensure_future(servicer.Slow(object(), Context()))
        await servicer.started.wait()
        task.cancel()  # what the server's stop does to a call still running
        await asyncio.sleep(0)
        assert await rpc.calls_ended(5.0) == 0
        assert task.done()
        lines = [e for e in logs if e["event"] == "rpc"]
    assert [(e["method"], e["code"]) for e in lines] == [("Slow", "CANCELLED")]
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_calls_ended_gives_up_after_its_bound() -> None:
    servicer = Servicer()
    task = asyncio.ensure_future(servicer.Slow(object(), Context()))
    await servicer.started.wait()
    assert await rpc.calls_ended(0.05) == 1  # still running: counted, not awaited
    task.cancel()
    assert await rpc.calls_ended(5.0) == 0
