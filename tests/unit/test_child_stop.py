"""Stopping a child is cancellation-safe both ways: the child is still killed and reaped
and its port released, and the caller's own cancellation is not swallowed."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from supervisor._child import _PORTS_IN_USE, ProcessChild, Timeouts, free_port
from supervisor._client import ApiShape, InferenceClient
from supervisor._clock import SystemClock
from supervisor._logring import LogRing
from supervisor._process import ChildProcess

# Ignores SIGTERM, so only the SIGKILL after the grace period stops it.
STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
           "print('up', flush=True); time.sleep(60)"


async def test_cancelling_stop_propagates_and_still_reaps_the_child() -> None:
    """A stop() cancelled while it waits out the grace period raises CancelledError in
    the caller; the child is killed and reaped anyway, and its port is released."""
    process = await ChildProcess.spawn([sys.executable, "-c", STUBBORN], ring=LogRing())
    port = free_port()
    client = InferenceClient(f"http://127.0.0.1:{port}", model_id="m",
                             api=ApiShape("/health", "/tokenize", "content", None))
    child = ProcessChild(process, client, port, SystemClock(), Timeouts(stop_grace=1.0))
    stopping = asyncio.create_task(child.stop())
    await asyncio.sleep(0.2)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert port not in _PORTS_IN_USE
    code = await asyncio.wait_for(process.wait(), 5)  # the shielded kill goes on
    assert code != 0
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
