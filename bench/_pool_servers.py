"""The servers bench_pool runs side by side: llama-server's router, a llamad daemon, each
model on a llama-server of its own (*direct*), and their cold starts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shlex
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import orjson

from bench import _support as support
from bench._daemon import serving
from bench._relay import GREEDY_CHAT, free_port, spawn
from daemon import config
from daemon.config._sections import Settings
from llamad_protocol.v1 import control_pb2, control_pb2_grpc

GENERATION_SPIN = Settings().generation.spin_count  # llamad's children's GOMP_SPINCOUNT
MODELS = {"gemma": support.DEFAULT_MODEL, "smollm2": support.SMALL_MODEL}


@dataclass
class Outcome:
    model: str
    sent: float
    ttft: float = math.nan
    tokens: int = 0
    done: float = 0.0
    error: str = ""


def body(model: str, prompt: str, max_tokens: int) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}


async def request(http: httpx.AsyncClient, model: str, prompt: str,
                  max_tokens: int) -> Outcome:
    out = Outcome(model, time.perf_counter())
    chunks = 0
    finished = False
    try:
        async with http.stream("POST", "/v1/chat/completions",
                               json=body(model, prompt, max_tokens)) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                out.error = f"HTTP {resp.status_code}: {text[:160]}"
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if chunk.get("error"):
                    out.error = f"stream error: {str(chunk['error'])[:160]}"
                    return out
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        if math.isnan(out.ttft):
                            out.ttft = time.perf_counter() - out.sent
                    finished = finished or bool(choice.get("finish_reason"))
                usage = chunk.get("usage")
                if usage:
                    out.tokens = int(usage.get("completion_tokens") or 0)
    except (httpx.HTTPError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
        return out
    finally:
        out.done = time.perf_counter()
    if not finished:
        out.error = "the stream ended without a finish"
    out.tokens = out.tokens or chunks
    return out


# -- model starts, from /proc ----------------------------------------------------------------

def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def child_args(args: argparse.Namespace, threads: int | None = None) -> list[str]:
    # -c is the context of all slots together (llamad's ctx_size is per slot)
    return ["-t", str(threads or args.threads), "-c", str(args.ctx * args.parallel),
            "-np", str(args.parallel)]


async def wait_http(http: httpx.AsyncClient, path: str, proc: subprocess.Popen[bytes],
                    log: Path, *, timeout: float = 120.0, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: the server exited ({proc.returncode}); see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if (await http.get(path)).status_code == 200:
                return
        await asyncio.sleep(poll)
    raise SystemExit(f"bench: the server did not answer {path} within {timeout:.0f}s")


@contextlib.asynccontextmanager
async def router(args: argparse.Namespace, folder: Path, room: int, log: Path
                 ) -> AsyncIterator[tuple[int, httpx.AsyncClient, dict[str, str]]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_")}
    command = [args.llama_bin, "--models-dir", str(folder), "--models-max", str(room),
               "--host", "127.0.0.1", "--port", str(port), *child_args(args)]
    print(f"  router: {shlex.join(command)}", flush=True)
    proc = spawn(command, log, env)
    try:
        async with client(port) as http:
            await wait_http(http, "/v1/models", proc, log)
            listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
            ids = {}
            for name, file in MODELS.items():
                stem = Path(file).stem
                ids[name] = next((i for i in listed if i == stem), "") or next(
                    i for i in listed if stem in i)
            yield proc.pid, http, ids
    finally:
        stop(proc)


def llamad_config(folder: Path, room: int, path: Path) -> Path:
    preload = "preload = true\n" if room >= len(MODELS) else ""
    tables = "\n".join(
        f'[models.{name}]\nmodel = "{folder / file}"\npin = false\n{preload}'
        for name, file in MODELS.items())
    path.write_text(f'[models]\nmax_resident = {room}\n\n[generation]\nmodel = "smollm2"\n\n'
                    f"{tables}")
    return path


def llamad_env(args: argparse.Namespace, folder: Path, room: int, logdir: Path,
               port: int) -> dict[str, str]:
    empty = logdir / "no-other-models"
    empty.mkdir(exist_ok=True)
    return {**GREEDY_CHAT,
           "LLAMAD_CONFIG": str(llamad_config(folder, room, logdir / f"llamad-{room}.toml")),
           "LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_HTTP_LISTEN": f"127.0.0.1:{port}",
           "LLAMAD_MODELS_DIR": str(empty), "LLAMAD_STATE_DIR": str(logdir / f"state-{room}"),
           "LLAMAD_LLAMA_BIN": args.llama_bin, "LLAMAD_EMBEDDING_ENABLED": "false",
           "LLAMAD_RETRIEVAL_ENABLED": "false", "LLAMAD_LOG_FORMAT": "json",
           **({"LLAMAD_GENERATION_THREADS": str(args.llamad_threads)}
              if args.llamad_threads is not None else {}),
           "LLAMAD_GENERATION_CTX_SIZE": str(args.ctx),
           "LLAMAD_GENERATION_PARALLEL": str(args.parallel),
           **({"LLAMAD_MODELS_TURN": str(args.turn)} if args.turn is not None else {}),
           **({"LLAMAD_GENERATION_SPIN_COUNT": str(args.spin_count)}
              if args.spin_count is not None else {})}


def llamad_threads(args: argparse.Namespace, folder: Path, room: int, logdir: Path
                   ) -> dict[str, int]:
    """The threads llamad runs each model with in the room-for-``room`` setup, read with
    the daemon's own configuration loader."""
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    loaded = config.load(parser.parse_args([]),
                         env=llamad_env(args, folder, room, logdir, 0))
    return {e.name: e.child.threads for e in loaded.catalog.entries if e.name in MODELS}


@contextlib.asynccontextmanager
async def llamad(args: argparse.Namespace, folder: Path, room: int, logdir: Path
                 ) -> AsyncIterator[tuple[int, httpx.AsyncClient, grpc.aio.Channel]]:
    port = free_port()
    env = llamad_env(args, folder, room, logdir, port)
    async with (serving(env, logdir / f"llamad-{room}.log") as (proc, channel),
                client(port) as http):
        yield proc.pid, http, channel


@contextlib.asynccontextmanager
async def client(port: int) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", trust_env=False,
            timeout=httpx.Timeout(300.0, connect=5.0),
            # A new connection per request: llama-server (cpp-httplib) closes idle
            # keep-alive connections on its own, and a request sent on one as it closes
            # fails with "Server disconnected without sending a response" (measured: 10
            # of 343 in 30 s with 8 clients straight to one llama-server, 0 of 367
            # without keep-alive), a client-side race, not the server failing a request.
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=0)) as http:
        yield http


@contextlib.asynccontextmanager
async def direct_servers(args: argparse.Namespace, folder: Path, logdir: Path,
                         threads: dict[str, int]) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """Each model on a llama-server of its own, started as llamad starts its children
    (the same settings, ``threads`` and GOMP_SPINCOUNT), for the room-for-both
    reference."""
    spin = args.spin_count if args.spin_count is not None else GENERATION_SPIN
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_")}
    if spin >= 0:
        env["GOMP_SPINCOUNT"] = str(spin)
    async with contextlib.AsyncExitStack() as stack:
        routes: dict[str, httpx.AsyncClient] = {}
        for name, file in MODELS.items():
            port = free_port()
            log = logdir / f"direct-{name}.log"
            # HTTP threads for every client: llama-server's default (slots + 2) closes
            # the connections past them unanswered, and the reference must not fail.
            proc = spawn([args.llama_bin, "-m", str(folder / file), "--host", "127.0.0.1",
                          "--port", str(port), "--threads-http", str(args.clients + 2),
                          *child_args(args, threads[name])], log, env)
            stack.callback(stop, proc)
            http = await stack.enter_async_context(client(port))
            await wait_http(http, "/health", proc, log)
            routes[name] = http
        yield routes


# -- cold start ------------------------------------------------------------------------------


async def cold_direct(args: argparse.Namespace, folder: Path, logdir: Path,
                      threads: int) -> float:
    port = free_port()
    log = logdir / "cold-direct.log"
    began = time.perf_counter()
    proc = spawn([args.llama_bin, "-m", str(folder / MODELS["gemma"]), "--host",
                  "127.0.0.1", "--port", str(port), *child_args(args, threads)], log,
                 {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_")})
    try:
        async with client(port) as http:
            await wait_http(http, "/health", proc, log, poll=0.01)
            out = await request(http, "", support.PROMPTS[0], args.max_tokens)
            if out.error:
                raise SystemExit(f"bench: cold start request failed: {out.error}")
            return out.sent + out.ttft - began
    finally:
        stop(proc)


async def cold_llamad(http: httpx.AsyncClient, channel: grpc.aio.Channel,
                      args: argparse.Namespace) -> float:
    control = control_pb2_grpc.ControlServiceStub(channel)
    await control.UnloadModel(control_pb2.UnloadModelRequest(name="gemma"), timeout=120)
    out = await request(http, "gemma", support.PROMPTS[0], args.max_tokens)
    if out.error:
        raise SystemExit(f"bench: cold request through llamad failed: {out.error}")
    return out.ttft


# -- report ----------------------------------------------------------------------------------
