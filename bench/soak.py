"""Soak: a real daemon under a mixed workload for minutes; its resources must stay bounded.

    .venv/bin/python -m bench.soak [--minutes 10] [--out bench/RESULTS.md]
        [--svg bench/results/soak.svg] [--raw FILE] [--swap-every 60] [--sample-every 2]
        [--wait-others SECONDS] [--anyway]

The daemon runs as operators run it: ``python -m daemon serve`` as a subprocess, listening
on 127.0.0.1:0 (the address is read from its ``listening`` log line), with its own
temporary state directory; the generation child on llama-server (SmolLM2-135M first, then
swapped with gemma-3-270m back and forth), the embedding child on llama-server
(all-MiniLM-L6-v2); every other setting is the production default.

For ``--minutes``, concurrent asyncio clients, each on its own gRPC channel, send:

- streaming ``Generate`` (``--generate-clients``; a share of them cancelled by the client
  after a few tokens, to exercise the daemon's cleanup);
- ``Search`` (``--search-clients``), half of them for the unique token of a document
  acknowledged earlier;
- ``UpsertDocument`` of new documents, each with a unique token (every acknowledged id is
  recorded), updates of acknowledged documents with a new token, and occasional
  ``DeleteDocument``;
- a directory source whose files are changed, added and removed, then ``Reindex``;
- ``ControlService/Swap`` between the two generation models every ``--swap-every`` s;
- ``ControlService/Status``, ``RetrievalService/Status`` and ``ListDocuments`` now and then.

Every call has a deadline; outcomes are counted per RPC and status code. A call *hangs*
when it runs past its deadline + 2 s (it is then abandoned and counted). Every
``--sample-every`` s the daemon process (and, separately, its children) is sampled from
/proc: resident memory, open file descriptors, threads.

At the end, load stops and the writes are checked: every acknowledged, not deleted
document must be listed INDEXED and found by a search for its unique token; every file of
the directory source (after a last Reindex) likewise; an acknowledged delete must stay
deleted. Then the daemon gets SIGTERM and must exit 0 leaving no child.

Growth rule (after a warm-up of the first ``--warmup`` share of the run, 20 %): the median
of the last quarter of the run is compared with the median of the second quarter. RSS
fails if it grew by more than 30 MiB *and* more than 10 %; open fds fail if they grew by
more than 8; threads if they grew by more than 4. A least-squares line over the samples
after the warm-up is reported beside it (per hour). The run fails (exit status 1, MISS in
the table) on any growth failure, any lost or resurrected write, any hung call, or a
daemon that died or did not exit cleanly.

Results are printed; the ``## Soak`` section of ``--out`` is created or replaced (other
sections kept), and the plot (three line charts, hand-written SVG) goes to ``--svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import grpc

from bench import _support as support
from bench._daemon import DaemonProcess, wait_ready
from bench._soak.analysis import growth
from bench._soak.clients import Soak
from bench._soak.common import Check, daemon_env, descendants, proc_stat
from bench._soak.plot import svg_plot
from bench._soak.report import Outcome, relative_link, section

# -- main ------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.soak", __doc__)
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md",
                   help="markdown file whose '## Soak' section is created or replaced")
    p.add_argument("--svg", type=Path, default=support.ROOT / "bench" / "results" / "soak.svg")
    p.add_argument("--raw", type=Path, help="also write every sample and count to this JSON")
    p.add_argument("--generate-clients", type=int, default=2)
    p.add_argument("--search-clients", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--cancel-share", type=float, default=0.25,
                   help="share of Generate calls cancelled by the client midway")
    p.add_argument("--ingest-pause", type=float, default=0.5,
                   help="seconds between the ingest client's calls")
    p.add_argument("--update-share", type=float, default=0.12)
    p.add_argument("--delete-share", type=float, default=0.08)
    p.add_argument("--max-docs", type=int, default=400,
                   help="pushed documents kept; beyond, the oldest are deleted")
    p.add_argument("--reindex-every", type=float, default=20.0)
    p.add_argument("--swap-every", type=float, default=60.0)
    p.add_argument("--sample-every", type=float, default=2.0)
    p.add_argument("--table-every", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=0.2,
                   help="share of the run not judged (default 0.2)")
    support.add_quiet_options(p, "before starting")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.generate_clients < 0 or args.search_clients < 0:
        p.error("--minutes must be > 0, client counts >= 0")
    if not 0 <= args.warmup < 0.25:
        p.error("--warmup must be in [0, 0.25)")
    return args


async def run(args: argparse.Namespace, command: str, log_path: Path) -> int:
    models = (support.model_file(support.SMALL_MODEL), support.model_file(support.DEFAULT_MODEL))
    embed = support.model_file(support.EMBED_MODEL)
    env_lines = support.environment(command)
    duration = args.minutes * 60
    support.MONITOR.start()
    with tempfile.TemporaryDirectory(prefix="llamad-soak-") as tmp:
        state, corpus = Path(tmp) / "state", Path(tmp) / "corpus"
        state.mkdir()
        corpus.mkdir()
        note = await support.begin_part("soak", args.wait_others, args.anyway, args.max_foreign)
        daemon = DaemonProcess(daemon_env(state, corpus, models[0], embed), log_path)
        outcome: Outcome | None = None
        try:
            address = await daemon.address()
            print(f"  daemon pid {daemon.pid} on {address}; waiting for both children",
                  flush=True)
            async with grpc.aio.insecure_channel(address) as ch:
                await wait_ready(ch)
            soak = Soak(args, address, daemon, corpus, models)
            await soak.setup()
            idle = soak.sample("idle")
            print(f"  ready; load for {duration:.0f}s", flush=True)
            await soak.run(duration)
            support.end_part(note)
            check: Check | None = None
            if not soak.died:
                print("  load stopped; checking the writes", flush=True)
                check = await soak.verify()
                last = soak.sample("after")
                if last is not None:
                    last.t = round(soak.now(), 2)
            kids = descendants(daemon.pid)
            code, seconds = await daemon.stop()
            await asyncio.sleep(0.5)
            leftover = [p for p in kids if proc_stat(p) is not None]
            outcome = Outcome(soak, check, growth(soak.samples, duration, args.warmup), code,
                              seconds, leftover, idle, duration)
        finally:
            if outcome is None:
                daemon.kill()
    await support.MONITOR.stop()
    o = outcome
    args.svg.parent.mkdir(parents=True, exist_ok=True)
    fails = o.failures
    title = (f"llamad soak, {duration / 60:g} min: "
             + ("PASS" if not fails else "FAIL (" + "; ".join(fails)[:80] + ")"))
    args.svg.write_text(svg_plot(o.soak.samples, o.soak.swaps, duration=duration,
                                 warmup=args.warmup, verdicts=o.verdicts, title=title))
    lines = section(o, env_lines, note, args, command=command,
                    svg_link=relative_link(args.svg, args.out))
    print("\n" + "\n".join(lines) + "\n", flush=True)
    support.write_sections(args.out, [lines])
    print(f"written to {args.out} and {args.svg}; daemon log {log_path}", flush=True)
    if args.raw:
        raw = {"command": command, "duration": duration,
               "samples": [asdict(s) for s in o.soak.samples],
               "counts": [[r, c, n] for (r, c), n in o.soak.counts.items()],
               "swaps": [asdict(w) for w in o.soak.swaps],
               "hung": [asdict(h) for h in o.soak.hung],
               "check": asdict(o.check) if o.check else None,
               "growth": [asdict(g) for g in o.verdicts], "failures": fails,
               "note": asdict(note)}
        args.raw.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print("PASS" if not fails else "FAIL: " + "; ".join(fails), flush=True)
    return 0 if not fails else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    command = support.command_line("bench.soak", argv)
    fd, name = tempfile.mkstemp(prefix="llamad-soak-", suffix=".log")
    os.close(fd)
    print(f"daemon log: {name}", flush=True)
    return asyncio.run(run(args, command, Path(name)))


if __name__ == "__main__":
    sys.exit(main())
