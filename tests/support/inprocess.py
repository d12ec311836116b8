"""A real gRPC server on a loopback port 0, in-process, for unit tests of servicers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

Register = Callable[[grpc.aio.Server], None]


@contextlib.asynccontextmanager
async def serving(register: Register) -> AsyncIterator[grpc.aio.Channel]:
    """A real gRPC server on a loopback port 0 with the servicers ``register`` adds."""
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(0)
