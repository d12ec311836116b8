"""The report of ``bench.bench_generation``: its two sections of RESULTS.md."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench._generation.common import START_HEADING, STREAM_HEADING, StartResult, StreamResult
from bench._support import (
    table,
)

# -- report ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p90(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def stream_section(results: Sequence[StreamResult], env: list[str], *, prompts: int,
                   max_tokens: int, rounds: int, threads: int, max_foreign: float) -> list[str]:
    model = results[0].model if results else "?"
    out = [STREAM_HEADING, "", *env,
           f"- Model `{model}`, {threads} threads, one slot (generation.parallel = 1); "
           f"{prompts} prompts x {rounds} rounds per path (+1 warm-up round, discarded); "
           f"max_tokens {max_tokens}, temperature 0; same child, requests alternating "
           "between the paths.",
           "- llamad: gRPC `Generate` (grpc.aio client) to an in-process daemon. direct: "
           "`POST /v1/completions` with `stream: true` (httpx) to the child's port, with "
           "the body llamad sends.",
           "- TTFT: client side, request sent to first non-empty text. tokens/s: "
           "(tokens - 1) / (last text - first text), per request; medians over requests.",
           "- Requests during which other processes used more than "
           f"{max_foreign:g} cores are redone. Absolute tokens/s still drift between runs "
           "on a shared VM (the host can take a vCPU away unseen; the child then runs at "
           "about its one-thread speed): the ratios, from adjacent requests, are the result.",
           ""]
    rows = []
    for r in results:
        for path, label in (("llamad", "llamad (gRPC)"), ("direct", "direct (HTTP SSE)")):
            s = r.of(path)
            rows.append([r.runtime, label, str(len(s)), f"{median([x.tokens for x in s]):g}",
                         ms(median([x.ttft for x in s])), f"{median([x.rate for x in s]):.2f}"])
    out += table(["runtime", "path", "requests", "median tokens", "median TTFT ms",
                  "median tokens/s"], rows)
    out.append("")
    rows = []
    for r in results:
        pairs = r.pairs()
        ratio = median([x.rate for x in r.of("llamad")]) / median([x.rate for x in r.of("direct")])
        paired = median([a.rate / b.rate for a, b in pairs if b.rate > 0])
        added = [a.ttft - b.ttft for a, b in pairs]
        same = sum(a.text == b.text for a, b in pairs)
        rows.append([
            r.runtime,
            f"**{ratio:.3f}** {'ok' if ratio >= 0.98 else 'MISS'}",
            f"{paired:.3f}",
            f"**{ms(median(added))}** {'ok' if median(added) <= 0.005 else 'MISS'}",
            ms(p90(added)),
            f"{same}/{len(pairs)}",
        ])
    out += table(["runtime", "tokens/s llamad/direct (>= 0.98)", "median of per-pair ratios",
                  "added TTFT median ms (<= 5)", "added TTFT p90 ms",
                  "identical text (pairs)"], rows)
    out += ["", "Where the added TTFT goes, per pair: *in the daemon* is llamad's own TTFT "
            "(`Usage.time_to_first_token_ms`, from its handler's start to the first chunk from "
            "the child) minus the direct TTFT; *gRPC hops* is the client's TTFT minus llamad's "
            "own (request in, first message out).", ""]
    rows = []
    for r in results:
        pairs = [(a, b) for a, b in r.pairs() if a.server_ttft is not None]
        inside = [(a.server_ttft or 0.0) - b.ttft for a, b in pairs]
        hops = [a.ttft - (a.server_ttft or 0.0) for a, _ in pairs]
        rows.append([r.runtime, ms(median(inside)), ms(p90(inside)), ms(median(hops)),
                     ms(p90(hops))])
    out += table(["runtime", "in the daemon, median ms", "p90 ms", "gRPC hops, median ms",
                  "p90 ms"], rows)
    return out


def start_section(results: Sequence[StartResult], env: list[str], starts: int,
                  threads: int) -> list[str]:
    out = [START_HEADING, "", *env,
           f"- Production restart and probe settings; {threads} threads, one slot, embedding "
           f"child disabled; medians of {starts} runs, a fresh daemon each.",
           "- llamad cold start: `Daemon.start()` until Status says RUNNING and health "
           "(`generation`) says SERVING. RUNNING means the child answered its health "
           "endpoint, reported llamad's alias and generated one token. *child* is the "
           "supervisor's STARTING -> RUNNING. direct: the same child command line started "
           "by hand, polled every 20 ms until healthy and a one-token completion succeeds.",
           ""]
    rows = []
    for r in results:
        rows.append([r.runtime, f"`{r.model}`",
                     f"**{median([s.ready for s in r.llamad]):.2f}**",
                     f"{median([s.child for s in r.llamad]):.2f}",
                     f"{median(r.direct):.2f}",
                     f"{median([s.ready for s in r.llamad]) - median(r.direct):+.2f}",
                     ", ".join(f"{s.ready:.2f}" for s in r.llamad)])
    out += table(["runtime", "model", "llamad cold start s", "child STARTING->RUNNING s",
                  "direct start s", "llamad - direct s", "llamad runs s"], rows)
    out += ["",
            "kill -9 of the generation child (pid from Status) until a one-token `Generate` "
            "succeeds, retried every 20 ms on UNAVAILABLE. Each kill is a first restart, "
            "whose backoff is **random, uniform in [0, 0.5 s]** (full jitter, "
            "restart.backoff_base = 0.5): reported as is, and broken down.",
            ""]
    rows = []
    for r in results:
        if not r.kills:
            continue
        k = r.kills
        rows.append([r.runtime, f"`{r.model}`", f"**{median([x.total for x in k]):.2f}**",
                     ms(median([x.detect for x in k])),
                     ", ".join(f"{x.backoff:.3f}" for x in k),
                     f"{median([x.restart for x in k]):.2f}",
                     f"{median([x.total - x.backoff for x in k]):.2f}",
                     ", ".join(f"{x.total:.2f}" for x in k)])
    out += table(["runtime", "model", "kill -9 -> serving s", "detect ms",
                  "backoff drawn s", "restart s", "total minus backoff s", "runs s"], rows)
    return out
