"""Talking to a llamad child directly, as the benches that compare llamad with the child it
runs do: over the child's private UNIX socket (Status shows it), with the per-launch key
read from the child's environment (``/proc/PID/environ``: the daemon's user or root only;
tests/support/child_http.py's ``child_key``).
"""

from __future__ import annotations

import httpx

from tests.support.child_http import child_key

__all__ = ["child_http", "child_key"]


def child_http(socket: str, pid: int, *, timeout: float | httpx.Timeout = 300.0,
               limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    """An httpx client for the child on ``socket`` (process ``pid``), sending its key."""
    transport = httpx.AsyncHTTPTransport(
        uds=socket, limits=limits or httpx.Limits(max_connections=100,
                                                  max_keepalive_connections=20))
    return httpx.AsyncClient(transport=transport, base_url="http://localhost",
                             headers={"Authorization": f"Bearer {child_key(pid)}"},
                             trust_env=False, timeout=timeout)
