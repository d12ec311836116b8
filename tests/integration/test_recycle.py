"""Planned recycling with real children, through the make-before-break path."""

from __future__ import annotations

import asyncio
import time

import pytest

from llamad_protocol.v1 import common_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.support.daemon import Clients, config_env, serving

pytestmark = pytest.mark.integration
GEN = common_pb2.CHILD_ROLE_GENERATION


async def wait_swap(c: Clients, pid: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = await c.child(GEN)
        if status.pid not in (0, pid) and status.last_swap.reason:
            return str(status.last_swap.reason)
        assert time.monotonic() < deadline, "never recycled"
        await asyncio.sleep(0.1)


async def test_recycle_after_n_requests(llama_server: str) -> None:
    """After N served calls the child is replaced by a fresh one; no call fails."""
    async with serving(config_env(
        "llama-server", LLAMAD_EMBEDDING_ENABLED="false", LLAMAD_RECYCLE_AFTER_REQUESTS="3",
        LLAMAD_RECYCLE_CHECK_INTERVAL="0.2", LLAMAD_RECYCLE_MIN_UPTIME="0")) as (_, c):
        pid = (await c.child(GEN)).pid
        for _ in range(2):
            _ = [m async for m in c.inference.Generate(pb.GenerateRequest(
                prompt="hi", sampling=pb.SamplingParams(max_tokens=2)))]
        await asyncio.sleep(0.6)
        assert (await c.child(GEN)).pid == pid  # two calls: not yet
        _ = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="hi", sampling=pb.SamplingParams(max_tokens=2)))]
        reason = await wait_swap(c, pid)
        assert "served 3 requests" in reason
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="hi", sampling=pb.SamplingParams(max_tokens=2)))]
        assert out[-1].usage.completion_tokens >= 1


async def test_recycle_above_rss_limit_at_most_once_per_min_uptime(llama_server: str) -> None:
    """A child above the RSS limit is recycled, but not again before min_uptime passes."""
    async with serving(config_env(
        "llama-server", LLAMAD_EMBEDDING_ENABLED="false", LLAMAD_RECYCLE_MAX_RSS_MB="1",
        LLAMAD_RECYCLE_CHECK_INTERVAL="0.2", LLAMAD_RECYCLE_MIN_UPTIME="1.5")) as (_, c):
        pid = (await c.child(GEN)).pid
        reason = await wait_swap(c, pid)
        assert "RSS" in reason
        second = (await c.child(GEN)).pid
        await asyncio.sleep(0.8)
        assert (await c.child(GEN)).pid == second  # protected by min_uptime
