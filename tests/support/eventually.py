"""Waiting for something that happens in the background (a watcher's scan, a rescan, a
process's exit): poll a check until it holds, failing after a bound that is there for a
broken component only, far above what a working one needs on a loaded machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tests.support.load import patience


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = patience(10.0),
                     what: str = "the condition", interval: float = 0.05) -> float:
    """Poll ``check`` every ``interval`` seconds until it returns True; the seconds it
    took. Raises AssertionError naming ``what`` after ``timeout`` seconds."""
    began = time.monotonic()
    while not await check():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(interval)
    return time.monotonic() - began
