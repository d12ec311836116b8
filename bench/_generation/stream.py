"""Streaming in ``bench.bench_generation``: the same prompts through llamad and directly."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench._daemon import Running
from bench._direct import child_http
from bench._generation.common import Guard, Sample, StreamResult, Texts, sse_choices, started
from bench._support import (
    cpu_snap,
)
from llamad_protocol.v1 import inference_pb2

# -- streaming ---------------------------------------------------------------------------


def completion_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """What llamad sends the child for a greedy Generate (supervisor/_client.py)."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}


async def via_llamad(running: Running, prompt: str, max_tokens: int, rnd: int, i: int) -> Sample:
    request = inference_pb2.GenerateRequest(
        prompt=prompt,
        sampling=inference_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )
    texts = Texts()
    server: float | None = None
    async for msg in running.inference.Generate(request, timeout=300):
        texts.add(msg.text)
        if msg.HasField("usage"):
            server = msg.usage.time_to_first_token_ms / 1000
    return texts.sample("llamad", rnd, i, server)


async def via_direct(http: httpx.AsyncClient, prompt: str, max_tokens: int, rnd: int,
                     i: int) -> Sample:
    texts = Texts()
    async for choice in sse_choices(http, "/v1/completions",
                                    completion_body(prompt, max_tokens), "direct"):
        texts.add(choice.get("text") or "")
    return texts.sample("direct", rnd, i)


class Direct:
    """An HTTP client to the generation child's socket (with its key), renewed if the
    child is replaced."""

    def __init__(self) -> None:
        self.socket = ""
        self.http: httpx.AsyncClient | None = None

    async def client(self, running: Running) -> httpx.AsyncClient:
        child = await running.generation()
        if self.http is None or child.socket != self.socket:
            if self.http is not None:
                await self.http.aclose()
            self.socket = child.socket
            self.http = child_http(child.socket, child.pid,
                                   timeout=httpx.Timeout(300.0, connect=5.0))
        return self.http

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()


async def measure(running: Running, direct: Direct, prompts: Sequence[str], *, i: int,
                  rnd: int, path: str, max_tokens: int, guard: Guard) -> Sample:
    """One request, redone (after a quiet spell and an unmeasured request of the previous
    prompt, which restores the child's cache state) while it is disturbed; warm-up
    requests are not checked."""
    label = f"round {rnd} prompt {i} via {path}"
    failures = 0
    redo = False
    while True:
        try:
            if redo:
                await guard.quiet()
                filler = prompts[(i - 1) % len(prompts)]
                await via_direct(await direct.client(running), filler, 8, -1, -1)
            http = await direct.client(running)
            before = cpu_snap()
            if path == "llamad":
                sample = await via_llamad(running, prompts[i], max_tokens, rnd, i)
            else:
                sample = await via_direct(http, prompts[i], max_tokens, rnd, i)
        except (grpc.aio.AioRpcError, httpx.HTTPError) as exc:
            # On a shared machine someone else's cleanup may kill our child: wait for
            # llamad to restart it, then redo the request.
            failures += 1
            if failures > 5:
                raise
            guard.redone += 1
            print(f"  {label}: failed ({type(exc).__name__}); redoing it", flush=True)
            await running.wait_serving()
            redo = True
            continue
        if rnd == 0 or guard.kept(before, label):
            return sample
        redo = True


async def bench_stream(runtime: str, model: Path, prompts: Sequence[str], max_tokens: int,
                       rounds: int, *, threads: int, guard: Guard) -> StreamResult:
    """Each round sends every prompt once per path, in two passes; in pass 0 prompt i goes
    to llamad when ``i + round`` is even, in pass 1 to the other path. Consecutive requests
    always carry different prompts, and both requests of a prompt follow the same prompt."""
    samples: list[Sample] = []
    await guard.quiet()
    async with started(runtime, model, threads) as (running, ready):
        direct = Direct()
        try:
            print(f"  [{runtime}] daemon ready in {ready:.2f}s", flush=True)
            for rnd in range(rounds + 1):  # round 0 is the warm-up
                began = time.perf_counter()
                for swap in (0, 1):
                    for i in range(len(prompts)):
                        path = "llamad" if (i + rnd + swap) % 2 == 0 else "direct"
                        sample = await measure(running, direct, prompts, i=i, rnd=rnd,
                                               path=path, max_tokens=max_tokens, guard=guard)
                        if rnd > 0:
                            samples.append(sample)
                what = "warm-up" if rnd == 0 else f"round {rnd}/{rounds}"
                print(f"  [{runtime}] {what}: {time.perf_counter() - began:.1f}s", flush=True)
        finally:
            await direct.aclose()
    return StreamResult(runtime, model.name, samples)
