"""Part 1 of ``bench.bench_swap``: model swaps under load, and its report section."""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench._daemon import Running
from bench._support import (
    DEFAULT_MODEL,
    MONITOR,
    SMALL_MODEL,
    PartNote,
    f3,
    model_file,
    pct,
    short,
    table,
)
from bench._swap.common import (
    GEN,
    SWAP_HEADING,
    THREADS,
    common_prefix,
    f2,
    generation_env,
    med,
    started,
    verdict,
)
from bench._swap.load import Attempt, Load
from llamad_protocol.v1 import control_pb2

# -- part 1: swap under load ---------------------------------------------------------------


@dataclass(frozen=True)
class SwapRun:
    index: int
    target: str
    start: float
    end: float
    stages: dict[str, float]  # stage -> perf_counter when the client received it
    error: str

    @property
    def total(self) -> float:
        return self.end - self.start

    @property
    def switch(self) -> float:
        """Swap sent until the new child took over (the 'draining' stage arrived)."""
        at = self.stages.get("draining", self.stages.get("done", math.nan))
        return at - self.start

    @property
    def drain(self) -> float:
        return self.end - self.stages.get("draining", math.nan)


@dataclass
class SwapResult:
    clients: int
    max_tokens: int
    warm_end: float
    steady_a: tuple[float, float]
    steady_b: tuple[float, float]
    swaps: list[SwapRun]
    attempts: list[Attempt]
    ready: float
    extra_args: str = ""
    gap: float = 3.0  # seconds between a swap's last call ending and the next swap
    served_by: list[str] = field(default_factory=list)  # per attempt: the model (text)
    foreign: list[float] = field(default_factory=list)  # per attempt: other processes' cores
    swap_foreign: list[float] = field(default_factory=list)  # per swap: the same
    mislabelled: list[int] = field(default_factory=list)  # attempt indexes


async def do_swap(running: Running, index: int, target: Path) -> SwapRun:
    request = control_pb2.SwapRequest(role=GEN, model_path=str(target),
                                      reason=f"bench swap {index}")
    stages: dict[str, float] = {}
    error = ""
    began = time.perf_counter()
    try:
        async for p in running.control.Swap(request, timeout=300):
            name = control_pb2.SwapStage.Name(p.stage).removeprefix("SWAP_STAGE_").lower()
            stages.setdefault(name, time.perf_counter())
    except grpc.aio.AioRpcError as exc:
        error = f"{exc.code().name}: {exc.details()}"
    return SwapRun(index, target.name, began, time.perf_counter(), stages, error)


async def bench_swap(args: argparse.Namespace, state_dir: Path) -> SwapResult:
    models = (model_file(DEFAULT_MODEL), model_file(SMALL_MODEL))
    async with started(generation_env(state_dir, models[0], args.extra_args)) as (
            running, ready):
        print(f"  daemon ready in {ready:.2f}s on {models[0].name}", flush=True)
        load_ = Load(running.daemon.address, clients=args.clients, max_tokens=args.max_tokens,
                     deadline=args.swap_deadline)
        load_.start()
        await asyncio.sleep(args.warmup)
        warm_end = time.perf_counter()
        print(f"  steady window on {models[0].name}: {args.steady:.0f}s", flush=True)
        await asyncio.sleep(args.steady)
        swaps: list[SwapRun] = []
        steady_b = (math.nan, math.nan)
        for i in range(args.swaps):
            target = models[(i + 1) % 2]
            run = await do_swap(running, i + 1, target)
            swaps.append(run)
            print(f"  swap {i + 1}/{args.swaps} -> {target.name}: "
                  f"{'ok' if not run.error else run.error} in {run.total:.2f}s "
                  f"(switched after {run.switch:.2f}s, drain {run.drain:.2f}s)", flush=True)
            if i == 0:
                b_start = time.perf_counter() + args.settle
                print(f"  steady window on {target.name}: {args.steady:.0f}s", flush=True)
                await asyncio.sleep(args.settle + args.steady)
                steady_b = (b_start, time.perf_counter())
            else:
                # Each call sees at most one swap: the next starts once every call running
                # at the end of this one has ended, and a gap after that.
                await load_.settled(run.end)
                await asyncio.sleep(args.gap)
        await load_.stop()
        if len(swaps) == 1:
            steady_b = (steady_b[0], min(steady_b[1], max(a.end for a in load_.attempts)))
    result = SwapResult(args.clients, args.max_tokens, warm_end, (warm_end, swaps[0].start),
                        steady_b, swaps, load_.attempts, ready, args.extra_args, args.gap)
    tag_models(result)
    result.foreign = [MONITOR.foreign(a.start, a.end) for a in result.attempts]
    result.swap_foreign = [MONITOR.foreign(s.start, s.end) for s in result.swaps]
    return result


def window_of(r: SwapResult, a: Attempt) -> str:
    """'warmup', 'steady', 'during' (overlaps a swap) or 'between'."""
    if a.start < r.warm_end:
        return "warmup"
    if any(a.start < s.end and a.end > s.start for s in r.swaps):
        return "during"
    for lo, hi in (r.steady_a, r.steady_b):
        if a.start >= lo and a.end <= hi:
            return "steady"
    return "between"


def swap_phase(r: SwapResult, a: Attempt) -> str:
    """For a call during a swap: 'launch' if it overlaps only the launch of the new child
    (Swap sent until the switch), 'drain' if only the drain (switch until the Swap ended),
    'both' otherwise."""
    launch = drain = False
    for s in r.swaps:
        switched = s.start + s.switch if not math.isnan(s.switch) else s.end
        launch |= a.start < switched and a.end > s.start
        drain |= a.start < s.end and a.end > switched
    return "both" if launch and drain else ("launch" if launch else "drain")


def tag_models(r: SwapResult) -> None:
    """Which model served each call: its text against the steady texts of each model."""
    refs: dict[tuple[str, int], list[str]] = {}
    for a in r.attempts:
        if a.code == "OK" and window_of(r, a) == "steady" and a.text:
            refs.setdefault((a.model, a.prompt), []).append(a.text)
    models = sorted({m for m, _ in refs})
    r.served_by = []
    r.mislabelled = []
    for i, a in enumerate(r.attempts):
        best = {m: max((common_prefix(a.text, t) for t in refs.get((m, a.prompt), ())),
                       default=0) for m in models}
        ranked = sorted(best.items(), key=lambda kv: kv[1], reverse=True)
        served = a.model
        if ranked and ranked[0][1] >= 12 and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
            served = ranked[0][0]
        r.served_by.append(served)
        if a.code == "OK" and served != a.model:
            r.mislabelled.append(i)


def swap_section(r: SwapResult, env: list[str], note: PartNote, command: str) -> list[str]:
    measured = [(a, r.served_by[i], window_of(r, a)) for i, a in enumerate(r.attempts)
                if window_of(r, a) != "warmup"]
    ok = [(a, m, w) for a, m, w in measured if a.code == "OK"]
    busy = {id(a) for a, f in zip(r.attempts, r.foreign, strict=True) if f > MONITOR.busy}
    completed = sum(a.code == "OK" for a in r.attempts)  # the warm-up included
    failed = [a for a in r.attempts if a.code != "OK"]
    swaps_ok = [s for s in r.swaps if not s.error]
    models = sorted({m for _, m, _ in ok})
    steady_med = {m: med([a.latency for a, mm, w in ok if mm == m and w == "steady"])
                  for m in models}
    out = [SWAP_HEADING, "", *env, note.line(),
           f"- Daemon: generation child on llama-server, {THREADS} threads, 4 slots "
           "(generation.parallel = 4), embedding child disabled, production swap settings "
           "(drain_timeout 30 s, ready_timeout 90 s)"
           + (f"; generation.extra_args `{r.extra_args}`." if r.extra_args else "."),
           f"- Load: {r.clients} grpc.aio clients (one channel), each sending greedy `Generate` "
           f"calls back to back (8 prompts in rotation, max_tokens {r.max_tokens}, deadline "
           "60 s) for the whole part; a call refused with UNAVAILABLE or RESOURCE_EXHAUSTED "
           "is retried after its `retry-after-ms`.",
           f"- Timeline: warm-up, steady window on gemma-3-270m "
           f"({r.steady_a[1] - r.steady_a[0]:.0f} s), swap 1 to SmolLM2-135M, steady window "
           f"on SmolLM2-135M ({r.steady_b[1] - r.steady_b[0]:.0f} s), then swaps 2..{len(r.swaps)}"
           " back and forth, each sent once every call running at the end of the previous "
           f"one has ended, and {r.gap:g} s more, so that no call spans two swaps "
           "(`ControlService/Swap` with `model_path`). *steady*: the call lies in a steady "
           "window; *during*: its span overlaps a swap (Swap sent until its stream ended, "
           "drain included); *between*: neither (after swap 2 began).",
           "- The serving model of each call is its text's: greedy output is deterministic "
           "per model and prompt, so each text is matched against the steady-window texts "
           "of both models (`GenerateResponse.model` is compared with it below).",
           ""]
    codes = Counter(a.code for a in failed)
    hinted = Counter(a.code for a in failed if a.retry_after_ms is not None)
    rows = [[str(completed), f"**{len(failed)}** {'ok' if not failed else 'MISS'}",
             ", ".join(f"{c} x{n} ({hinted[c]} with retry-after-ms)" for c, n in codes.items())
             or "none",
             f"{len(swaps_ok)}/{len(r.swaps)}",
             f"{len(r.mislabelled)}"]]
    out += table(["calls completed (whole part)", "failed (target 0)", "failures by status",
                  "swaps done", "OK calls whose `model` is not the model that served them"],
                 rows)
    out += [f"- swap {s.index} to {s.target} failed: {s.error[:200]}" for s in r.swaps
            if s.error]
    if failed:
        out += ["", "Failures:", ""]
        out += [f"- {a.code} at +{a.start - r.warm_end:.1f}s after {a.latency:.2f}s: "
                f"{a.details[:160]}" for a in failed[:20]]
    out += ["", "Latency of completed calls (client side: sent until the stream ended, "
            "queueing for a slot included), s:", ""]
    rows = []
    for w in ("steady", "during", "between"):
        for m in [*models, "all"]:
            lat = [a.latency for a, mm, ww in ok if ww == w and (m in ("all", mm))]
            ttft = [a.ttft for a, mm, ww in ok if ww == w and (m in ("all", mm))]
            if not lat:
                continue
            disturbed = sum(id(a) in busy for a, mm, ww in ok if ww == w and m in ("all", mm))
            rows.append([w, short(m) if m != "all" else "both", str(len(lat)), f2(med(lat)),
                         f2(pct(lat, 90)), f2(pct(lat, 99)), f2(max(lat)), f2(med(ttft)),
                         f2(pct(ttft, 99)), str(disturbed)])
    out += table(["window", "model", "calls", "p50", "p90", "p99", "max", "TTFT p50",
                  "TTFT p99", f"disturbed (others > {MONITOR.busy} cores)"], rows)

    def p99(window: str, model: str | None = None, normalise: bool = False,
            quiet: bool = False) -> float:
        vals = [a.latency / (steady_med.get(m, math.nan) if normalise else 1.0)
                for a, m, w in ok if w == window and (model is None or m == model)
                and not (quiet and id(a) in busy)]
        return pct(vals, 99)

    out += ["", "p99(during) / p99(steady), target <= 1.2. *raw*: all calls pooled (the "
            "models differ in speed, and the mix differs between the windows); *per model*: "
            "each model's calls against its own steady window; *normalised*: every call's "
            "latency divided by the steady median of the model that served it, then pooled.",
            ""]
    rows = []
    for label, model, normalise in [("raw", None, False),
                                    *[(f"per model: {short(m)}", m, False) for m in models],
                                    ("normalised", None, True)]:
        ratio = p99("during", model, normalise) / p99("steady", model, normalise)
        quiet = (p99("during", model, normalise, quiet=True)
                 / p99("steady", model, normalise, quiet=True))
        rows.append([label, f"**{f3(ratio)}** {verdict(ratio <= 1.2, ratio)}",
                     f"{f3(quiet)} {verdict(quiet <= 1.2, quiet)}"])
    out += table(["ratio", "p99 during / p99 steady, all calls",
                  "undisturbed calls only"], rows)
    out += ["", "Calls during swaps by the phase they overlap: *launch* (the new child starts "
            "beside the old one, which still serves), *drain* (the new child takes new calls "
            "while the old one finishes its own), *both*. Normalised: latency / steady median "
            "of the serving model.", ""]
    rows = []
    for phase in ("launch", "drain", "both"):
        calls = [(a, m) for a, m, w in ok if w == "during" and swap_phase(r, a) == phase]
        if not calls:
            continue
        lat = [a.latency for a, _ in calls]
        norm = [a.latency / steady_med.get(m, math.nan) for a, m in calls]
        rows.append([phase, str(len(calls)), f2(med(lat)), f2(pct(lat, 99)), f2(med(norm)),
                     f2(pct(norm, 99))])
    out += table(["phase", "calls", "p50 s", "p99 s", "normalised p50", "normalised p99"],
                 rows)
    out += ["", "The same calls by the swap they overlap (its direction) and by when they were "
            "sent: *before the switch* (the call ran on the old child while the new one "
            "loaded, or waited behind the old child's calls and then ran on the new one) or "
            "*after* (the new child only). A call served by the faster model that waited "
            "behind the slower model's calls, or ran beside the slower model's load, counts "
            "against the faster model's steady state.", ""]
    rows = []
    groups: dict[tuple[str, str, str], list[tuple[Attempt, str]]] = {}
    for a, m, w in ok:
        if w != "during":
            continue
        sw = next(s for s in r.swaps if a.start < s.end and a.end > s.start)
        switched = sw.start + sw.switch if not math.isnan(sw.switch) else sw.end
        when = "before the switch" if a.start < switched else "after the switch"
        groups.setdefault((short(sw.target), short(m), when), []).append((a, m))
    for (to, served, when), calls in sorted(groups.items()):
        lat = [a.latency for a, _ in calls]
        norm = [a.latency / steady_med.get(m, math.nan) for a, m in calls]
        rows.append([f"to {to}", served, when, str(len(calls)), f2(med(lat)), f2(max(lat)),
                     f2(med(norm)), f2(max(norm))])
    out += table(["swap", "served by", "sent", "calls", "p50 s", "max s", "normalised p50",
                  "normalised max"], rows)
    out += ["", "Swap durations (client side), s: *total* is the Swap RPC (validate, launch "
            "and load the new child beside the old one, readiness probe, switch, drain the "
            "old child's calls, stop it); *to switch* ends when the new child takes new calls "
            "(stage DRAINING); *drain* is the rest.", ""]
    rows = []
    quiet_swaps = [s for s, f in zip(r.swaps, r.swap_foreign, strict=True)
                   if not f > MONITOR.busy]
    for label, pick in (("all", r.swaps), ("to SmolLM2-135M", [s for s in r.swaps
                                                             if s.target == SMALL_MODEL]),
                        ("to gemma-3-270m", [s for s in r.swaps if s.target != SMALL_MODEL]),
                        ("undisturbed", quiet_swaps)):
        done = [s for s in pick if not s.error]
        if not done:
            continue
        rows.append([label, str(len(done)), f2(med([s.total for s in done])),
                     f2(pct([s.total for s in done], 90)), f2(med([s.switch for s in done])),
                     f2(pct([s.switch for s in done], 90)), f2(med([s.drain for s in done])),
                     f2(pct([s.drain for s in done], 90))])
    out += table(["swaps", "n", "total median", "total p90", "to switch median",
                  "to switch p90", "drain median", "drain p90"], rows)
    out += ["", "Each swap: the calls overlapping it (completed), the slowest of them "
            "normalised, and the other processes' CPU meanwhile.", ""]
    rows = []
    for sw, f in zip(r.swaps, r.swap_foreign, strict=True):
        calls = [(a, m) for a, m, w in ok if a.start < sw.end and a.end > sw.start]
        worst = max((a.latency / steady_med.get(m, math.nan) for a, m in calls),
                    default=math.nan)
        rows.append([str(sw.index), short(sw.target), f2(sw.total), f2(sw.switch),
                     f2(sw.drain), str(len(calls)), f2(worst), f2(f)])
    out += table(["swap", "to", "total s", "to switch s", "drain s", "calls",
                  "slowest call, normalised", "others' cores"], rows)
    out += ["", f"Reproduce: `{command}`"]
    return out
