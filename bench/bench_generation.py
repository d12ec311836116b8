"""Generation benchmark: llamad's streaming path against talking to the child directly.

    .venv/bin/python -m bench.bench_generation [--runtime llama-server|bundled|both]
        [--model FILE] [--prompts N] [--max-tokens N] [--threads N] [--rounds N]
        [--starts N] [--llama-bin FILE] [--max-foreign CORES] [--raw FILE]
        [--out bench/RESULTS.md]

For each runtime, in one run:

1. **Streaming.** A real daemon (in-process :class:`daemon.Daemon` on 127.0.0.1:0, the
   embedding child disabled, the generation child on the runtime with 2 threads and one
   slot) streams greedy completions of a fixed prompt list through gRPC ``Generate``;
   the same prompts go straight to the same child as ``POST /v1/completions`` with
   ``stream=true`` (httpx), which is what a user would do without llamad. The request
   body sent directly is the one llamad sends. Requests alternate between the two paths;
   each round sends every prompt once per path, in two passes with the path order
   swapped, so that a prompt is never sent twice in a row (llama.cpp's prompt cache would
   then favour the second) and both paths of a prompt see the same cache state. The first
   round is a warm-up and is discarded.
2. **Cold start.** ``Daemon.start()`` until the generation child is RUNNING and health
   says SERVING, fresh daemon each time, for both models; beside it, the same child
   command started by hand and polled until it answers a one-token completion.
3. **kill -9.** SIGKILL the child, then retry a one-token ``Generate`` every 20 ms until
   it succeeds. Each kill uses a fresh daemon, so each restart is a *first* restart,
   whose backoff is drawn uniformly from [0, restart.backoff_base = 0.5 s] (full jitter).

The machine may be shared (2 cores here; the child's threads use both): before each part,
and before redoing a measurement, the bench waits until processes outside its own process
tree use at most ``--max-foreign`` cores (and the CI log, if any, says the CI run ended);
a measurement during which they used more is redone (a disturbed streaming request after
an unmeasured request of the previous prompt, to restore the child's cache state). The
whole run takes about 8 minutes on a quiet machine.

Results are printed and written into ``--out`` (sections ``## Generation streaming:
llamad vs direct`` and ``## Start and recovery`` are created or replaced; other sections
are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench import _support as support
from bench._daemon import daemon_log
from bench._generation.common import (
    DEFAULT_THREADS,
    EXTRA_ENV,
    RUNTIMES,
    START_MODELS,
    Guard,
    StartResult,
    StreamResult,
)
from bench._generation.report import start_section, stream_section
from bench._generation.start import bench_start
from bench._generation.stream import bench_stream

# -- main -------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_generation", __doc__)
    p.add_argument("--runtime", choices=(*RUNTIMES, "both"), default="both")
    p.add_argument("--model", default=support.DEFAULT_MODEL,
                   help=f"GGUF for the streaming and kill runs (default {support.DEFAULT_MODEL})")
    p.add_argument("--prompts", type=int, default=len(support.PROMPTS),
                   help=f"prompts per round, at most {len(support.PROMPTS)}")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"generation.threads of the child (default {DEFAULT_THREADS})")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    p.add_argument("--starts", type=int, default=3,
                   help="cold starts and kills per case (0: skip that part)")
    p.add_argument("--raw", type=Path, help="also write every measurement to this JSON file")
    p.add_argument("--llama-bin", default=os.environ.get("LLAMAD_LLAMA_BIN", ""),
                   help="llama-server binary (default: LLAMAD_LLAMA_BIN, else llamad's choice)")
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--max-foreign", type=float, default=0.05, metavar="CORES",
                   help="redo a measurement during which other processes used more CPU "
                   "(default 0.05 cores)")
    p.add_argument("--ci-log", type=Path, default=Path("/tmp/ci/run.log"),  # noqa: S108 (only read)
                   help="wait while this log's last line is not 'exit=...' (a CI run is "
                   "going); ignored if missing")
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= len(support.PROMPTS):
        p.error(f"--prompts must be in 1..{len(support.PROMPTS)}")
    if args.rounds < 1 or args.starts < 0 or args.threads < 1 or args.max_tokens < 2:
        p.error("--rounds and --threads must be >= 1, --starts >= 0, --max-tokens >= 2")
    return args


async def run(args: argparse.Namespace, command: str) -> None:
    runtimes = RUNTIMES if args.runtime == "both" else (args.runtime,)
    model = support.model_file(args.model)
    prompts = support.PROMPTS[: args.prompts]
    streams: list[StreamResult] = []
    starts: list[StartResult] = []
    guard = Guard(max_foreign=args.max_foreign, ci_log=args.ci_log)
    began = time.perf_counter()
    for runtime in runtimes:
        print(f"{runtime}: streaming, {model.name}", flush=True)
        streams.append(await bench_stream(runtime, model, prompts, args.max_tokens, args.rounds,
                                          threads=args.threads, guard=guard))
    for runtime in runtimes if args.starts else ():
        for name in dict.fromkeys((model.name, *START_MODELS)):
            print(f"{runtime}: cold start{' and kill -9' if name == model.name else ''}, "
                  f"{name}", flush=True)
            starts.append(await bench_start(runtime, support.model_file(name), args.starts,
                                            kill=name == model.name, threads=args.threads,
                                            guard=guard))
    total = time.perf_counter() - began
    print(f"total {total:.0f}s, of which {guard.waited:.0f}s waiting for a quiet machine; "
          f"{guard.redone} measurements redone\n", flush=True)
    env = support.environment(command, EXTRA_ENV.get("LLAMAD_LLAMA_BIN"))
    sections = [stream_section(streams, env, prompts=len(prompts), max_tokens=args.max_tokens,
                               rounds=args.rounds, threads=args.threads,
                               max_foreign=args.max_foreign)]
    if starts:
        sections.append(start_section(starts, env, args.starts, args.threads))
    support.publish(args.out, sections)
    if args.raw:
        raw = {"command": command, "streams": [asdict(r) for r in streams],
               "starts": [asdict(r) for r in starts]}
        args.raw.write_text(json.dumps(raw, indent=1) + "\n")
        print(f"raw measurements in {args.raw}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    command = support.command_line("bench.bench_generation", argv)
    with daemon_log(), tempfile.TemporaryDirectory(prefix="llamad-bench-state-") as state:
        EXTRA_ENV["LLAMAD_STATE_DIR"] = state
        if args.llama_bin:
            EXTRA_ENV["LLAMAD_LLAMA_BIN"] = args.llama_bin
        asyncio.run(run(args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
