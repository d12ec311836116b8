"""Planned recycling: replace a child after N requests or above an RSS limit.

Off by default. Long-running inference servers can grow (fragmentation, caches); an
operator may prefer a fresh child every so often. Recycling uses the swap path, so the
replacement starts beside the old child and takes over only once ready: no call fails.
A child is recycled at most once per ``min_uptime`` seconds, so a limit set below what a
fresh child needs cannot cause a recycling loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from supervisor import State, SupervisorError

from ..config.inference_mode import InferenceMode
from .model import Model
from .swaps import SwapManager

if TYPE_CHECKING:
    from .pool import Pool

_log = structlog.get_logger("llamad.recycle")


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def recycle_reason(child: Model, after_requests: int, max_rss: int,
                   min_uptime: float) -> str | None:
    """Why ``child`` should be recycled now, or None."""
    sup = child.supervisor
    if child.mode.kind is not InferenceMode.EMBEDDED:  # an endpoint is not ours to recycle
        return None
    if sup.state is not State.RUNNING or sup.uptime() < min_uptime:
        return None
    served = child.admission.served_by(sup.pid)
    if after_requests and served >= after_requests:
        return f"recycle: served {served} requests (recycle.after_requests = {after_requests})"
    if max_rss:
        rss = rss_bytes(sup.pid)
        if rss is not None and rss > max_rss:
            return (f"recycle: RSS {rss >> 20} MiB above recycle.max_rss_mb = "
                    f"{max_rss >> 20}")
    return None


async def recycle_loop(registry: Pool, swaps: SwapManager, *,
                       after_requests: int, max_rss_mb: int, interval: float,
                       min_uptime: float) -> None:
    """Check every ``interval`` seconds; recycle through the swap path. Runs until cancelled."""
    max_rss = max_rss_mb * 1024 * 1024
    while True:
        await asyncio.sleep(interval)
        for role, child in registry.roles().items():  # each role's own model
            reason = recycle_reason(child, after_requests, max_rss, min_uptime)
            if reason is None:
                continue
            _log.info("recycling child", role=role, pid=child.supervisor.pid, reason=reason)
            with contextlib.suppress(SupervisorError):
                # A swap already running (or a failed launch) just means: try next time.
                await swaps.swap_to(role, child.setup, reason=reason)
