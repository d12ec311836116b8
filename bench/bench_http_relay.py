"""Relay benchmark: streaming chat through llamad's OpenAI HTTP API and gRPC, against the
same llama-server child directly and llama-server's own router mode.

    .venv/bin/python -m bench.bench_http_relay [--model FILE] [--prompts N]
        [--max-tokens N] [--threads N] [--rounds N] [--clients N] [--batch-rounds N]
        [--no-router] [--llama-bin FILE] [--max-foreign CORES] [--out bench/RESULTS.md]

In one run:

1. **One client.** A daemon as operators run it (``python -m daemon serve`` in its own
   process, ``http_listen`` on, the embedding child disabled, the generation child on
   llama-server with 2 threads and one slot, Chat's default sampling set to greedy with no
   penalties) streams greedy chat completions of a fixed prompt list. Paths: *direct* is
   ``POST /v1/chat/completions`` with ``stream: true`` to the child's own socket (with
   its key, read from its environment); *llamad
   HTTP* is the same request, from the same httpx client code, to llamad's HTTP API;
   *llamad gRPC* is ``Chat`` (grpc.aio); *router* (unless ``--no-router``) is the same
   HTTP request to ``llama-server --models-dir DIR --models-max 1`` started with the
   child's own settings (its command line minus model, host, port and alias, and its
   ``GOMP_SPINCOUNT``), serving the same GGUF from its own child. The body sent to the
   child carries no ``model``, as llamad's does not (with one, llama-server answered the
   first token ~17 ms later in a trial run). Each round sends every prompt once per path, in as many
   passes as paths with the path order rotated, so that consecutive requests always carry
   different prompts and every path's request of a prompt follows the same prompt; the
   first round is a warm-up and is discarded.
2. **Concurrent clients.** ``--clients`` requests at once (prompts in turn) per path,
   paths in rotated order each round (the first round discarded). Aggregate tokens/s:
   every token of the batch over the time from sending to the last token.
3. **CPU.** Before and after every kept measurement, utime + stime of the daemon's
   process (and of the router's, not its child) from ``/proc/<pid>/stat``; the ticks are
   booked to the path measured. CPU ms per 1,000 tokens on a relay path is the relay's
   cost; the same process's ticks during *direct* requests are its idle cost (its own
   timers), shown beside it.

The machine may be shared: before each part the bench waits until processes outside its
own process tree use at most ``--max-foreign`` cores, and redoes a measurement during
which they used more. About 10 minutes on a quiet machine. The section ``## OpenAI HTTP
relay: llamad vs direct`` of ``--out`` is created or replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import httpx

from bench import _support as support
from bench._daemon import DaemonProcess, serving
from bench._direct import child_http
from bench._generation.common import DEFAULT_THREADS, Guard, Sample, daemon_env
from bench._relay import (
    DIRECT,
    GREEDY_CHAT,
    GRPC,
    HTTP,
    ROUTER,
    Batch,
    Cpu,
    Meter,
    Relay,
    child_command,
    free_port,
    router_command,
    router_environ,
    spawn,
)
from bench._relay_report import report
from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc, inference_pb2_grpc


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = support.bench_parser("bench.bench_http_relay", __doc__)
    p.add_argument("--model", default=support.SMALL_MODEL,
                   help=f"generation GGUF (default {support.SMALL_MODEL}, the default model)")
    p.add_argument("--prompts", type=int, default=len(support.PROMPTS),
                   help=f"prompts per round, at most {len(support.PROMPTS)}")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    p.add_argument("--rounds", type=int, default=3, help="measured one-client rounds")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (0: skip)")
    p.add_argument("--batch-rounds", type=int, default=3, help="measured concurrent rounds")
    p.add_argument("--no-router", action="store_true", help="leave out llama-server's router")
    p.add_argument("--llama-bin", default=str(support.ROOT / ".venv" / "bin" / "llama-server"),
                   help="llama-server binary for llamad's child and the router")
    p.add_argument("--out", type=Path, default=support.ROOT / "bench" / "RESULTS.md")
    p.add_argument("--max-foreign", type=float, default=0.05, metavar="CORES",
                   help="redo a measurement during which other processes used more CPU")
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= len(support.PROMPTS):
        p.error(f"--prompts must be in 1..{len(support.PROMPTS)}")
    if min(args.rounds, args.batch_rounds, args.threads) < 1 or args.clients < 0:
        p.error("--rounds, --batch-rounds and --threads must be >= 1, --clients >= 0")
    return args


@contextlib.asynccontextmanager
async def daemon(args: argparse.Namespace, model: Path, state: str, log: Path
                 ) -> AsyncIterator[tuple[DaemonProcess, grpc.aio.Channel, int]]:
    """A ``python -m daemon serve`` process; yields it, a channel to it, its HTTP port."""
    port = free_port()
    env = {**daemon_env("llama-server", model, args.threads), **GREEDY_CHAT,
           "LLAMAD_STATE_DIR": state, "LLAMAD_LLAMA_BIN": args.llama_bin,
           "LLAMAD_HTTP_LISTEN": f"127.0.0.1:{port}"}
    async with serving(env, log) as (proc, channel):
        yield proc, channel, port


async def generation_child(channel: grpc.aio.Channel) -> control_pb2.ChildStatus:
    resp = await control_pb2_grpc.ControlServiceStub(channel).Status(
        control_pb2.StatusRequest(), timeout=10)
    for child in resp.children:
        if child.role == common_pb2.CHILD_ROLE_GENERATION:
            found: control_pb2.ChildStatus = child
            return found
    raise SystemExit("bench: Status lists no generation child")


@contextlib.asynccontextmanager
async def router(args: argparse.Namespace, child_pid: int, log: Path
                 ) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    """llama-server in router mode with the child's settings; yields it and its port."""
    port = free_port()
    command = router_command(child_command(child_pid), support.MODELS_DIR, port,
                             args.llama_bin)
    env = router_environ(child_pid)
    proc = spawn(command, log, env)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     trust_env=False) as http:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/v1/models", timeout=5)).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"bench: the router did not start; see {log}")
                await asyncio.sleep(0.2)
        omp = " ".join(f"{k}={v}" for k, v in env.items() if k.startswith(("GOMP_", "OMP_")))
        print(f"  router: {omp} {shlex.join(command)}", flush=True)
        yield proc, port
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def router_model(http: httpx.AsyncClient, model: Path) -> str:
    """The router's id for ``model`` (its file name without ``.gguf``, as it lists it)."""
    ids = [m.get("id", "") for m in (await http.get("/v1/models", timeout=10)).json()["data"]]
    found = [str(i) for i in ids if model.stem.lower() in str(i).lower()]
    if not found:
        raise SystemExit(f"bench: the router lists no {model.stem}: {ids}")
    return min(found, key=len)


async def one_client(meter: Meter, relays: Sequence[Relay], prompts: Sequence[str],
                     args: argparse.Namespace) -> list[Sample]:
    samples: list[Sample] = []
    n = len(relays)
    for rnd in range(args.rounds + 1):  # round 0 is the warm-up
        began = time.perf_counter()
        for rot in range(n):
            for i in range(len(prompts)):
                relay = relays[(i + rnd + rot) % n]
                sample = await meter.single(relay, prompts, i, rnd, args.max_tokens)
                if rnd > 0:
                    samples.append(sample)
        what = "warm-up" if rnd == 0 else f"round {rnd}/{args.rounds}"
        print(f"  one client, {what}: {time.perf_counter() - began:.1f}s", flush=True)
    return samples


async def concurrent(meter: Meter, relays: Sequence[Relay], prompts: Sequence[str],
                     args: argparse.Namespace) -> list[Batch]:
    batches: list[Batch] = []
    n = len(relays)
    for rnd in range(args.batch_rounds + 1):
        began = time.perf_counter()
        for k in range(n):
            relay = relays[(k + rnd) % n]
            batch = await meter.batch(relay, prompts, rnd, args.clients, args.max_tokens)
            if rnd > 0:
                batches.append(batch)
        what = "warm-up" if rnd == 0 else f"round {rnd}/{args.batch_rounds}"
        print(f"  {args.clients} clients, {what}: {time.perf_counter() - began:.1f}s",
              flush=True)
    return batches


async def run(args: argparse.Namespace, command: str, state: str, logdir: Path) -> None:
    model = support.model_file(args.model)
    prompts = support.PROMPTS[: args.prompts]
    guard = Guard(max_foreign=args.max_foreign)
    cpu = Cpu()
    began = time.perf_counter()
    load_before = loadavg()
    await guard.quiet()
    async with contextlib.AsyncExitStack() as stack:
        proc, channel, port = await stack.enter_async_context(
            daemon(args, model, state, logdir / "daemon.log"))
        child = await generation_child(channel)
        print(f"daemon pid {proc.pid}, HTTP port {port}; child pid {child.pid} socket "
              f"{child.socket}", flush=True)
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        timeout = httpx.Timeout(300.0, connect=5.0)

        async def client(p: int) -> httpx.AsyncClient:
            return await stack.enter_async_context(httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{p}", trust_env=False, timeout=timeout,
                limits=limits))

        relays = [
            Relay(DIRECT, None, await stack.enter_async_context(
                child_http(child.socket, child.pid, timeout=timeout, limits=limits))),
            Relay(HTTP, proc.pid, await client(port), model="generation"),
            Relay(GRPC, proc.pid, stub=inference_pb2_grpc.InferenceServiceStub(channel)),
        ]
        if not args.no_router:
            rproc, rport = await stack.enter_async_context(
                router(args, child.pid, logdir / "router.log"))
            rhttp = await client(rport)
            relays.append(Relay(ROUTER, rproc.pid, rhttp, model=await router_model(rhttp, model)))
        meter = Meter(relays, guard, cpu)
        print(f"one client, {model.name}: paths {', '.join(r.name for r in relays)}", flush=True)
        samples = await one_client(meter, relays, prompts, args)
        batches: list[Batch] = []
        if args.clients:
            await guard.quiet()
            batches = await concurrent(meter, relays, prompts, args)
    total = time.perf_counter() - began
    print(f"total {total:.0f}s, of which {guard.waited:.0f}s waiting for a quiet machine; "
          f"{guard.redone} measurements redone\n", flush=True)
    env = support.environment(command, args.llama_bin)
    section = report(samples, batches, cpu, [r.name for r in relays], env=env, args=args,
                     model=model.name, guard=guard,
                     load=f"{load_before} before, {loadavg()} after",
                     minutes=total / 60)
    support.publish(args.out, [section])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    command = support.command_line("bench.bench_http_relay", argv)
    with tempfile.TemporaryDirectory(prefix="llamad-bench-state-") as state:
        logdir = Path(tempfile.mkdtemp(prefix="llamad-bench-relay-"))
        print(f"logs in {logdir}", flush=True)
        asyncio.run(run(args, command, state, logdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
