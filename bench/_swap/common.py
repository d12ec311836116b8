"""What the parts of ``bench.bench_swap`` share: constants, the daemon, statistics."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from grpc_health.v1 import health_pb2

from bench._daemon import Running
from bench._support import pct
from daemon import Daemon, load
from llamad_protocol.v1 import common_pb2, control_pb2
from supervisor import State, StateChange

CORPUS = Path("/work/shared/data/cisi/corpus.jsonl")
THREADS = 2
# The order of the three embedding paths, rotating round by round (each first equally often).
ORDERS = (("llamad", "direct", "direct64"), ("direct", "direct64", "llamad"),
          ("direct64", "llamad", "direct"), ("llamad", "direct64", "direct"),
          ("direct", "llamad", "direct64"), ("direct64", "direct", "llamad"))
POLL = 0.02
GEN = common_pb2.CHILD_ROLE_GENERATION
EMB = common_pb2.CHILD_ROLE_EMBEDDING

SWAP_HEADING = "## Swap under load"
CRASH_HEADING = "## Crash under load"
EMBED_HEADING = "## Embedding: llamad vs direct"


# -- the machine -------------------------------------------------------------------------


# -- the daemon --------------------------------------------------------------------------


def base_env(state_dir: Path) -> dict[str, str]:
    return {
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_RETRIEVAL_ENABLED": "false",
        "LLAMAD_STATE_DIR": str(state_dir),
        "LLAMAD_CHILD_STOP_GRACE": "3",
        "LLAMAD_DRAIN_GRACE": "5",
        "LLAMAD_LOG_FORMAT": "json",
    }


def generation_env(state_dir: Path, model: Path, extra_args: str = "",
                   **extra: str) -> dict[str, str]:
    """gemma or SmolLM2 on llama-server, 2 threads, 4 slots; no embedding child."""
    env = {**base_env(state_dir),
           "LLAMAD_GENERATION_MODEL": str(model),
           "LLAMAD_GENERATION_RUNTIME": "llama-server",
           "LLAMAD_GENERATION_THREADS": str(THREADS),
           "LLAMAD_GENERATION_PARALLEL": "4",
           "LLAMAD_EMBEDDING_ENABLED": "false",
           **extra}
    if extra_args:
        env["LLAMAD_GENERATION_EXTRA_ARGS"] = extra_args
    return env


def embedding_env(state_dir: Path, model: Path) -> dict[str, str]:
    """The embedding child only, on llama-server, production defaults (2 slots)."""
    return {**base_env(state_dir),
            "LLAMAD_GENERATION_ENABLED": "false",
            "LLAMAD_EMBEDDING_MODEL": str(model),
            "LLAMAD_EMBEDDING_RUNTIME": "llama-server",
            "LLAMAD_EMBEDDING_THREADS": str(THREADS)}


@contextlib.asynccontextmanager
async def started(env: dict[str, str], role: str = "generation"
                  ) -> AsyncIterator[tuple[Running, float]]:
    """Yield ``(running, seconds from Daemon.start() to RUNNING + health SERVING)``."""
    daemon = Daemon(load(None, env=env))
    events: list[tuple[State, float]] = []

    def record(change: StateChange) -> None:
        events.append((change.new, time.perf_counter()))

    daemon.children[role].supervisor.subscribe(record)
    began = time.perf_counter()
    address = await daemon.start()
    running = Running(daemon, address, events)
    try:
        request = health_pb2.HealthCheckRequest(service=role)
        async for resp in running.health.Watch(request, timeout=300):
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                break
        ready = time.perf_counter() - began
        state = (await child_status(running, role)).state
        if state != control_pb2.CHILD_STATE_RUNNING:
            raise RuntimeError(f"health SERVING but the {role} child is in state {state}")
        yield running, ready
    finally:
        await running.close()


async def child_status(running: Running, role: str) -> control_pb2.ChildStatus:
    want = GEN if role == "generation" else EMB
    resp = await running.control.Status(control_pb2.StatusRequest(), timeout=10)
    for child in resp.children:
        if child.role == want:
            found: control_pb2.ChildStatus = child
            return found
    raise RuntimeError(f"Status lists no {role} child")


# -- statistics ---------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    return pct(values, 50)


def f2(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}"


def verdict(good: bool, value: float) -> str:
    return "" if math.isnan(value) else ("ok" if good else "MISS")


def common_prefix(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))
