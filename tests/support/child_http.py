"""Reaching a daemon's child directly, as its operator (the daemon's user, or root) can for
debugging: over the child's private UNIX socket (Status shows it), with the per-launch key
read from the child's environment (``/proc/PID/environ``, readable by its owner and root
only). Tests use it to look at what llamad's API does not show (``/slots``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

KEY_ENV = b"LLAMA_API_KEY="


def child_key(pid: int) -> str:
    """The API key a child was started with."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(KEY_ENV):
            return item[len(KEY_ENV):].decode()
    raise LookupError(f"pid {pid} has no {KEY_ENV.decode()[:-1]} in its environment")


def child_http(socket: str, pid: int, *, key: bool = True,
               timeout: float = 30.0) -> httpx.AsyncClient:
    """An httpx client for the child on ``socket`` (its process ``pid``), sending its key
    unless ``key`` is False."""
    headers = {"Authorization": f"Bearer {child_key(pid)}"} if key else {}
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket),
                             base_url="http://localhost", headers=headers,
                             trust_env=False, timeout=timeout)


async def generation_idle(socket: str, pid: int, timeout: float = 5.0) -> bool:
    """Whether llama-server's ``/slots`` (``[child] slots = true``) shows no slot
    processing within ``timeout``."""
    deadline = time.monotonic() + timeout
    async with child_http(socket, pid) as http:
        while time.monotonic() < deadline:
            slots = (await http.get("/slots")).json()
            if not any(s.get("is_processing") for s in slots):
                return True
            await asyncio.sleep(0.05)
    return False
