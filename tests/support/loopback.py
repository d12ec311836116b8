"""Real asyncio TCP servers on a loopback port 0 for the HTTP client's unit tests
(tests/unit/test_loopback_*.py): each serves connections with the handler a test gives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def loopback_servers() -> AsyncIterator[Callable[[Handler], Awaitable[int]]]:
    """``listen(handler)`` starts a server on 127.0.0.1 port 0 whose connections
    ``handler`` serves, and returns its port; every server is closed at the end."""
    servers: list[asyncio.Server] = []

    async def listen(handler: Handler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    try:
        yield listen
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()
