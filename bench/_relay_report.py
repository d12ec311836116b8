"""The ``bench/RESULTS.md`` section of ``bench.bench_http_relay``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from statistics import median

from bench._generation.common import Guard, Sample
from bench._relay import DIRECT, GRPC, HTTP, ROUTER, Batch, Cpu
from bench._support import f3, pct, table

HEADING = "## OpenAI HTTP relay: llamad vs direct"
PROCESS = {HTTP: HTTP, GRPC: HTTP, ROUTER: ROUTER}  # whose CPU a relay path costs


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def _cpu(cpu: Cpu, path: str, base: str) -> tuple[str, str]:
    """(the relay process's CPU ms per 1k tokens on ``path``, the same process's during
    ``base``, the direct requests, per 1k direct tokens)."""
    proc = PROCESS[path.split(" x", maxsplit=1)[0]]
    return f"{cpu.per_1k(proc, path):.1f}", f"{cpu.per_1k(proc, base):.1f}"


def one_client_rows(samples: Sequence[Sample], paths: Sequence[str], cpu: Cpu
                    ) -> tuple[list[list[str]], list[list[str]], dict[str, float]]:
    by = {p: [s for s in samples if s.path == p] for p in paths}
    direct = {(s.round, s.prompt): s for s in by[DIRECT]}
    rows = [[p, str(len(by[p])), f"{median(s.tokens for s in by[p]):.0f}",
             _ms(median(s.ttft for s in by[p])), f"{median(s.rate for s in by[p]):.2f}"]
            for p in paths]
    ratios: list[list[str]] = []
    summary: dict[str, float] = {}
    for p in paths[1:]:
        pairs = [(s, direct[(s.round, s.prompt)]) for s in by[p]
                 if (s.round, s.prompt) in direct]
        ratio = median(s.rate for s in by[p]) / median(s.rate for s in by[DIRECT])
        per_pair = median(a.rate / b.rate for a, b in pairs)
        added = [a.ttft - b.ttft for a, b in pairs]
        same = sum(a.text == b.text for a, b in pairs)
        used, idle = _cpu(cpu, p, DIRECT)
        summary[p] = ratio
        summary[f"{p} ttft"] = median(added) * 1000
        summary[f"{p} cpu"] = float(used)
        ratios.append([p, f"**{f3(ratio)}** {_verdict(ratio >= 0.98)}", f3(per_pair),
                       f"**{_ms(median(added))}** {_verdict(median(added) <= 0.005)}",
                       _ms(pct(added, 90)), f"{same}/{len(pairs)}", used, idle])
    return rows, ratios, summary


def batch_rows(batches: Sequence[Batch], paths: Sequence[str], cpu: Cpu, clients: int
               ) -> tuple[list[list[str]], dict[str, float]]:
    by = {p: [b for b in batches if b.path == p] for p in paths}
    direct = {b.round: b for b in by[DIRECT]}
    base_rate = median(b.rate for b in by[DIRECT])
    base_ttft = median(median(b.ttfts) for b in by[DIRECT])
    rows: list[list[str]] = []
    summary: dict[str, float] = {}
    for p in paths:
        rate = median(b.rate for b in by[p])
        ttft = median(median(b.ttfts) for b in by[p])
        if p == DIRECT:
            rows.append([p, str(len(by[p])), f"{rate:.2f}", "—", "—", _ms(ttft), "—", "—",
                         "—"])
            continue
        per_round = median(b.rate / direct[b.round].rate for b in by[p] if b.round in direct)
        same = sum(t == u for b in by[p] if b.round in direct
                   for t, u in zip(b.texts, direct[b.round].texts, strict=True))
        total = sum(len(b.texts) for b in by[p])
        used, idle = _cpu(cpu, f"{p} x{clients}", f"{DIRECT} x{clients}")
        summary[f"{p} x{clients}"] = rate / base_rate
        summary[f"{p} x{clients} cpu"] = float(used)
        rows.append([p, str(len(by[p])), f"{rate:.2f}",
                     f"**{f3(rate / base_rate)}** {_verdict(rate / base_rate >= 0.98)}",
                     f3(per_round), _ms(ttft), _ms(ttft - base_ttft), used,
                     f"{idle} ({same}/{total} texts identical)"])
    return rows, summary


def report(samples: Sequence[Sample], batches: Sequence[Batch], cpu: Cpu,
           paths: Sequence[str], *, env: list[str], args: argparse.Namespace, model: str,
           guard: Guard, load: str, minutes: float) -> list[str]:
    rows, ratios, one = one_client_rows(samples, paths, cpu)
    lines = [HEADING, "", *env,
             f"- Model `{model}` on llama-server, {args.threads} threads, one slot "
             f"(generation.parallel = 1), embedding child off; Chat's defaults set to greedy "
             f"with no penalties; every request: max_tokens {args.max_tokens}, temperature 0, "
             f"streamed. {args.prompts} prompts x {args.rounds} rounds per path (+1 warm-up "
             "round, discarded), paths interleaved request by request.",
             f"- Paths: *{DIRECT}* = `POST /v1/chat/completions` to the child's own port; "
             f"*{HTTP}* = the same body from the same httpx client code to llamad's "
             f"`http_listen` (`model: generation`); *{GRPC}* = `Chat` (grpc.aio); "
             f"*{ROUTER}* = the same HTTP request (`model`: the router's id of the GGUF) to "
             "`llama-server --models-dir models/gguf --models-max 1` started with the "
             "child's command line (minus model, host, port, alias) and its `GOMP_SPINCOUNT`, "
             "its own child serving the same GGUF. The body sent to the child carries no "
             "`model`, as llamad's does not. The daemon runs in its own process (`python -m "
             "daemon serve`).",
             "- TTFT: client side, request sent to first non-empty content. tokens/s: "
             "(tokens - 1) / (last text - first text) per request; medians over requests. "
             "*added TTFT*: per pair (same prompt and round) relay minus direct.",
             "- CPU: utime + stime of the relaying process (llamad's daemon; the router "
             "process, not its child) from `/proc/<pid>/stat`, read before and after every "
             "kept request and booked to that request's path, per 1,000 tokens streamed on "
             "it. *idle* is the same process's CPU during the direct requests, per 1,000 "
             "direct tokens: what it spends anyway (timers, health polls).",
             f"- Machine: load average (1 / 5 / 15 min) {load}; {guard.redone} measurements "
             f"redone because other processes used more than {args.max_foreign} cores; "
             f"most foreign CPU in a kept one {guard.worst:.3f} cores; {guard.waited:.0f} s "
             f"waited; whole run {minutes:.1f} min.",
             "", "One client:", "",
             *table(["path", "requests", "median tokens", "median TTFT ms",
                     "median tokens/s"], rows),
             "",
             *table(["relay", "tokens/s relay/direct (>= 0.98)", "median of per-pair ratios",
                     "added TTFT median ms (<= 5)", "added TTFT p90 ms",
                     "identical text (pairs)", "relay CPU ms / 1k tokens",
                     "idle CPU ms / 1k tokens"], ratios)]
    if batches:
        brows, many = batch_rows(batches, paths, cpu, args.clients)
        lines += ["", f"{args.clients} concurrent clients (one slot: the child or the relay "
                  f"queues them), {args.batch_rounds} measured batches per path; aggregate "
                  "tokens/s = tokens of the batch / (first sent to last token); TTFT: median "
                  "over the batch's clients, then over batches:", "",
                  *table(["path", "batches", "median aggregate tokens/s",
                          "relay/direct (>= 0.98)", "median of per-round ratios",
                          "median TTFT ms", "added TTFT ms", "relay CPU ms / 1k tokens",
                          "idle CPU ms / 1k tokens"], brows)]
        one |= many
    lines += ["", "Summary figures: " + ", ".join(f"{k} {v:.3f}" for k, v in one.items())]
    return lines
