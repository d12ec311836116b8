"""Part 2 of ``bench.bench_swap``: the generation child killed under load, and its section."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench._support import DEFAULT_MODEL, MONITOR, RETRYABLE, PartNote, f3, model_file, table
from bench._swap.common import (
    CRASH_HEADING,
    POLL,
    THREADS,
    child_status,
    f2,
    generation_env,
    med,
    started,
)
from bench._swap.load import Attempt, Load
from llamad_protocol.v1 import control_pb2
from supervisor import State

# -- part 2: crash under load --------------------------------------------------------------


@dataclass
class KillRun:
    index: int
    pid: int
    at: float  # perf_counter of the kill
    detect: float  # kill until BACKOFF, s
    backoff: float  # BACKOFF until STARTING, s
    restart: float  # STARTING until RUNNING, s
    first_token: float  # kill until a call sent after it streamed a token, s
    first_ok: float  # kill until a call sent after it completed, s
    foreign: float = math.nan  # other processes' cores from the kill until service was back


@dataclass
class CrashResult:
    clients: int
    deadline: float
    cold: list[float]  # Daemon.start() until RUNNING + SERVING, s
    cold_child: list[float]  # the supervisor's STARTING -> RUNNING in those starts, s
    kills: list[KillRun]
    attempts: list[Attempt]
    warm_end: float
    restarts: int
    extra_args: str = ""


async def cold_start(env: dict[str, str]) -> tuple[float, float]:
    async with started(env) as (running, ready):
        began = running.first_after(State.STARTING, 0.0)
        return ready, running.first_after(State.RUNNING, began) - began


async def bench_crash(args: argparse.Namespace, state_dir: Path) -> CrashResult:
    model = model_file(DEFAULT_MODEL)
    env = generation_env(state_dir, model, args.extra_args, LLAMAD_RESTART_BREAKER_RESET="10")
    cold: list[float] = []
    cold_child: list[float] = []
    for i in range(args.cold_starts):
        ready, child = await cold_start(env)
        cold.append(ready)
        cold_child.append(child)
        print(f"  cold start {i + 1}/{args.cold_starts}: {ready:.2f}s (child {child:.2f}s)",
              flush=True)
    kills: list[KillRun] = []
    async with started(env) as (running, ready):
        began = running.first_after(State.STARTING, 0.0)
        cold_child.append(running.first_after(State.RUNNING, began) - began)
        load_ = Load(running.daemon.address, clients=args.clients, max_tokens=args.max_tokens,
                     deadline=args.crash_deadline)
        load_.start()
        await asyncio.sleep(args.warmup)
        warm_end = time.perf_counter()
        for k in range(args.kills):
            while True:
                status = await child_status(running, "generation")
                if (status.state == control_pb2.CHILD_STATE_RUNNING
                        and status.uptime_seconds >= args.kill_spacing):
                    break
                await asyncio.sleep(0.2)
            killed = time.perf_counter()
            os.kill(status.pid, signal.SIGKILL)
            first_token = first_ok = math.nan
            limit = killed + 120
            while time.perf_counter() < limit and (math.isnan(first_token)
                                                    or math.isnan(first_ok)):
                if math.isnan(first_token):
                    firsts = [f for s, f in load_.first_tokens if s > killed]
                    if firsts:
                        first_token = min(firsts) - killed
                if math.isnan(first_ok):
                    oks = [a.end for a in load_.attempts if a.start > killed and a.code == "OK"]
                    if oks:
                        first_ok = min(oks) - killed
                await asyncio.sleep(POLL)
            try:
                backoff_at = running.first_after(State.BACKOFF, killed)
                starting_at = running.first_after(State.STARTING, backoff_at)
                running_at = running.first_after(State.RUNNING, starting_at)
                times = (backoff_at - killed, starting_at - backoff_at, running_at - starting_at)
            except RuntimeError:
                times = (math.nan, math.nan, math.nan)
            run = KillRun(k + 1, status.pid, killed, *times, first_token, first_ok)
            kills.append(run)
            print(f"  kill {k + 1}/{args.kills} (pid {status.pid}): first token after "
                  f"{first_token:.2f}s, first completed call after {first_ok:.2f}s (detect "
                  f"{run.detect * 1000:.0f}ms, backoff {run.backoff:.3f}s, restart "
                  f"{run.restart:.2f}s)", flush=True)
        await asyncio.sleep(2.0)
        await load_.stop()
        restarts = int((await child_status(running, "generation")).restarts)
    for run in kills:
        run.foreign = MONITOR.foreign(run.at, run.at + (
            run.first_token if not math.isnan(run.first_token) else 120.0))
    return CrashResult(args.clients, args.crash_deadline, [*cold, ready], cold_child, kills,
                       load_.attempts, warm_end, restarts, args.extra_args)


def crash_section(r: CrashResult, env: list[str], note: PartNote, command: str) -> list[str]:
    measured = [a for a in r.attempts if a.start >= r.warm_end]
    cold = med(r.cold)
    out = [CRASH_HEADING, "", *env, note.line(),
           f"- Daemon: gemma-3-270m on llama-server, {THREADS} threads, 4 slots, embedding "
           "child disabled; production restart settings (backoff base 0.5 s, probe every "
           "5 s) except restart.breaker_reset = 10 s (production 60 s), so that each kill is "
           "an isolated crash after stable running: its restart is a *first* restart, whose "
           "backoff is drawn uniformly from [0, 0.5 s]"
           + (f"; generation.extra_args `{r.extra_args}`." if r.extra_args else "."),
           f"- Load: {r.clients} grpc.aio clients, greedy `Generate` (max_tokens as in the "
           f"swap part), deadline {r.deadline:.0f} s per call; UNAVAILABLE and "
           "RESOURCE_EXHAUSTED are retried after `retry-after-ms` (1 s without one), other "
           "failures are counted and the client moves on.",
           "- Cold start: `Daemon.start()` until Status says RUNNING and health `generation` "
           f"says SERVING, no load, a fresh daemon each ({len(r.cold)} runs, the last one is "
           "the daemon then crashed). Recovery: `kill -9` of the child (pid from Status) "
           "until a call sent after the kill streams its first token (*service back*), and "
           "until such a call completes.",
           ""]
    rows = []
    for k in r.kills:
        rows.append([str(k.index), f"**{f2(k.first_token)}** "
                     f"{'ok' if k.first_token <= cold + 1 else 'MISS'}",
                     f2(k.first_ok), f"{k.detect * 1000:.0f}", f3(k.backoff), f2(k.restart),
                     f2(k.first_token - k.detect - k.backoff - k.restart), f2(k.foreign)])
    out += table(["kill", "kill -> service back s (<= cold start + 1 s)",
                  "kill -> first completed call s", "detect ms", "backoff drawn s",
                  "restart (STARTING->RUNNING) s", "clients' lag after RUNNING s",
                  "others' cores"], rows)
    tok = [k.first_token for k in r.kills]
    out += ["", "Against the cold start of the same model in the same run:", ""]
    out += table(["cold start median s", "runs s", "child STARTING->RUNNING median s",
                  "kill -> service back median s", "max s", "target (cold + 1 s)"],
                 [[f"**{f2(cold)}**", ", ".join(f2(x) for x in r.cold), f2(med(r.cold_child)),
                   f"**{f2(med(tok))}**", f2(max(tok, default=math.nan)),
                   f"{'ok' if med(tok) <= cold + 1 else 'MISS'} (median); "
                   f"{sum(t <= cold + 1 for t in tok)}/{len(tok)} kills within"]])
    ok = [a for a in measured if a.code == "OK"]
    unavailable = [a for a in measured if a.code == "UNAVAILABLE"]
    exhausted = [a for a in measured if a.code == "RESOURCE_EXHAUSTED"]
    deadline = [a for a in measured if a.code == "DEADLINE_EXCEEDED"]
    others = [a for a in measured if a.code not in ("OK", *RETRYABLE, "DEADLINE_EXCEEDED")]
    hung = [a for a in measured if a.latency > r.deadline + 1]
    mid = [a for a in unavailable if a.tokens]
    hints = [a.retry_after_ms for a in unavailable if a.retry_after_ms is not None]
    out += ["", f"Outcomes of every call attempt after the warm-up ({len(measured)} "
            f"attempts, {r.restarts} restarts in Status):", ""]
    out += table(
        ["completed", "UNAVAILABLE with retry-after-ms", "UNAVAILABLE without",
         "of which mid-stream", "RESOURCE_EXHAUSTED with / without hint",
         "DEADLINE_EXCEEDED", "past deadline + 1 s (hung)", "other", "longest attempt s"],
        [[str(len(ok)), f"{len(hints)} (hint median {med([float(h) for h in hints]):.0f} ms, "
          f"range {min(hints, default=0)}-{max(hints, default=0)})",
          str(len(unavailable) - len(hints)), str(len(mid)),
          f"{sum(a.retry_after_ms is not None for a in exhausted)} / "
          f"{sum(a.retry_after_ms is None for a in exhausted)}",
          str(len(deadline)), f"**{len(hung)}** {'ok' if not hung else 'MISS'}",
          ", ".join(f"{c} x{n}" for c, n in Counter(a.code for a in others).items()) or "0",
          f2(max((a.latency for a in measured), default=math.nan))]])
    reasons = Counter(re.sub(r"\d+(\.\d+)?", "N", a.details)[:110] for a in unavailable)
    if reasons:
        out += ["", "UNAVAILABLE messages (numbers replaced by N):", ""]
        out += [f"- {n} x `{text}`" for text, n in reasons.most_common(6)]
    out += ["", f"Reproduce: `{command}`"]
    return out
