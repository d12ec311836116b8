"""The report of ``bench.soak``: the outcome and the ``## Soak`` section."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._soak.analysis import Growth, lat
from bench._soak.clients import Soak
from bench._soak.common import (
    DEADLINES,
    FD_LIMIT,
    HANG_GRACE,
    HEADING,
    MIB,
    RSS_LIMIT_MIB,
    RSS_LIMIT_SHARE,
    THREAD_LIMIT,
    THREADS,
    Check,
    Sample,
)
from bench._support import EMBED_MODEL, PartNote, short, table

# -- the report ------------------------------------------------------------------------------


@dataclass
class Outcome:
    soak: Soak
    check: Check | None
    verdicts: list[Growth]
    exit_code: int | None
    exit_seconds: float
    leftover: list[int]
    idle: Sample | None
    duration: float

    @property
    def failures(self) -> list[str]:
        out = []
        s, c = self.soak, self.check
        if s.died:
            out.append(s.died)
        if s.hung:
            out.append(f"{len(s.hung)} hung calls")
        if c is None:
            out.append("the writes were not checked")
        else:
            if c.lost:
                out.append(f"{c.lost} lost acknowledged writes")
            if c.resurrected:
                out.append(f"{len(c.resurrected)} deleted documents back")
            if c.dir_reindex != "OK":
                out.append(f"the final Reindex failed ({c.dir_reindex})")
        out += [f"{g.metric} grows" if not math.isnan(g.delta) else
                f"{g.metric}: too few samples to judge" for g in self.verdicts if not g.ok]
        if self.exit_code != 0:
            out.append(f"exit status after SIGTERM: {self.exit_code}")
        if self.leftover:
            out.append(f"children left after exit: {self.leftover}")
        if s.client_errors:
            out.append(f"{sum(s.client_errors.values())} client errors (a bug of the soak)")
        return out


def samples_table(samples: Sequence[Sample], every: float) -> list[str]:
    rows: list[Sample] = [s for s in samples if s.phase == "idle"]
    load = [s for s in samples if s.phase == "load"]
    mark = 0.0
    for s in load:
        if s.t >= mark:
            rows.append(s)
            mark = (s.t // every + 1) * every
    if load and rows[-1] is not load[-1]:
        rows.append(load[-1])
    rows += [s for s in samples if s.phase == "after"]
    return table(
        ["t s", "phase", "daemon RSS MiB", "of which anon / file MiB", "daemon fds",
         "daemon threads", "children",
         "children RSS MiB", "children fds", "children threads", "calls so far",
         "docs acked so far"],
        [["-" if s.phase == "idle" else f"{s.t:.0f}", s.phase, f"{s.rss / MIB:.1f}",
          f"{s.rss_anon / MIB:.1f} / {s.rss_file / MIB:.1f}",
          str(s.fds), str(s.threads),
          str(s.children), f"{s.children_rss / MIB:.0f}", str(s.children_fds),
          str(s.children_threads), str(s.calls), str(s.acked)] for s in rows])


def section(o: Outcome, env: list[str], note: PartNote, args: argparse.Namespace, *,
            command: str, svg_link: str) -> list[str]:
    s, c = o.soak, o.check
    fails = o.failures
    verdict = "**PASS**" if not fails else "**FAIL**: " + "; ".join(fails)
    out = [HEADING, "", *env, note.line(),
           f"- Daemon: `python -m daemon serve` as a subprocess (its own process, pid "
           f"{s.daemon.pid}), listening on 127.0.0.1:0, its own temporary state directory "
           "(retrieval.allowed_roots: the directory source's temporary directory); "
           f"generation child on llama-server ({THREADS} threads, 2 slots, ctx 2048 per slot), "
           f"`{s.models[0].name}` first, swapped with `{s.models[1].name}` every "
           f"{args.swap_every:g} s (make-before-break); embedding child `{EMBED_MODEL}` on "
           f"llama-server ({THREADS} threads); every other setting the production default.",
           f"- Load for {o.duration / 60:g} min, each client on its own channel: "
           f"{args.generate_clients} streaming `Generate` clients (max_tokens 8-"
           f"{args.max_tokens}, {args.cancel_share:.0%} cancelled by the client after 1-4 "
           f"tokens), {args.search_clients} `Search` clients (top_k 5, half of the queries a "
           "known document's unique token), one ingest client (`UpsertDocument` of new "
           f"documents with a unique token, {args.update_share:.0%} updates with a new token, "
           f"{args.delete_share:.0%} `DeleteDocument`, at most {args.max_docs} documents "
           "kept), a directory source changed (2 files rewritten, 1 added, 1 removed) then "
           f"`Reindex`ed every {args.reindex_every:g} s, `Swap` every {args.swap_every:g} s, "
           "`Status` every 5 s, `RetrievalService/Status` every 15 s, `ListDocuments` every "
           "30 s. Deadlines: " + ", ".join(f"{k} {v:g} s" for k, v in DEADLINES.items())
           + f"; a call still running {HANG_GRACE:g} s past its deadline is *hung*. "
           "UNAVAILABLE and RESOURCE_EXHAUSTED are retried after `retry-after-ms`.",
           f"- Sampled every {args.sample_every:g} s from /proc: the daemon process "
           "(VmRSS, entries of /proc/pid/fd, Threads) and, separately, all its descendants "
           "(summed).",
           f"- Growth rule: after a warm-up (first {args.warmup:.0%} of the run), the median "
           "of the last quarter against the median of the second quarter: RSS fails if it "
           f"grew by more than {RSS_LIMIT_MIB:g} MiB *and* more than {RSS_LIMIT_SHARE:.0%}; "
           f"open fds fail if they grew by more than {FD_LIMIT}; threads if by more than "
           f"{THREAD_LIMIT}. The slope of a least-squares line over the samples after the "
           "warm-up is shown beside it. The children's sums are shown too, not judged "
           "(they change with the model swapped in).",
           "", f"Verdict: {verdict}.", ""]
    rows = []
    for g in o.verdicts:
        unit = f" {g.unit}" if g.unit else ""
        mark = ("ok" if g.ok else "MISS") if g.judged else "info"
        rows.append([g.metric, f"{g.q2:.1f}{unit}", f"{g.q4:.1f}{unit}",
                     f"**{g.delta:+.1f}{unit}** {mark}",
                     f"{g.slope_per_hour:+.1f}{unit}/h", g.rule])
    out += table(["metric", "median, second quarter", "median, last quarter", "growth",
                  "line fit after warm-up", "rule"], rows)
    out += ["", f"![daemon RSS, fds and threads over time]({svg_link})", ""]
    hung = len(s.hung)
    lost = c.lost if c is not None else -1
    out += [f"Calls per RPC and outcome (hung: **{hung}** {'ok' if not hung else 'MISS'}; "
            "latency in seconds, client side):", ""]
    rows = []
    for (rpc, code), n in sorted(s.counts.items(), key=lambda kv: (kv[0][0], -kv[1])):
        ls = s.latency[(rpc, code)]
        rows.append([rpc, code, str(n), lat(ls, 50), lat(ls, 99), lat(ls, 100),
                     f"{DEADLINES.get(rpc.split(' ')[0], math.nan):g}"])
    out += table(["RPC", "outcome", "calls", "p50 s", "p99 s", "max s", "deadline s"], rows)
    details = [(k, t, n) for k, cnt in s.details.items() for t, n in cnt.items()]
    if details:
        out += ["", "Messages of the failed calls (first 100 characters):", ""]
        out += [f"- {rpc} {code} x {n}: `{t or '(none)'}`" for (rpc, code), t, n in
                sorted(details, key=lambda x: -x[2])[:12]]
    if s.hung:
        out += ["", "Hung calls: " + "; ".join(f"{h.rpc} sent at {h.at:.1f} s" for h in s.hung)]
    if s.client_errors:
        out += ["", "Client errors (the soak's own bugs): " + "; ".join(
            f"{k} x {n}" for k, n in s.client_errors.items())]
    out += [""]
    if c is not None:
        out += [f"Writes checked after the load (lost: **{lost}** {'ok' if not lost else 'MISS'}"
                f"; resurrected: **{len(c.resurrected)}** "
                f"{'ok' if not c.resurrected else 'MISS'}):", ""]
        rows = [
            ["pushed, acknowledged, nothing unanswered after", str(c.push_checked),
             "listed INDEXED and found by its token",
             f"{len(c.push_not_indexed)} not INDEXED, {len(c.push_not_found)} not found"],
            ["pushed, acknowledged, then a write or delete with no answer",
             str(c.ambiguous_checked),
             "found by one of its tokens (or gone, after an unanswered delete)",
             f"{len(c.ambiguous_lost)} lost"],
            ["acknowledged deletes", str(c.deleted_checked), "not listed, not found",
             f"{len(c.resurrected)} back"],
            ["superseded tokens of updated documents", str(c.superseded_checked),
             "no longer find the document", f"{len(c.stale)} stale"],
            ["directory files (after a last Reindex: "
             f"{c.dir_reindex})", str(c.dir_checked), "listed INDEXED and found by its token",
             f"{len(c.dir_lost)} lost"],
            ["tokens removed from the directory's files", str(c.dir_removed_checked),
             "no longer found", f"{len(c.dir_stale)} stale"],
            ["writes never acknowledged (not checked)", str(c.never_acked), "", ""],
        ]
        out += table(["documents", "count", "must be", "failed"], rows)
        out.append("")
        lists = [("not INDEXED", c.push_not_indexed), ("not found", c.push_not_found),
                 ("lost after an unanswered write", c.ambiguous_lost),
                 ("resurrected", c.resurrected), ("stale", c.stale),
                 ("directory lost", c.dir_lost), ("directory stale", c.dir_stale)]
        for label, items in lists:
            if items:
                out.append(f"- {label}: {', '.join(items[:10])}"
                           f"{' ...' if len(items) > 10 else ''}")
        probes = s.probes
        anomalies = "; ".join(f"{k} x {n}" for k, n in s.anomalies.items()) or "none"
        failed = "; ".join(f"{k} x {n}" for k, n in s.reindex_failures.items()) or "none"
        if out[-1]:
            out.append("")
        out += [f"- During the load, token searches for clean acknowledged documents found "
                f"them {probes['found']} times, missed {probes['missed']} times (a delete or "
                f"update may race the search). Files Reindex reported failed: {failed}. "
                f"Other anomalies: {anomalies}.",
                f"- Clean-up once the load stopped: generation calls running {c.in_flight}, "
                f"queued {c.queued} after {c.settle_seconds:.1f} s "
                f"({'ok' if c.in_flight == 0 and c.queued == 0 else 'MISS'})."]
    out += [f"- Shutdown: SIGTERM -> exit status {o.exit_code} in {o.exit_seconds:.1f} s; "
            f"children left: {len(o.leftover)} "
            f"({'ok' if o.exit_code == 0 and not o.leftover else 'MISS'})."]
    if o.idle is not None:
        out += [f"- Before the load (both children ready, sources added): daemon "
                f"{o.idle.rss / MIB:.1f} MiB, {o.idle.fds} fds, {o.idle.threads} threads."]
    out += ["", "Swaps:", ""]
    out += table(["#", "at s", "from", "to", "seconds", "outcome", "last message"],
                 [[str(i), f"{w.at:.0f}", short(w.from_model), short(w.to_model),
                   f"{w.seconds:.1f}", w.code, f"`{w.message}`" if w.message else ""]
                  for i, w in enumerate(s.swaps, 1)])
    out += ["", f"Samples (every ~{args.table_every:g} s; children: all descendants of the "
            "daemon, summed; the count is 3 while a swap runs both generation children):", ""]
    out += samples_table(s.samples, args.table_every)
    out += ["", f"Reproduce: `{command}`"]
    return out


def relative_link(target: Path, page: Path) -> str:
    """``target`` as a link from the markdown file ``page``."""
    return Path(os.path.relpath(target.resolve(), page.resolve().parent)).as_posix()
