"""Part 3 of ``bench.bench_swap``: embeddings via llamad vs llama-server, and its section."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import re
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._daemon import serving
from bench._direct import child_http
from bench._support import EMBED_MODEL, MONITOR, PartNote, model_file, table
from bench._swap.common import (
    EMB,
    EMBED_HEADING,
    ORDERS,
    THREADS,
    child_status,
    embedding_env,
    med,
    started,
)
from llamad_protocol.v1 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc

# -- part 3: embeddings --------------------------------------------------------------------


@dataclass
class EmbedRound:
    """One round: a block of ``calls`` back-to-back calls each way (seconds are per call,
    the block's time over its calls; ``calls_s`` each call's own time)."""

    size: int
    rep: int
    calls: int
    llamad: float
    direct: float  # JSON numbers, as a client gets by default
    direct64: float  # encoding_format base64, as llamad asks the child
    calls_s: dict[str, list[float]]  # path -> seconds of each call of its block
    order: tuple[str, ...]
    start: float  # perf_counter
    end: float
    foreign: float = math.nan  # other processes' cores during the round (filled in later)


@dataclass
class EmbedResult:
    rounds: list[EmbedRound]
    tokens: dict[int, float]  # batch size -> mean tokens per text
    sentences: int
    agreement: float  # smallest cosine between llamad's and the child's vectors
    daemon: str = "process"  # the daemon ran as its own process, or "in-process"
    isolated: dict[str, list[float]] = field(default_factory=dict)  # path -> call seconds
    concurrent: list[dict[str, float]] = field(default_factory=list)  # per round: path -> s


def corpus_sentences(path: Path, limit: int) -> list[str]:
    """Sentences of 60-400 characters from the corpus texts, in corpus order."""
    out: list[str] = []
    seen: set[str] = set()
    with path.open() as fh:
        for line in fh:
            text = " ".join(str(json.loads(line).get("text") or "").split())
            for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                if 60 <= len(s) <= 400 and s not in seen:
                    seen.add(s)
                    out.append(s)
                    if len(out) >= limit:
                        return out
    return out


async def token_counts(http: httpx.AsyncClient, texts: Sequence[str]) -> list[int]:
    counts = []
    for text in texts:
        resp = await http.post("/tokenize", json={"content": text, "add_special": True})
        resp.raise_for_status()
        counts.append(len(resp.json()["tokens"]))
    return counts


async def embed_llamad(stub: Any, batch: Sequence[str]) -> list[list[float]]:
    resp = await stub.Embed(inference_pb2.EmbedRequest(texts=list(batch)), timeout=120)
    return [list(e.values) for e in resp.embeddings]


async def embed_direct(http: httpx.AsyncClient, batch: Sequence[str]) -> list[list[float]]:
    resp = await http.post("/v1/embeddings", json={"input": list(batch)})
    resp.raise_for_status()
    data = resp.json()["data"]
    return [list(d["embedding"]) for d in sorted(data, key=lambda d: int(d["index"]))]


async def embed_direct64(http: httpx.AsyncClient, batch: Sequence[str]) -> list[list[float]]:
    """As :func:`embed_direct`, asking for base64 float32 (what llamad asks its child for)."""
    resp = await http.post("/v1/embeddings",
                           json={"input": list(batch), "encoding_format": "base64"})
    resp.raise_for_status()
    data = resp.json()["data"]
    return [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist()
            for d in sorted(data, key=lambda d: int(d["index"]))]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


@contextlib.asynccontextmanager
async def daemon_process(env: dict[str, str], state_dir: Path
                         ) -> AsyncIterator[tuple[Any, Any, float]]:
    """``python -m daemon serve`` as operators run it (its own process; log in
    ``state_dir``); yield ``(inference stub, control stub, seconds until ready)``."""
    began = time.perf_counter()
    async with serving(env, state_dir / "daemon.log") as (_, channel):
        ready = time.perf_counter() - began
        yield (inference_pb2_grpc.InferenceServiceStub(channel),
               control_pb2_grpc.ControlServiceStub(channel),
               ready)


@contextlib.asynccontextmanager
async def embedding_daemon(args: argparse.Namespace, state_dir: Path
                           ) -> AsyncIterator[tuple[Any, tuple[str, int], float]]:
    """The embedding-only daemon, in its own process (``--embed-daemon process``, as it
    runs in production) or in this one; yield ``(inference stub, child (socket, pid),
    ready s)``: the child is reached over its socket with the key from its environment."""
    env = embedding_env(state_dir, model_file(EMBED_MODEL))
    if args.embed_daemon == "process":
        async with daemon_process(env, state_dir) as (inference, control, ready):
            status = await control.Status(control_pb2.StatusRequest(), timeout=10)
            child = next(c for c in status.children if c.role == EMB)
            yield inference, (child.socket, child.pid), ready
    else:
        async with started(env, "embedding") as (running, ready):
            child = await child_status(running, "embedding")
            yield running.inference, (child.socket, child.pid), ready


ISOLATED_IDLE = 0.1  # seconds without a call before each isolated call
CONCURRENT = (4, 10)  # clients, batch-1 calls each, per way per round
# Calls per path per round: ~0.25 s of work at batch 1, ~0.3 s at 16, ~0.6 s at 64.
EMBED_BLOCK = {1: 20, 16: 2, 64: 1}
EMBED_PATHS: dict[str, Callable[[Any, Sequence[str]], Awaitable[list[list[float]]]]] = {
    "llamad": embed_llamad, "direct": embed_direct, "direct64": embed_direct64}


async def bench_embed(args: argparse.Namespace, state_dir: Path) -> EmbedResult:
    pool = corpus_sentences(args.corpus, 1500)
    reps = {1: args.embed_reps[0], 16: args.embed_reps[1], 64: args.embed_reps[2]}
    async with embedding_daemon(args, state_dir) as (inference, (sock, pid), ready):
        print(f"  daemon ready in {ready:.2f}s ({args.embed_daemon}); child on {sock}",
              flush=True)
        async with child_http(sock, pid, timeout=httpx.Timeout(120.0, connect=5.0)) as http:
            counts = await token_counts(http, pool)
            texts = [t for t, n in zip(pool, counts, strict=True) if 20 <= n <= 60]
            ntok = dict(zip(pool, counts, strict=True))
            print(f"  {len(texts)} sentences of 20-60 tokens (of {len(pool)} cut)", flush=True)
            if len(texts) < 64:
                raise SystemExit(f"bench: only {len(texts)} sentences of 20-60 tokens in "
                                 f"{args.corpus}")
            target = {"llamad": inference, "direct": http, "direct64": http}
            rounds: list[EmbedRound] = []
            tokens: dict[int, float] = {}
            agreement = 1.0
            offset = 0
            for size, n in reps.items():
                block = EMBED_BLOCK[size]
                used: list[int] = []
                for rep in range(max(1, n // block) + 1):  # rep 0 is the warm-up
                    batches = [[texts[(offset + k * size + j) % len(texts)]
                                for j in range(size)] for k in range(block)]
                    offset += block * size
                    used += [ntok[t] for b in batches for t in b]
                    seconds: dict[str, float] = {}
                    each: dict[str, list[float]] = {}
                    vectors: dict[str, list[list[float]]] = {}
                    round_start = time.perf_counter()
                    order = ORDERS[rep % len(ORDERS)]
                    for path in order:
                        call = EMBED_PATHS[path]
                        began = time.perf_counter()
                        each[path] = []
                        for batch in batches:
                            t0 = time.perf_counter()
                            vectors[path] = await call(target[path], batch)
                            each[path].append(time.perf_counter() - t0)
                            if len(vectors[path]) != size:
                                raise RuntimeError(f"{path}: wrong number of vectors")
                        seconds[path] = (time.perf_counter() - began) / block
                    if rep == 1 and size == 16:
                        agreement = min(agreement, *(cosine(a, b) for other in (
                            "direct", "direct64") for a, b in zip(
                            vectors["llamad"], vectors[other], strict=True)))
                    if rep:
                        rounds.append(EmbedRound(size, rep, block, seconds["llamad"],
                                                 seconds["direct"], seconds["direct64"], each,
                                                 order, round_start, time.perf_counter()))
                tokens[size] = statistics.fmean(used)
                mine = [r for r in rounds if r.size == size]
                print(f"  batch {size}: {len(mine)} rounds of {block}, llamad "
                      f"{size / med([r.llamad for r in mine]):.1f} texts/s, direct "
                      f"{size / med([r.direct for r in mine]):.1f} texts/s", flush=True)
            concurrent: list[dict[str, float]] = []
            clients, each_calls = CONCURRENT
            for rep in range(args.embed_concurrent + 1):  # rep 0 is the warm-up
                spent: dict[str, float] = {}
                for path in ORDERS[rep % len(ORDERS)]:
                    base = offset
                    offset += clients * each_calls

                    async def client(c: int, path: str = path, base: int = base) -> None:
                        for j in range(each_calls):
                            text = texts[(base + c * each_calls + j) % len(texts)]
                            if len(await EMBED_PATHS[path](target[path], [text])) != 1:
                                raise RuntimeError(f"{path}: wrong number of vectors")

                    began = time.perf_counter()
                    await asyncio.gather(*(client(c) for c in range(clients)))
                    spent[path] = time.perf_counter() - began
                if rep:
                    concurrent.append(spent)
            isolated: dict[str, list[float]] = {path: [] for path in EMBED_PATHS}
            for rep in range(args.embed_isolated):
                for path in ORDERS[rep % len(ORDERS)]:
                    await asyncio.sleep(ISOLATED_IDLE)
                    began = time.perf_counter()
                    await EMBED_PATHS[path](target[path], [texts[(offset + rep) % len(texts)]])
                    isolated[path].append(time.perf_counter() - began)
    await asyncio.sleep(MONITOR.period * 1.5)  # let the monitor cover the last round
    for r in rounds:
        r.foreign = MONITOR.foreign(r.start, r.end)
    return EmbedResult(rounds, tokens, len(texts), agreement, args.embed_daemon, isolated,
                       concurrent)


def embed_section(r: EmbedResult, env: list[str], note: PartNote, command: str) -> list[str]:
    out = [EMBED_HEADING, "", *env, note.line(),
           "- Daemon: " + ("`python -m daemon serve` in its own process, as operators run "
                           "it; the clients below run in the benchmark's process"
                           if r.daemon == "process" else "inside the benchmark's process "
                           "(`--embed-daemon in-process`: the clients share its event loop)")
           + f"; embedding child only (`{EMBED_MODEL}`, llama-server, {THREADS} threads, "
           "2 slots, production defaults). llamad: gRPC `Embed` (grpc.aio, default request, "
           "so llamad L2-normalises), vectors read into lists. direct: `POST /v1/embeddings` "
           "(httpx) to the child's port from Status, the texts as llamad sends them, JSON "
           "numbers parsed into lists (a client's default). direct base64: the same with "
           "`encoding_format: base64`, decoded with numpy: what llamad itself asks the child "
           "for (with its lean keep-alive client, supervisor/http/_loopback.py).",
           f"- Texts: {r.sentences} distinct sentences of 20-60 tokens (the child's tokenizer) "
           "cut from the CISI corpus; each round sends the same batches the three ways, each "
           "way as a block of back-to-back calls ("
           + ", ".join(f"{n} at batch {b}" for b, n in EMBED_BLOCK.items())
           + "), the order rotating round by round; successive rounds take the next "
           "sentences; one warm-up round per size discarded. ms/call is a block's time over "
           "its calls (median over rounds): the rate a client embedding a corpus gets. "
           "Smallest cosine between llamad's vectors and the direct ones: "
           f"{r.agreement:.6f}.",
           ""]
    rows = []
    notes = []
    for size in sorted({p.size for p in r.rounds}):
        every = [p for p in r.rounds if p.size == size]
        mine = [p for p in every if not p.foreign > MONITOR.busy]
        if len(mine) < len(every) / 2:
            mine = every  # mostly disturbed: keep them all, and say so below
        lm, dm = med([p.llamad for p in mine]), med([p.direct for p in mine])
        d64 = med([p.direct64 for p in mine])
        ratio, ratio64 = dm / lm, d64 / lm
        paired = med([p.direct / p.llamad for p in mine])
        rows.append([str(size), f"{r.tokens[size]:.0f}", f"{len(mine)}/{len(every)}",
                     f"{size / lm:.1f}", f"{size / dm:.1f}", f"{size / d64:.1f}",
                     f"{lm * 1000:.2f}", f"{dm * 1000:.2f}", f"{(lm - dm) * 1000:+.2f}",
                     f"**{ratio:.3f}** {'ok' if ratio >= 0.97 else 'MISS'}", f"{paired:.3f}",
                     f"**{ratio64:.3f}** {'ok' if ratio64 >= 0.97 else 'MISS'}"])
        if EMBED_BLOCK[size] > 1:
            first = {k: med([p.calls_s[k][0] for p in mine]) for k in EMBED_PATHS}
            rest = {k: med([t for p in mine for t in p.calls_s[k][1:]]) for k in EMBED_PATHS}
            notes.append(f"- Batch {size}, each call's own time, median ms, the first call of "
                          "a block (after the other two ways' blocks) against the block's "
                          "other calls: " + "; ".join(
                              f"{k} {first[k] * 1000:.2f} vs {rest[k] * 1000:.2f} "
                              f"({(first[k] - rest[k]) * 1000:+.2f})" for k in EMBED_PATHS)
                          + ".")
    out += table(["batch", "tokens/text", f"rounds kept (others <= {MONITOR.busy} cores)",
                  "llamad texts/s", "direct texts/s", "direct base64 texts/s",
                  "llamad ms/call", "direct ms/call", "added ms/call",
                  "throughput llamad/direct (>= 0.97)", "median of per-round ratios",
                  "llamad/direct base64 (>= 0.97)"], rows)
    if r.concurrent:
        clients, each_calls = CONCURRENT
        rate = {k: clients * each_calls / med([c[k] for c in r.concurrent]) for k in EMBED_PATHS}
        ratio = rate["llamad"] / rate["direct"]
        ratio64 = rate["llamad"] / rate["direct64"]
        paired = med([c["direct"] / c["llamad"] for c in r.concurrent])
        out += ["", f"Concurrent clients: {clients} clients at once, each sending {each_calls} "
                "batch-1 calls back to back, per way per round (the ways in rotation, "
                f"{len(r.concurrent)} rounds after a warm-up); texts/s from the median round.",
                ""]
        out += table(["clients", "llamad texts/s", "direct texts/s", "direct base64 texts/s",
                      "throughput llamad/direct (>= 0.97)", "median of per-round ratios",
                      "llamad/direct base64"],
                     [[str(clients), f"{rate['llamad']:.1f}", f"{rate['direct']:.1f}",
                       f"{rate['direct64']:.1f}",
                       f"**{ratio:.3f}** {'ok' if ratio >= 0.97 else 'MISS'}", f"{paired:.3f}",
                       f"{ratio64:.3f}"]])
    if r.isolated and all(r.isolated.values()):
        iso = {k: med(v) for k, v in r.isolated.items()}
        notes.append(f"- Isolated calls (batch 1, {ISOLATED_IDLE * 1000:.0f} ms without any "
                      f"call before each, the ways in rotation, {len(r.isolated['llamad'])} "
                      "each), median ms: " + "; ".join(f"{k} {v * 1000:.2f}"
                                                       for k, v in iso.items())
                      + f"; direct/llamad {iso['direct'] / iso['llamad']:.3f}. Every way, the "
                      "direct ones too, is slower after an idle spell than back to back (the "
                      "child's threads and the machine waking): this is the latency of one "
                      "query now and then.")
    out += ["", *notes, "", f"Reproduce: `{command}`"]
    return out
