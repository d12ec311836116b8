"""``llamad retrieval migrate --to postgres``: copy the embedded store into PostgreSQL.

A local command (no daemon is called): it reads the state directory's embedded store and
writes the PostgreSQL store (:mod:`retrieval._migrate`). The state directory and the
``retrieval.postgres_*`` options are taken as ``llamad serve`` takes them: a flag, else
its ``LLAMAD_*`` variable, else the TOML file of ``--config`` / ``LLAMAD_CONFIG`` (other
settings of that file are ignored), else the default. ``retrieval.store`` is not read:
the command copies out of the embedded store whatever the daemon is configured with.

It takes the state directory's lock (:mod:`daemon.ops.statelock`) for the whole run: a daemon
running on that directory makes it refuse, and no daemon can start there meanwhile.

Progress goes to stderr after each batch: on a terminal a bar (chunks done of the total,
the documents, rate and ETA, drawn by tqdm and erased at the end), elsewhere a line
(documents and chunks of the totals, chunks per second) at most once a second; the
summary, including what was not copied and why, to stdout. Exit status: 0 done (or
nothing left to do); 1 the server was lost or a batch failed (rerun to resume); 2 a
configuration or usage error, the state directory in use, no embedded store, or a corpus
of another embedding model; 3 ``--max-batches`` stopped it before the end (rerun to
resume).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]  # (no stubs; a small surface)

from retrieval import (
    Migration,
    MigrationRefused,
    PgOptions,
    RetrievalError,
    StoreUnavailable,
    migrate_store,
)

from ..config._load import _flatten, read_config_file, state_dir_of
from ..config._options import ConfigError, Option, _coerce, with_values
from ..config._retrieval import RetrievalSettings, check_store
from ..config._sections import OPTIONS, Settings
from ..services.retrieval_bridge import pg_options
from .statelock import StateDirInUse, StateLock

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INCOMPLETE = 3

_OPTIONS: tuple[Option, ...] = tuple(
    o for o in OPTIONS if o.key == "state_dir" or o.key.startswith("retrieval.postgres_"))
"""The daemon's options this command reads."""


def add_retrieval_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``retrieval migrate`` to the ``llamad`` command's subparsers."""
    retrieval = sub.add_parser("retrieval", help="local maintenance of the retrieval store",
                               description="Local maintenance of the retrieval store (no "
                               "daemon is called).")
    verbs = retrieval.add_subparsers(dest="retrieval_command", required=True)
    p = verbs.add_parser(
        "migrate", help="copy the embedded store into PostgreSQL (resumable)",
        description="Copy the state directory's embedded store (sources, documents, "
        "chunks, vectors) into the PostgreSQL store, in batches, resumably. Stop the "
        "daemon first. Options as `llamad serve` takes them (flag, env, --config file).")
    p.add_argument("--to", required=True, choices=("postgres",),
                   help="the store to copy into")
    p.add_argument("--config", metavar="FILE",
                   help="TOML configuration file (env LLAMAD_CONFIG); only state_dir and "
                   "retrieval.postgres_* are read from it")
    for opt in _OPTIONS:
        p.add_argument(opt.flag, dest=opt.dest, default=None, help=f"{opt.help} Env: {opt.env}.",
                       metavar=opt.key.split(".")[-1].upper())
    p.add_argument("--batch-documents", type=int, default=50, metavar="N",
                   help="documents per transaction (an interruption loses at most one "
                   "batch). Default: 50.")
    p.add_argument("--max-batches", type=int, default=0, metavar="N",
                   help="stop after N batches (exit status 3; rerun to continue). "
                   "Default: 0, run to the end.")


def resolve(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Path, PgOptions]:
    """The state directory and the PostgreSQL options, flag > env > file > default.

    Raises:
        ConfigError: an unreadable file, a bad value, a missing or unusable DSN, both
            password sources.
    """
    values: dict[str, Any] = {o.key: o.default for o in _OPTIONS}
    path = getattr(args, "config", None) or env.get("LLAMAD_CONFIG")
    if path:
        flat = _flatten(read_config_file(path))
        for opt in _OPTIONS:
            if opt.key in flat:
                values[opt.key] = _coerce(opt, flat[opt.key], f"file {path}")
    for opt in _OPTIONS:
        if opt.env in env:
            values[opt.key] = _coerce(opt, env[opt.env], f"env {opt.env}")
        raw = getattr(args, opt.dest, None)
        if raw is not None:
            values[opt.key] = _coerce(opt, raw, f"flag {opt.flag}")
    settings = with_values(Settings(), values)
    r: RetrievalSettings = with_values(settings.retrieval, {"store": "postgres"})
    check_store(r)
    return state_dir_of(settings.state_dir, env), pg_options(r, max_connections=2)


class _Reporter:
    """The run's progress on stderr: on a terminal a tqdm bar (chunks of the total, the
    documents, rate and ETA), erased at the end; elsewhere (a log, a pipe) a line at most
    once a second and the last."""

    def __init__(self, terminal: bool) -> None:
        self._last = 0.0
        self._bar: Any = None  # a tqdm, on a terminal, from the first report
        self._terminal = terminal

    def __call__(self, m: Migration, *, final: bool = False) -> None:
        if self._terminal:
            self._draw(m, final)
            return
        now = time.monotonic()
        if not final and now - self._last < 1.0:
            return
        self._last = now
        print(f"llamad: migrate: {m.documents}/{m.documents_total} documents, "
              f"{m.chunks}/{m.chunks_total} chunks, {m.chunks_per_second:.0f} chunks/s",
              file=sys.stderr, flush=True)

    def _draw(self, m: Migration, final: bool) -> None:
        if self._bar is None and not final:
            self._bar = tqdm(total=m.chunks_total or None, file=sys.stderr, desc="migrate",
                             unit=" chunks", dynamic_ncols=True, leave=False,
                             mininterval=0.2)
        if self._bar is None:
            return
        self._bar.n = m.chunks
        self._bar.set_postfix_str(f"{m.documents}/{m.documents_total} documents",
                                  refresh=False)
        self._bar.refresh()
        # Erased at the last batch, before the store logs its summary line on stderr (the
        # summary on stdout says it all), or at the end of a run stopped early.
        if final or m.documents >= m.documents_total:
            self._bar.close()
            self._bar = None


def summary(m: Migration) -> str:
    """The summary printed at the end."""
    state = "complete" if m.complete else "stopped early (rerun to continue)"
    lines = [
        f"migrated into {m.target}: {state}",
        f"  sources written: {m.sources}",
        f"  documents written: {m.documents} ({m.chunks} chunks, {m.vectors} with a vector"
        f" of {m.model or 'no model'}, {m.without_vector} without)",
        f"  already present (same content): {m.present}",
        f"  states of documents not indexed written: {m.states}",
        f"  time: {m.elapsed:.1f} s ({m.chunks_per_second:.0f} chunks/s)",
    ]
    if m.left_alone:
        lines.append(f"  documents in Postgres the embedded store lacks (left alone): "
                     f"{m.left_alone}")
    lines += [f"  skipped: {line}" for line in m.skipped] or ["  skipped: nothing"]
    return "\n".join(lines) + "\n"


def run_retrieval(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Run ``llamad retrieval migrate``; return the exit status."""
    env = os.environ if env is None else env
    if args.batch_documents < 1 or args.max_batches < 0:
        print("llamad: migrate: --batch-documents must be at least 1 and --max-batches "
              "not negative", file=sys.stderr)
        return EXIT_CONFIG
    try:
        state_dir, postgres = resolve(args, env)
    except ConfigError as exc:
        print(f"llamad: migrate: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if not (state_dir / "retrieval").is_dir():
        print(f"llamad: migrate: no embedded retrieval store in {state_dir} (no "
              f"{state_dir / 'retrieval'}): nothing to migrate", file=sys.stderr)
        return EXIT_CONFIG
    lock = StateLock(state_dir)
    try:
        lock.acquire()
    except OSError as exc:
        hint = " (stop the daemon before migrating)" if isinstance(exc, StateDirInUse) else ""
        print(f"llamad: migrate: {exc}{hint}", file=sys.stderr)
        return EXIT_CONFIG
    reporter = _Reporter(sys.stderr.isatty())
    try:
        result = migrate_store(state_dir / "retrieval", postgres,
                         batch_documents=args.batch_documents, max_batches=args.max_batches,
                         on_progress=reporter)
    except RetrievalError as exc:
        if isinstance(exc, MigrationRefused):
            print(f"llamad: migrate: refused: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        failed = "" if isinstance(exc, StoreUnavailable) else "failed: "
        print(f"llamad: migrate: {failed}{exc} (rerun to resume)", file=sys.stderr)
        return EXIT_FAILED
    finally:
        lock.release()
    reporter(result, final=True)
    sys.stdout.write(summary(result))
    return EXIT_OK if result.complete else EXIT_INCOMPLETE
