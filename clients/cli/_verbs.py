"""One function per ``llamad`` client verb: ``verb(client, args) -> exit status``.

Results go to stdout; warnings and progress to stderr (progress only on a terminal).
Failed calls raise :class:`~clients.errors.LlamadError`, which :func:`clients.cli._commands.run`
turns into the one-line message and the documented exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import errors
from .._client import Client
from .._stream import Stream, TextStream
from .._tools import joined
from .._types import (
    ChildStatus,
    Message,
    ReindexProgress,
    RetrievalStatus,
    SwapProgress,
    TokenLogprobs,
    ToolCallDelta,
    VectorBackfill,
    VectorRebuild,
)
from . import _format as fmt
from . import _generation as gen
from ._balancing import drain, health, undrain  # noqa: F401 - verbs, run by name
from ._history import add_source, push, retention  # noqa: F401 - push: a verb
from ._models import models_table
from ._progress import ScanBars, count_files
from ._review import approve, documents, reject  # noqa: F401 - verbs, run by name
from ._search import ask, search  # noqa: F401 - verbs, run by name


class UsageError(Exception):
    """A bad combination of arguments (exit status 2)."""


def _text_arg(value: str) -> str:
    """The argument itself, or stdin for ``-``."""
    return sys.stdin.read() if value == "-" else value


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    try:
        extra = gen.controls(args)
    except gen.ControlError as exc:
        raise UsageError(str(exc)) from None
    return {"max_tokens": args.max_tokens, "temperature": args.temperature,
            "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed, "stop": args.stop,
            **extra}


def _stream_text(stream: TextStream, as_json: bool) -> str:
    """Print a Generate/Chat stream as it comes; return the whole text."""
    out = sys.stdout
    parts: list[str] = []
    logprobs: list[TokenLogprobs] = []
    pieces: list[ToolCallDelta] = []
    usage = None
    finish = model = ""
    with stream:
        for chunk in stream:
            if as_json:
                fmt.json_line(out, chunk)
            elif chunk.text:
                out.write(chunk.text)
                out.flush()
            parts.append(chunk.text)
            logprobs.extend(chunk.logprobs)
            pieces.extend(chunk.tool_calls)
            model = chunk.model_name or model
            if chunk.usage is not None:
                usage, finish = chunk.usage, chunk.finish_reason or ""
    text = "".join(parts)
    if not as_json and text and not text.endswith("\n"):
        out.write("\n")
        out.flush()
    if logprobs and not as_json:
        gen.print_logprobs(out, tuple(logprobs))
    if pieces and not as_json:  # the whole calls, one JSON line each
        for call in joined(pieces):
            fmt.json_line(out, {"tool_call": call})
    if usage is not None and not as_json and sys.stderr.isatty():
        print(f"[{model + ', ' if model else ''}{usage.completion_tokens} tokens, "
              f"{usage.tokens_per_second:.1f} tokens/s, "
              f"first after {usage.time_to_first_token_ms:.0f} ms, {finish}]", file=sys.stderr)
    return text


# --- status -----------------------------------------------------------------------------

def _child_row(c: ChildStatus) -> list[str]:
    if not c.enabled or c.mode == "disabled":
        return [c.role, "disabled"] + ["-"] * 8 + [fmt.clip(c.last_error, 60) or "-"]
    running = c.state == "running"
    problem = fmt.clip(c.last_error, 60)
    if not problem and c.last_exit is not None:
        problem = c.last_exit.kind + (f": {fmt.clip(c.last_exit.message, 48)}"
                                      if c.last_exit.message else "")
    model = c.endpoint_model if c.mode == "endpoint" else fmt.basename(c.model_path)
    return [
        c.role, c.state, str(c.pid) if c.pid else "-", model or "-",
        c.runtime or "-", fmt.duration(c.uptime_seconds) if running else "-", str(c.restarts),
        c.breaker, f"{c.in_flight}/{c.slots}" + (f"+{c.queue_ahead}" if c.queue_ahead else ""),
        str(c.queued), problem or "-",
    ]


def _retrieval_line(r: RetrievalStatus) -> str:
    docs = sum(r.documents_by_state.values())
    states = ", ".join(f"{n} {s}" for s, n in sorted(r.documents_by_state.items()) if n)
    model = f", model {r.embedding_model}" if r.embedding_model else ""
    return (f"retrieval: {r.sources} sources, {docs} documents"
            + (f" ({states})" if states else "")
            + f", {r.chunks} chunks ({r.embedded_chunks} embedded), {r.vectors} vectors"
            + f"{model}, " + _where(r) + _rebuild_note(r.rebuild)
            + _backfill_note(r.backfill)
            + (f"; {r.pruned} history records pruned since start" if r.pruned else ""))


def _where(r: RetrievalStatus) -> str:
    """Where the index lives: its size on this node's disk, or the shared store."""
    if r.store == "postgres":
        return f"postgres store {r.store_target} (lexical ranking {r.lexical_ranking})"
    return f"{fmt.size(r.disk_bytes)} on disk"


def _rebuild_note(b: VectorRebuild) -> str:
    if not b.model:
        return ""
    serving = (f"model {b.serving_model} serves until then" if b.serving_model
               else "searches are BM25-only until then")
    state = "rebuilding" if b.running else "to rebuild"
    return (f"; {state} vectors for model {b.model} ({b.done} of {b.done + b.pending} "
            f"chunks embedded): {serving}")


def _backfill_note(b: VectorBackfill) -> str:
    if b.running:
        return f"; embedding {b.pending} chunks without vectors ({b.done} done)"
    notes = [f"{b.failed} chunks refused by the model (BM25-only)"] if b.failed else []
    if b.last_error:
        notes.append(f"last backfill stopped: {b.last_error}")
    return "".join(f"; {n}" for n in notes)


def status(client: Client, args: argparse.Namespace) -> int:
    st = client.status()
    retrieval: RetrievalStatus | None = None
    problem = ""
    try:
        retrieval = client.retrieval_status()
    except errors.Unimplemented:
        problem = "disabled"
    except errors.LlamadError as exc:
        problem = f"unavailable: {exc.details}"
    if args.json:
        print(fmt.to_json({
            "address": client.address, "version": st.version,
            "uptime_seconds": st.uptime_seconds, "draining": st.draining,
            "drained": st.drained,
            "children": st.children, "models": st.models, "retrieval": retrieval,
            "retrieval_problem": problem or None,
        }, indent=2))
        return 0
    print(f"llamad {st.version} at {client.address}, up {fmt.duration(st.uptime_seconds)}"
          + (", DRAINING (shutting down)" if st.draining else "")
          + (", DRAINED (llamad undrain ends it)" if st.drained and not st.draining else ""))
    header = ("ROLE", "STATE", "PID", "MODEL", "RUNTIME", "UP", "RESTARTS", "BREAKER",
              "BUSY/SLOTS", "QUEUED", "LAST ERROR")
    print(fmt.table([_child_row(c) for c in st.children], header))
    if st.models:
        print()
        print(models_table(st.models))
    for c in st.children:
        if c.mode == "endpoint":
            print(f"{c.role}: endpoint {c.endpoint_url or '(configured)'}")
        if c.chat_template:
            print(f"{c.role}: chat template {c.chat_template}")
        if c.loading is not None:
            p = c.loading
            print(f"{c.role}: starting, {p.phase.replace('_', ' ')}, {p.seconds:.1f} s so far"
                  + (f" (its last start took {p.expected_seconds:.1f} s)"
                     if p.expected_seconds else ""))
        if c.last_swap is not None:
            s = c.last_swap
            print(f"{c.role}: swapped {fmt.basename(s.from_model)} -> "
                  f"{fmt.basename(s.to_model)} at {fmt.when(s.at)}"
                  + (f" ({s.reason})" if s.reason else ""))
    print(_retrieval_line(retrieval) if retrieval is not None else f"retrieval: {problem}")
    return 0


# --- inference --------------------------------------------------------------------------

def generate(client: Client, args: argparse.Namespace) -> int:
    _stream_text(client.generate(_text_arg(args.prompt), model=args.model,
                                 **_sampling(args)), args.json)
    return 0


def _tool_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` of ``--tools FILE`` and ``--tool-choice``."""
    if args.tools is None:
        if args.tool_choice is not None:
            raise UsageError("--tool-choice goes with --tools FILE")
        return {}
    try:
        tools = json.loads(Path(args.tools).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--tools {args.tools}: {why}") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise UsageError(f"--tools {args.tools}: give a JSON array of tool objects")
    return {"tools": tools, "tool_choice": args.tool_choice}


def embed(client: Client, args: argparse.Namespace) -> int:
    texts = [_text_arg(t) for t in args.texts]
    result = client.embed(texts, model=args.model)
    if args.json:
        print(fmt.to_json(result))
        return 0
    for text, vector in zip(texts, result.vectors, strict=True):
        head = ", ".join(f"{v:.4f}" for v in vector[:4])
        print(f"{fmt.clip(text, 40)}: [{head}, ...] ({result.dimension} dimensions)")
    if sys.stderr.isatty():
        print(f"[{result.model_name or result.model}, {result.prompt_tokens} tokens]",
              file=sys.stderr)
    return 0


def chat(client: Client, args: argparse.Namespace) -> int:
    messages: list[Message] = [Message(role, text) for role, text in args.messages or []]
    options = {"model": args.model, **_tool_options(args), **_sampling(args)}
    if any(m.role == "user" for m in messages):
        _stream_text(client.chat(messages, **options), args.json)
        return 0
    prompt = sys.stdin.isatty() and sys.stderr.isatty()
    while True:
        if prompt:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        messages.append(Message("user", line.rstrip("\n")))
        reply = _stream_text(client.chat(messages, **options), args.json)
        messages.append(Message("assistant", reply))


# --- documents --------------------------------------------------------------------------

def _counts(p: ReindexProgress, seconds: float) -> str:
    rate = p.seen / seconds if seconds > 0 else 0.0
    return (f"{p.source_id}: {p.seen} files: {p.added} added, {p.changed} changed, "
            f"{p.unchanged} unchanged, {p.deleted} deleted, {p.failed_total} failed, "
            f"{p.skipped_total} skipped" + (f", {p.excluded} excluded" if p.excluded else "")
            + f" — {seconds:.1f}s, {rate:.1f} files/s")


def _scan_totals(client: Client, source_id: str) -> dict[str, int | None]:
    """The files of each directory source to scan, counted here (None: not here)."""
    return {s.id: count_files(s.path) for s in client.list_sources()
            if s.kind == "directory" and s.path and not s.disabled
            and source_id in ("", s.id)}


def _reindex(client: Client, source_id: str, as_json: bool, verb: str,
             since: datetime | None = None, *, totals: dict[str, int | None] | None = None
             ) -> int:
    shown = sys.stderr.isatty() and not as_json
    if shown and totals is None:
        totals = _scan_totals(client, source_id)
    bars = ScanBars(sys.stderr, totals or {}, shown=shown)
    if source_id:
        bars.start(source_id)
    began = time.monotonic()
    finished = 0
    with client.reindex(source_id, since=since) as stream:
        for p in stream:
            seconds = time.monotonic() - began
            if not p.done:
                bars.update(p)
                continue
            finished += 1
            bars.close()
            if as_json:
                fmt.json_line(sys.stdout, {**dataclasses.asdict(p), "seconds": seconds})
            else:
                print(_counts(p, seconds), flush=True)
            for issue in p.failed:
                print(f"llamad: {verb}: {p.source_id}: {issue.path}: {issue.reason}",
                      file=sys.stderr)
            if p.failed_total > len(p.failed):
                print(f"llamad: {verb}: {p.source_id}: {p.failed_total - len(p.failed)} "
                      "more files failed (not listed)", file=sys.stderr)
            if p.limit_reached:
                print(f"llamad: {verb}: {p.source_id}: {p.limit_reached}", file=sys.stderr)
            began = time.monotonic()
    if not finished:
        print(f"llamad: {verb}: no directory source to scan", file=sys.stderr)
    return 0


# The daemon's rule for source ids (retrieval.errors.validate_source_id), checked here so
# that an id made from a directory's name can be refused as a usage error.
_SOURCE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def default_source_id(path: Path) -> str:
    """The source id ``ingest`` gives a directory when ``--source`` is not given: its name,
    lower-cased, each run of characters a source id may not hold made one ``-``
    (``My Docs`` is ``my-docs``).

    Raises:
        UsageError: nothing of the name is left that makes an id (``/``, ``文書``).
    """
    source_id = re.sub(r"[^a-z0-9_-]+", "-", path.name.lower()).strip("-_")[:64]
    if not _SOURCE_ID.fullmatch(source_id):
        raise UsageError(f"the name {path.name or str(path)!r} makes no source id (1-64 "
                         "characters of a-z, 0-9, '_' and '-'): give one with --source ID")
    return source_id


def ingest(client: Client, args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser().resolve()
    if not path.is_dir():
        raise UsageError(f"{args.path} is not a directory")
    source_id = args.source
    if source_id is None:
        source_id = default_source_id(path)
        # An id made from a name must not take over another directory's source: adding it
        # again would re-point that source here, and the scan would drop its documents.
        taken = next((s for s in client.list_sources() if s.id == source_id), None)
        if taken is not None and taken.path != str(path):
            raise UsageError(f"source {source_id!r} already exists for "
                             f"{taken.path or 'pushed documents'}: give this directory its "
                             "own id with --source ID")
    client.add_source(source_id, path, category=args.category, tags=args.tags,
                      review_required=args.review, exclude=args.exclude)
    totals = ({source_id: count_files(path)} if sys.stderr.isatty() and not args.json
              else {})
    return _reindex(client, source_id, args.json, "ingest", totals=totals)


def reindex(client: Client, args: argparse.Namespace) -> int:
    return _reindex(client, args.source, args.json, "reindex", args.since)


def reprocess(client: Client, args: argparse.Namespace) -> int:
    done = client.reprocess(document_id=args.document, source_id=args.source)
    if args.json:
        print(fmt.to_json(done))
    elif done.chunks:
        print(f"embedding {done.chunks} chunks in the background (llamad status shows "
              "progress)")
    else:
        print(f"nothing to embed: {done.reason}")
    return 0


def sources(client: Client, args: argparse.Namespace) -> int:
    if not args.add and (args.history or args.max_age_days or args.max_items or args.review):
        raise UsageError("--history, --max-age-days, --max-items and --review go with "
                         "--add ID")
    if args.add:
        added = add_source(client, args)
        if not args.json:
            notes = [retention(added)] if added.kind == "history" else []
            if added.review_required:
                notes.append("review required")
            print(f"{added.id}: {added.kind} source"
                  + (f" ({'; '.join(notes)})" if notes else ""))
            return 0
    if args.disable or args.enable:
        changed = client.set_source_disabled(args.disable or args.enable,
                                             disabled=bool(args.disable))
        if not args.json:
            print(f"{changed.id}: {'disabled' if changed.disabled else 'enabled'} "
                  f"({changed.documents} documents)")
            return 0
    found = client.list_sources()
    if args.json:
        print(fmt.to_json(found, indent=2))
        return 0
    if not found:
        print("llamad: sources: no sources", file=sys.stderr)
        return 0
    rows = [[s.id + (" (disabled)" if s.disabled else "")
             + (" (review)" if s.review_required else ""), s.kind, str(s.documents),
             s.category or "-", ",".join(s.tags) or "-", fmt.when(s.last_scan), s.path or "-",
             retention(s), fmt.clip(s.last_error, 60) or "-"]
            for s in found]
    print(fmt.table(rows, ("ID", "KIND", "DOCS", "CATEGORY", "TAGS", "LAST SCAN", "PATH",
                           "RETENTION", "LAST ERROR")))
    return 0


# --- control ----------------------------------------------------------------------------

def swap(client: Client, args: argparse.Namespace) -> int:
    changes = bool(args.model) or args.ctx_size is not None or args.extra_args is not None
    if args.rollback and changes:
        raise UsageError("--rollback takes no MODEL, --ctx-size or --extra-args")
    if not (args.rollback or changes):
        raise UsageError("give MODEL, --rollback, --ctx-size or --extra-args")
    model = os.path.abspath(os.path.expanduser(args.model)) if args.model else ""
    stream = client.swap(args.role, model, extra_args=args.extra_args, ctx_size=args.ctx_size,
                         rollback=args.rollback, stop_old_first=args.stop_old_first,
                         reason=args.reason, name=args.name)
    _print_progress(stream, args.json)
    return 0


def _print_progress(stream: Stream[SwapProgress], as_json: bool) -> None:
    with stream:
        for p in stream:
            if as_json:
                fmt.json_line(sys.stdout, p)
                continue
            print(f"{p.elapsed_seconds:6.1f}s  {p.stage:<10}  {p.message}".rstrip(), flush=True)
            if p.cause is not None:
                print(f"{'':9}cause: {p.cause.kind}: {p.cause.message}".rstrip(), flush=True)


def mode(client: Client, args: argparse.Namespace) -> int:
    if args.mode != "endpoint" and (args.url or args.api_key_file or args.api_key_env):
        raise UsageError("--url, --api-key-file and --api-key-env are for the endpoint mode")
    if args.mode == "disabled" and args.model:
        raise UsageError("--model is for the embedded and endpoint modes")
    model_path = ""
    endpoint_model = ""
    if args.mode == "embedded" and args.model:
        model_path = os.path.abspath(os.path.expanduser(args.model))
    elif args.mode == "endpoint":
        endpoint_model = args.model
    stream = client.set_mode(args.role, args.mode, endpoint_url=args.url,
                             endpoint_model=endpoint_model, api_key_file=args.api_key_file,
                             api_key_env=args.api_key_env, model_path=model_path,
                             reason=args.reason)
    _print_progress(stream, args.json)
    return 0


def logs(client: Client, args: argparse.Namespace) -> int:
    if args.lines < 0:
        raise UsageError("-n must be 0 (all) or more")
    with client.tail_logs(args.role, lines=args.lines, follow=args.follow) as stream:
        for line in stream:
            if args.json:
                fmt.json_line(sys.stdout, line)
            else:
                print(f"{fmt.when(line.time)}  {line.text}", flush=args.follow)
    return 0
