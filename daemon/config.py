"""Configuration: one registry of options, read from flags, environment, a TOML file.

Precedence: flag > environment > file > default. Every option is declared once in
:data:`OPTIONS`; from there it gets its flag (``--generation-model``), its environment
variable (``LLAMAD_GENERATION_MODEL``), its TOML key (``[generation] model``), its
``--help`` text, and its validation. Invalid values stop the daemon at start with one
clear line naming the option and where the value came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import models
from models import MANIFEST_NAME, Manifest, ManifestError
from supervisor import (
    EndpointError,
    EndpointSpec,
    RestartPolicy,
    Timeouts,
    normalise_url,
    read_api_key,
)

from .access import AccessError, TlsMaterial, TokenTable, load_tls, load_tokens


class ConfigError(Exception):
    """A configuration value is missing or invalid."""


Reload = Literal["apply", "new_child", "restart"]
"""What a reload (SIGHUP) does with a changed option: ``apply`` it to the running daemon,
bring its child to it through a swap or a mode switch (``new_child``), or report that it
needs a ``restart`` and keep the running value (see :mod:`daemon.reload`)."""


@dataclass(frozen=True)
class Option:
    """One setting. ``key`` is ``section.name`` or ``name`` (top level)."""

    key: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    reload: Reload = "restart"
    """What a reload does with a change; an option nobody taught reload to apply needs a
    restart, and the reload says so."""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace(".", "-").replace("_", "-")

    @property
    def env(self) -> str:
        return "LLAMAD_" + self.key.replace(".", "_").upper()

    @property
    def dest(self) -> str:
        return self.key.replace(".", "__")


MODES = ("embedded", "endpoint", "disabled")

INSTALLED_MODELS_DIR = "/var/lib/llamad/models"
"""Where the README's installation prepares the models (the unit's StateDirectory)."""


def _child_options(role: str, *, enabled: bool, threads: int, parallel: int, ctx: int,
                   spin: int, ahead: int) -> list[Option]:
    options = [
        Option(f"{role}.enabled", bool, enabled,
               f"Serve {role} (false is {role}.mode = disabled)."),
        Option(f"{role}.mode", str, "embedded",
               f"Where {role} runs: embedded (a supervised llama.cpp child), endpoint (an "
               "external OpenAI-compatible server), or disabled.", choices=MODES),
        Option(f"{role}.model", str, "", f"Path of the {role} GGUF model (embedded mode)."),
        Option(f"{role}.endpoint_url", str, "",
               "Endpoint mode: the server's base URL, with or without /v1 "
               "(e.g. http://10.0.0.5:8080/v1)."),
        Option(f"{role}.endpoint_model", str, "",
               "Endpoint mode: the model id to use (default: the only one it offers)."),
        Option(f"{role}.api_key_file", str, "",
               "Endpoint mode: file holding the API key (must not be world-readable)."),
        Option(f"{role}.api_key_env", str, "",
               "Endpoint mode: name of the environment variable holding the API key."),
        Option(f"{role}.runtime", str, "auto",
               "Runtime: llama-server, bundled (python -m llama_cpp.server), or auto "
               "(llama-server when found).", choices=("auto", "llama-server", "bundled")),
        Option(f"{role}.ctx_size", int, ctx,
               "Context tokens per slot (0: the model's training context).", minimum=0),
        Option(f"{role}.threads", int, threads, "CPU threads for the child.", minimum=1),
        Option(f"{role}.parallel", int, parallel,
               "Concurrent request slots (llama-server; the bundled runtime serves one; "
               "calls llamad sends an endpoint at once).", minimum=1),
        Option(f"{role}.queue_ahead", int, ahead,
               "Calls sent to a llama-server child beyond its slots, to wait in its own "
               "queue: a slot that finishes starts the next one at once instead of idling "
               "for the round trip to llamad and back (short calls such as embeddings); "
               "0 sends exactly as many calls as there are slots.", minimum=0,
               reload="apply"),
        Option(f"{role}.batch", int, 512, "Logical batch size in tokens.", minimum=1),
        Option(f"{role}.spin_count", int, spin,
               "GOMP_SPINCOUNT of the child: how long llama.cpp's OpenMP threads spin at a "
               "barrier before they sleep. Short spins let the two children, a swap's "
               "overlap or other load share the cores instead of starving each other; -1 "
               "keeps the daemon's environment (OpenMP's default spins long).", minimum=-1),
        Option(f"{role}.extra_args", str, "",
               "Extra runtime arguments, space separated, appended verbatim."),
    ]
    # A role's settings go through the swap or mode-switch path, but for its queue ahead.
    return [o if o.reload == "apply" else dataclasses.replace(o, reload="new_child")
            for o in options]


_CPUS = os.cpu_count() or 2

OPTIONS: tuple[Option, ...] = (
    Option("listen", str, "127.0.0.1:50051",
           "gRPC address: host:port (loopback by default; port 0 picks a free one) "
           "or unix:/path/to.sock."),
    Option("metrics_listen", str, "",
           "Serve Prometheus metrics over HTTP on this loopback host:port (off when empty)."),
    Option("state_dir", str, "",
           "Directory for the retrieval indexes (default: $STATE_DIRECTORY, else ./var)."),
    Option("llama_bin", str, "",
           "llama-server binary (default: beside the daemon's Python, then PATH).",
           reload="new_child"),
    Option("models_dir", str, "",
           "Directory of the prepared models (its manifest.json, written by `python -m "
           "models prepare`): an embedded role whose model is not set runs the manifest's "
           "default model for it (default: models/gguf in a source checkout once prepared, "
           f"else {INSTALLED_MODELS_DIR}).", reload="new_child"),
    Option("tls.cert_file", str, "",
           "PEM certificate chain the daemon presents; with tls.key_file, gRPC is served "
           "over TLS only. Re-read on SIGHUP.", reload="apply"),
    Option("tls.key_file", str, "",
           "PEM private key of tls.cert_file (unencrypted; must not be readable by others).",
           reload="apply"),
    Option("tls.client_ca_file", str, "",
           "PEM CA certificates for mutual TLS: clients must present a certificate signed "
           "by one of them.", reload="apply"),
    Option("auth.token_file", str, "",
           "Bearer tokens, one '<role> <token>' per line (roles: read, admin); when set, "
           "every RPC but health needs one. Must not be readable by others; re-read on "
           "SIGHUP.", reload="apply"),
    # Spin counts measured on 2 cores: see supervisor.LaunchSpec.spin_count.
    *_child_options("generation", enabled=True, threads=_CPUS, parallel=4, ctx=4096,
                    spin=300, ahead=0),
    *_child_options("embedding", enabled=True, threads=_CPUS, parallel=2, ctx=0, spin=3000,
                    ahead=2),
    Option("restart.backoff_base", float, 0.5, "First restart backoff ceiling, s.", minimum=0.001),
    Option("restart.backoff_cap", float, 30.0, "Largest restart backoff ceiling, s.",
           minimum=0.001),
    Option("restart.breaker_failures", int, 5,
           "Consecutive failed starts that open the circuit breaker.", minimum=1),
    Option("restart.breaker_reset", float, 60.0,
           "Seconds of stable running that reset the failure count.", minimum=0),
    Option("restart.breaker_cooldown", float, 300.0,
           "Seconds before an open breaker (transient causes) tries once more; 0 never.",
           minimum=0),
    Option("child.start_timeout", float, 60.0,
           "Seconds a child start may go without progress (output or 'loading').",
           minimum=0.1),
    Option("child.start_cap", float, 300.0, "Hard limit of a child start, s.", minimum=0.1),
    Option("child.probe_interval", float, 5.0, "Seconds between liveness probes.", minimum=0.05),
    Option("child.probe_timeout", float, 3.0, "Seconds a liveness probe may take.", minimum=0.05),
    Option("child.probe_failures", int, 3, "Failed probes in a row that mean hung.", minimum=1),
    Option("child.stop_grace", float, 10.0, "Seconds between SIGTERM and SIGKILL.", minimum=0),
    Option("child.busy_silence", float, 120.0,
           "While calls run, seconds without a byte from the child before probes count "
           "again (a busy child may not answer them).", minimum=1),
    Option("child.request_timeout", float, 600.0,
           "Longest silence from a child during a request, s.", minimum=1),
    Option("child.log_lines", int, 2000, "Output lines kept per child for TailLogs.", minimum=10),
    Option("swap.ready_timeout", float, 90.0,
           "Seconds a swapped-in child has to become ready before the swap fails.",
           minimum=1),
    Option("swap.drain_timeout", float, 30.0,
           "Seconds calls on the old child get to finish after a swap before it stops.",
           minimum=0),
    Option("swap.handover_hold", float, 5.0,
           "Seconds new calls may wait, after a swap switched, for the old child's calls "
           "to end before they start on the new child (two children computing at once on "
           "the same cores both slow down); 0: start them at once.",
           minimum=0),
    Option("swap.launch_nice", int, 10,
           "Nice value added to a swap's incoming child while it loads beside the serving "
           "one, taken back at the switch (needs LimitNICE=+0 or CAP_SYS_NICE; without, "
           "unused); 0: none.",
           minimum=0),
    Option("recycle.after_requests", int, 0,
           "Replace a child (make-before-break) after it served this many calls; 0: never.",
           minimum=0),
    Option("recycle.max_rss_mb", int, 0,
           "Replace a child whose resident memory exceeds this many MiB; 0: never.",
           minimum=0),
    Option("recycle.check_interval", float, 10.0, "Seconds between recycling checks.",
           minimum=0.1),
    Option("recycle.min_uptime", float, 60.0,
           "A child is recycled at most once per this many seconds of running.", minimum=0),
    # Retrieval's limits apply to the ingests, scans and searches that start after a
    # reload; the embedding batcher and the group commit keep theirs until a restart.
    Option("retrieval.enabled", bool, True, "Serve RetrievalService (ingest and search)."),
    Option("retrieval.allowed_roots", list, (),
           "Absolute directories that directory sources must lie under (symlinks and .. "
           "resolved); several are separated by ':' in a flag or env. Empty: directory "
           "sources are refused.", reload="apply"),
    Option("retrieval.chunk_size", int, 1200, "Target chunk size, characters.", minimum=200,
           reload="apply"),
    Option("retrieval.chunk_overlap", int, 200, "Overlap between chunks, characters.",
           minimum=0, reload="apply"),
    Option("retrieval.max_chunk_chars", int, 2000, "Hard cap of a chunk, characters.",
           minimum=200, reload="apply"),
    Option("retrieval.embed_batch", int, 32, "Texts per embedding request.", minimum=1),
    Option("retrieval.embed_concurrency", int, 2,
           "Embedding requests ingest keeps in flight (the embedding child's slots).",
           minimum=1),
    Option("retrieval.ingest_workers", int, 128,
           "Files of a directory scan in flight at once (their chunks share embedding "
           "requests of up to embed_batch texts, their writes share commits): enough "
           "small files that embedding requests fill up.",
           minimum=1, reload="apply"),
    Option("retrieval.ingest_inflight_mb", int, 64,
           "File bytes a directory scan has in flight at once, MiB (bounds its memory "
           "whatever ingest_workers is; one file larger than this goes alone).",
           minimum=1, reload="apply"),
    Option("retrieval.max_commit_batch", int, 256,
           "Most documents one group commit writes (concurrent ingests share commits).",
           minimum=1),
    Option("retrieval.query_embed_timeout", float, 5.0,
           "Seconds a search waits for its query's embedding before answering BM25-only.",
           minimum=0.1, reload="apply"),
    Option("retrieval.text_candidates", int, 25, "BM25 candidates fused per search.",
           minimum=1, reload="apply"),
    Option("retrieval.vector_candidates", int, 25, "HNSW candidates fused per search.",
           minimum=1, reload="apply"),
    Option("retrieval.rrf_k", int, 60, "Reciprocal Rank Fusion constant k.", minimum=1,
           reload="apply"),
    Option("retrieval.default_k", int, 5, "Hits returned when a search asks for none.",
           minimum=1, reload="apply"),
    Option("retrieval.max_k", int, 20, "Most hits a search may ask for.", minimum=1,
           reload="apply"),
    Option("retrieval.max_query_chars", int, 2000, "Longest search query, characters.",
           minimum=1, reload="apply"),
    Option("retrieval.max_document_chars", int, 5_000_000,
           "Longest document text (after extraction), characters.", minimum=1, reload="apply"),
    Option("retrieval.max_file_mb", int, 20, "Largest file a scan reads, MiB.", minimum=1,
           reload="apply"),
    Option("retrieval.max_files_per_source", int, 20000, "Files a scan indexes per source.",
           minimum=1, reload="apply"),
    Option("retrieval.max_source_mb", int, 2048, "Bytes a scan indexes per source, MiB.",
           minimum=1, reload="apply"),
    Option("retrieval.pdf_timeout", float, 30.0, "Seconds to extract one PDF.", minimum=1,
           reload="apply"),
    Option("retrieval.pdf_max_pages", int, 2000, "Most pages a PDF may have.", minimum=1,
           reload="apply"),
    Option("retrieval.pdf_max_memory_mb", int, 1024,
           "Address space of the process that parses a PDF, MiB (bounds decompression "
           "bombs).", minimum=64, reload="apply"),
    Option("retrieval.pdf_max_output_mb", int, 64,
           "Most text one PDF may yield, MiB.", minimum=1, reload="apply"),
    Option("retrieval.html_max_depth", int, 500,
           "Deepest nesting of HTML elements a page may have.", minimum=1, reload="apply"),
    Option("retrieval.rescan_interval", float, 3600.0,
           "Seconds between scheduled rescans of directory sources; 0: on demand only.",
           minimum=0),
    Option("retrieval.redact_hostnames", bool, False,
           "Also redact hostnames (FQDNs) at ingest.", reload="apply"),
    Option("retrieval.redact_ips", bool, False, "Also redact IP addresses at ingest.",
           reload="apply"),
    Option("retrieval.refuse_hard_links", bool, False,
           "Refuse files of directory sources that have more than one hard link (a hard "
           "link inside a root may be a file from outside it).", reload="apply"),
    # The Ask settings apply to the Asks that start after a reload; the response cache and
    # the audit log keep theirs until a restart.
    Option("answer.max_question_chars", int, 4000, "Longest Ask question, characters.",
           minimum=1, reload="apply"),
    Option("answer.max_attachment_chars", int, 100_000, "Longest Ask attachment, characters.",
           minimum=0, reload="apply"),
    Option("answer.max_history_turns", int, 10, "Most conversation turns an Ask may carry.",
           minimum=0, reload="apply"),
    Option("answer.default_max_tokens", int, 512, "Answer length when an Ask sets none.",
           minimum=1, reload="apply"),
    Option("answer.default_k", int, 5, "Sources retrieved when an Ask sets none.", minimum=1,
           reload="apply"),
    Option("answer.min_vector_score", float, 0.30,
           "Relevance floor: a source needs this cosine similarity (or a BM25 match).",
           minimum=-1, reload="apply"),
    Option("answer.min_text_score", float, 3.0,
           "Relevance floor for sources without a close vector match: this BM25 score.",
           minimum=0, reload="apply"),
    Option("answer.cache_ttl", float, 300.0,
           "Seconds an identical Ask is served from the response cache; 0: no cache.",
           minimum=0),
    Option("answer.cache_entries", int, 256, "Answers kept in the response cache.", minimum=0),
    Option("answer.audit_log", str, "",
           "Audit log file (JSON lines; default: <state_dir>/audit/answers.jsonl)."),
    Option("answer.audit_max_mb", int, 10, "Audit log size before rotation, MiB.", minimum=1),
    Option("answer.audit_backups", int, 5, "Rotated audit logs kept.", minimum=0),
    Option("drain_grace", float, 30.0,
           "On SIGTERM, seconds in-flight calls get to finish before they are cancelled.",
           minimum=0),
    Option("log.format", str, "auto", "Log format: auto (JSON unless a terminal), json, console.",
           choices=("auto", "json", "console")),
    Option("log.level", str, "info", "Log level.",
           choices=("debug", "info", "warning", "error")),
    Option("limits.max_prompt_chars", int, 262144, "Longest prompt or chat text, characters.",
           minimum=1, reload="apply"),
    Option("limits.max_messages", int, 256, "Most chat messages per call.", minimum=1,
           reload="apply"),
    Option("limits.default_max_tokens", int, 256, "max_tokens when a call sets none.", minimum=1,
           reload="apply"),
    Option("limits.max_tokens", int, 8192, "Largest max_tokens a call may ask.", minimum=1,
           reload="apply"),
    Option("limits.max_stop", int, 8, "Most stop strings per call.", minimum=0, reload="apply"),
    Option("limits.max_embed_batch", int, 256, "Most texts per Embed call.", minimum=1,
           reload="apply"),
    Option("limits.max_embed_chars", int, 32768, "Longest text to embed, characters.", minimum=1,
           reload="apply"),
    Option("limits.queue_size", int, 32,
           "Calls that may wait for a busy child's slot; past it: RESOURCE_EXHAUSTED.",
           minimum=0, reload="apply"),
    # A restart: the gRPC server's message limits are fixed when it starts.
    Option("limits.max_message_bytes", int, 16 * 1024 * 1024,
           "Largest gRPC message received or sent, bytes.", minimum=1024),
)

_BY_KEY = {o.key: o for o in OPTIONS}


def option(key: str) -> Option:
    """The declared option ``key`` (``section.name`` or ``name``), for messages that tell
    an operator how to set it.

    Raises:
        KeyError: no such option.
    """
    return _BY_KEY[key]


@dataclass(frozen=True)
class ChildConfig:
    role: str
    enabled: bool
    """False exactly when ``mode`` is "disabled"."""
    model: str
    runtime: str
    ctx_size: int
    threads: int
    parallel: int
    batch: int
    extra_args: tuple[str, ...]
    mode: str = "embedded"
    spin_count: int = -1
    queue_ahead: int = 0
    endpoint_url: str = ""
    endpoint_model: str = ""
    api_key_file: str = ""
    api_key_env: str = ""

    def endpoint(self) -> EndpointSpec | None:
        """The configured endpoint (None when no URL is configured)."""
        if not self.endpoint_url:
            return None
        return EndpointSpec(self.endpoint_url, self.endpoint_model, self.api_key_file,
                            self.api_key_env)


@dataclass(frozen=True)
class Limits:
    max_prompt_chars: int
    max_messages: int
    default_max_tokens: int
    max_tokens: int
    max_stop: int
    max_embed_batch: int
    max_embed_chars: int
    queue_size: int
    max_message_bytes: int


@dataclass(frozen=True)
class RetrievalSettings:
    """The ``[retrieval]`` options, one field each (see :data:`OPTIONS` for their help)."""

    enabled: bool
    allowed_roots: tuple[str, ...]
    chunk_size: int
    chunk_overlap: int
    max_chunk_chars: int
    embed_batch: int
    embed_concurrency: int
    ingest_workers: int
    ingest_inflight_mb: int
    max_commit_batch: int
    query_embed_timeout: float
    text_candidates: int
    vector_candidates: int
    rrf_k: int
    default_k: int
    max_k: int
    max_query_chars: int
    max_document_chars: int
    max_file_mb: int
    max_files_per_source: int
    max_source_mb: int
    pdf_timeout: float
    pdf_max_pages: int
    pdf_max_memory_mb: int
    pdf_max_output_mb: int
    html_max_depth: int
    rescan_interval: float
    redact_hostnames: bool
    redact_ips: bool
    refuse_hard_links: bool


@dataclass(frozen=True)
class AnswerConfig:
    """The ``[answer]`` options, one field each (see :data:`OPTIONS` for their help)."""

    max_question_chars: int
    max_attachment_chars: int
    max_history_turns: int
    default_max_tokens: int
    default_k: int
    min_vector_score: float
    min_text_score: float
    cache_ttl: float
    cache_entries: int
    audit_log: str
    audit_max_mb: int
    audit_backups: int


_S = TypeVar("_S")


def _section(cls: Callable[..., _S], values: Mapping[str, Any], name: str) -> _S:
    """The options of section ``name`` as ``cls``, whose fields are named as the options
    (a field missing or left over fails at every load, hence in the unit tests)."""
    prefix = name + "."
    return cls(**{k.removeprefix(prefix): v for k, v in values.items()
                  if k.startswith(prefix)})


@dataclass(frozen=True)
class Config:
    """The validated configuration of one daemon run."""

    listen: str
    metrics_listen: str
    llama_bin: str
    state_dir: Path
    retrieval: RetrievalSettings
    answer: AnswerConfig
    generation: ChildConfig
    embedding: ChildConfig
    policy: RestartPolicy
    timeouts: Timeouts
    request_timeout: float
    swap_ready_timeout: float
    swap_drain_timeout: float
    swap_handover_hold: float
    swap_launch_nice: int
    recycle_after_requests: int
    recycle_max_rss_mb: int
    recycle_check_interval: float
    recycle_min_uptime: float
    log_lines: int
    drain_grace: float
    log_format: str
    log_level: str
    limits: Limits
    sources: Mapping[str, str]
    """Where each value came from: "flag", "env", "file" or "default"; a role's model
    taken from the manifest of ``models_dir`` is "models_dir"."""
    models_dir: Path = Path(INSTALLED_MODELS_DIR)
    tls: TlsMaterial | None = None
    """Certificate, key and client CA, read and checked at load (None: plaintext)."""
    tokens: TokenTable | None = None
    """The bearer tokens of ``auth.token_file`` (None: no token needed)."""
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Each option's value by key, as read (a reload compares them, option by option)."""

    def child(self, role: str) -> ChildConfig:
        return self.generation if role == "generation" else self.embedding


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option as a flag (with its env variable and default in the help)."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration file (env LLAMAD_CONFIG).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in OPTIONS:
        section = opt.key.split(".")[0] if "." in opt.key else "daemon"
        group = groups.setdefault(section, parser.add_argument_group(section))
        default = "" if opt.default in ("", ()) else f" Default: {opt.default}."
        text = f"{opt.help}{default} Env: {opt.env}."
        if opt.kind is bool:
            group.add_argument(opt.flag, dest=opt.dest, default=None,
                               action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(opt.flag, dest=opt.dest, default=None, help=text,
                               metavar=opt.key.split(".")[-1].upper(),
                               choices=opt.choices or None)


def _coerce(opt: Option, raw: Any, source: str) -> Any:
    where = f"{opt.key} (from {source})"
    try:
        if opt.kind is bool:
            if isinstance(raw, bool):
                value: Any = raw
            elif str(raw).strip().lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).strip().lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(f"not a boolean: {raw!r}")
        elif opt.kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(f"not an integer: {raw!r}")
            value = int(raw)
        elif opt.kind is list:
            # TOML: an array of strings; flag and env: separated by ':' (like PATH).
            if isinstance(raw, str):
                items = raw.split(os.pathsep)
            elif isinstance(raw, list) and all(isinstance(i, str) for i in raw):
                items = raw
            else:
                raise ValueError(f"not a list of strings: {raw!r}")
            value = tuple(i.strip() for i in items if i.strip())
        elif opt.kind is float:
            if isinstance(raw, bool):
                raise ValueError(f"not a number: {raw!r}")
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(f"not a finite number: {raw!r}")
        else:
            if not isinstance(raw, str):
                raise ValueError(f"not a string: {raw!r}")
            value = raw
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if opt.choices and value not in opt.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(opt.choices)}")
    if opt.minimum is not None and value < opt.minimum:
        raise ConfigError(f"{where}: {value} is below the minimum {opt.minimum:g}")
    return value


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out


def load(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    file: str | os.PathLike[str] | None = None,
) -> Config:
    """Build the configuration from flags, environment and file.

    Raises:
        ConfigError: an unknown file key, a bad value, or an inconsistent combination.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {o.key: o.default for o in OPTIONS}
    sources: dict[str, str] = {o.key: "default" for o in OPTIONS}

    path = file or (getattr(args, "config", None) if args else None) or env.get("LLAMAD_CONFIG")
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        for key, raw in _flatten(data).items():
            if key not in _BY_KEY:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(_BY_KEY[key], raw, f"file {path}")
            sources[key] = "file"
    for opt in OPTIONS:
        if opt.env in env:
            values[opt.key] = _coerce(opt, env[opt.env], f"env {opt.env}")
            sources[opt.key] = "env"
    if args is not None:
        for opt in OPTIONS:
            raw = getattr(args, opt.dest, None)
            if raw is not None:
                values[opt.key] = _coerce(opt, raw, f"flag {opt.flag}")
                sources[opt.key] = "flag"
    return _build(values, sources, env)


def _mode(values: Mapping[str, Any], sources: Mapping[str, str], role: str) -> str:
    """The role's mode; ``enabled = false`` is the older spelling of "disabled"."""
    mode = str(values[f"{role}.mode"])
    if not values[f"{role}.enabled"]:
        if sources[f"{role}.mode"] != "default" and mode != "disabled":
            raise ConfigError(f"{role}.enabled = false conflicts with {role}.mode = {mode}: "
                              f"set only {role}.mode")
        return "disabled"
    return mode


def _check_endpoint(values: Mapping[str, Any], env: Mapping[str, str], role: str,
                    mode: str) -> None:
    url, key_file, key_env = (values[f"{role}.endpoint_url"], values[f"{role}.api_key_file"],
                              values[f"{role}.api_key_env"])
    if key_file and key_env:
        raise ConfigError(f"{role}.api_key_file and {role}.api_key_env: set one, not both")
    if key_env and not _ENV_NAME.fullmatch(key_env):
        raise ConfigError(f"{role}.api_key_env: {key_env!r} is not an environment variable name "
                          "(give the variable's name, never the key itself)")
    if url:
        try:
            normalise_url(url)
        except ValueError as exc:
            raise ConfigError(f"{role}.endpoint_url: {exc}") from None
    if mode != "endpoint":
        return
    if not url:
        opt = _BY_KEY[f"{role}.endpoint_url"]
        raise ConfigError(f"{role}.endpoint_url: endpoint mode needs a URL (set {opt.flag} or "
                          f"{opt.env})")
    if key_file or key_env:
        try:
            read_api_key(key_file, key_env, env)
        except EndpointError as exc:
            name = "api_key_file" if key_file else "api_key_env"
            raise ConfigError(f"{role}.{name}: {exc}") from None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _child(values: Mapping[str, Any], sources: Mapping[str, str], env: Mapping[str, str],
           role: str) -> ChildConfig:
    mode = _mode(values, sources, role)
    _check_endpoint(values, env, role, mode)
    return ChildConfig(
        role=role,
        enabled=mode != "disabled",
        mode=mode,
        endpoint_url=values[f"{role}.endpoint_url"],
        endpoint_model=values[f"{role}.endpoint_model"],
        api_key_file=values[f"{role}.api_key_file"],
        api_key_env=values[f"{role}.api_key_env"],
        model=values[f"{role}.model"],
        runtime=values[f"{role}.runtime"],
        ctx_size=values[f"{role}.ctx_size"],
        threads=values[f"{role}.threads"],
        parallel=values[f"{role}.parallel"],
        batch=values[f"{role}.batch"],
        extra_args=tuple(str(values[f"{role}.extra_args"]).split()),
        spin_count=values[f"{role}.spin_count"],
        queue_ahead=values[f"{role}.queue_ahead"],
    )


def _build(
    values: Mapping[str, Any], sources: Mapping[str, str], env: Mapping[str, str]
) -> Config:
    origins = dict(sources)
    models_dir = Path(values["models_dir"]).expanduser().absolute() if values["models_dir"] \
        else default_models_dir()
    children = {role: _child(values, sources, env, role) for role in ("generation", "embedding")}
    prepared: Manifest | None = None
    for role, child in children.items():
        if child.mode == "embedded" and not child.model:
            if prepared is None:
                prepared = _prepared(models_dir, role)
            model = _default_model(prepared, models_dir, role)
            children[role] = dataclasses.replace(child, model=str(model))
            origins[f"{role}.model"] = "models_dir"
    if values["restart.backoff_cap"] < values["restart.backoff_base"]:
        raise ConfigError("restart.backoff_cap must be >= restart.backoff_base")
    if values["child.start_cap"] < values["child.start_timeout"]:
        raise ConfigError("child.start_cap must be >= child.start_timeout")
    if values["limits.default_max_tokens"] > values["limits.max_tokens"]:
        raise ConfigError("limits.default_max_tokens must be <= limits.max_tokens")
    tls = _tls(values)
    tokens = _tokens(values)
    listen = values["listen"]
    check_listen(listen, tls=tls is not None,
                 authenticated=tokens is not None or (tls is not None
                                                      and tls.require_client_cert))
    for root in values["retrieval.allowed_roots"]:
        if not os.path.isabs(root):
            raise ConfigError(f"retrieval.allowed_roots: {root!r} is not an absolute path")
    metrics_listen = values["metrics_listen"]
    if metrics_listen:
        if metrics_listen.startswith("unix:"):
            raise ConfigError("metrics_listen: must be a loopback host:port, not a unix socket")
        try:
            check_listen(metrics_listen)
        except ConfigError as exc:
            raise ConfigError(f"metrics_{exc}") from None
    cooldown = values["restart.breaker_cooldown"]
    state_dir = Path(values["state_dir"] or env.get("STATE_DIRECTORY", "").split(":")[0]
                     or "var")
    socket = unix_socket_path(listen, state_dir)
    if socket is not None and len(os.fsencode(socket.absolute())) > _MAX_SOCKET_PATH:
        raise ConfigError(f"listen: the unix socket path {socket.absolute()} is longer than "
                          f"{_MAX_SOCKET_PATH} bytes")
    return Config(
        tls=tls,
        tokens=tokens,
        listen=listen,
        metrics_listen=metrics_listen,
        llama_bin=values["llama_bin"],
        state_dir=state_dir,
        retrieval=_section(RetrievalSettings, values, "retrieval"),
        answer=_section(AnswerConfig, values, "answer"),
        generation=children["generation"],
        embedding=children["embedding"],
        policy=RestartPolicy(
            base=values["restart.backoff_base"],
            cap=values["restart.backoff_cap"],
            max_failures=values["restart.breaker_failures"],
            stable_after=values["restart.breaker_reset"],
            cooldown=cooldown or None,
        ),
        timeouts=Timeouts(
            start=values["child.start_timeout"],
            start_cap=values["child.start_cap"],
            probe_interval=values["child.probe_interval"],
            probe_timeout=values["child.probe_timeout"],
            probe_failures=values["child.probe_failures"],
            stop_grace=values["child.stop_grace"],
            busy_silence=values["child.busy_silence"],
        ),
        request_timeout=values["child.request_timeout"],
        swap_ready_timeout=values["swap.ready_timeout"],
        swap_drain_timeout=values["swap.drain_timeout"],
        swap_handover_hold=values["swap.handover_hold"],
        swap_launch_nice=values["swap.launch_nice"],
        recycle_after_requests=values["recycle.after_requests"],
        recycle_max_rss_mb=values["recycle.max_rss_mb"],
        recycle_check_interval=values["recycle.check_interval"],
        recycle_min_uptime=values["recycle.min_uptime"],
        log_lines=values["child.log_lines"],
        drain_grace=values["drain_grace"],
        log_format=values["log.format"],
        log_level=values["log.level"],
        limits=_section(Limits, values, "limits"),
        sources=origins,
        models_dir=models_dir,
        values=dict(values),
    )


def default_models_dir() -> Path:
    """``models/gguf`` of a source checkout (beside the ``models`` package) once
    ``python -m models prepare`` wrote its manifest there, else the installed location."""
    checkout = Path(models.__file__).resolve().parent / "gguf"
    if (checkout / MANIFEST_NAME).is_file():
        return checkout
    return Path(INSTALLED_MODELS_DIR)


def _no_model(role: str, models_dir: Path, why: str) -> ConfigError:
    opt, where = _BY_KEY[f"{role}.model"], _BY_KEY["models_dir"]
    return ConfigError(
        f"{role}.model: no model configured (set {opt.flag} or {opt.env}), and {why}: run "
        f"`python -m models prepare --dest {models_dir}`, or point models_dir ({where.flag} "
        f"or {where.env}) at prepared models; or use an endpoint with --{role}-mode "
        f"endpoint, or disable the child with --no-{role}-enabled")


def _prepared(models_dir: Path, role: str) -> Manifest:
    """The manifest of ``models_dir``."""
    if not (models_dir / MANIFEST_NAME).is_file():
        raise _no_model(role, models_dir, f"models_dir {models_dir} has no prepared models "
                                          f"(no {MANIFEST_NAME})")
    try:
        return Manifest.load(models_dir)
    except ManifestError as exc:
        raise _no_model(role, models_dir, f"the models_dir manifest is unusable: {exc}") \
            from None


def _default_model(manifest: Manifest, models_dir: Path, role: str) -> Path:
    """The file the manifest marks as the default model of ``role``, which must exist."""
    names = sorted(e.file for e in manifest.entries.values() if e.role == role and e.default)
    if not names:
        raise _no_model(role, models_dir,
                        f"the manifest in {models_dir} names no default {role} model")
    path = models_dir / names[0]
    if not path.is_file():
        raise _no_model(role, models_dir,
                        f"{path}, the prepared default {role} model, is missing")
    return path


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _is_loopback_ip(host: str) -> bool:
    # An IP literal only: a DNS name such as "127.example.com" may resolve anywhere.
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def is_loopback(listen: str) -> bool:
    """True for a unix socket or a loopback ``host:port``."""
    if listen.startswith("unix:"):
        return True
    host = listen.rpartition(":")[0]
    return host in _LOOPBACK_HOSTS or _is_loopback_ip(host)


def check_listen(listen: str, *, tls: bool = False, authenticated: bool = False) -> None:
    """Accept a unix socket or a loopback ``host:port``; beyond loopback, only with TLS and
    client authentication (bearer tokens or mutual TLS).

    Raises:
        ConfigError: malformed, or non-loopback without TLS or without authentication.
    """
    if listen.startswith("unix:"):
        if not listen.split(":", 1)[1].lstrip("/"):
            raise ConfigError("listen: unix socket path is empty")
        return
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen: {listen!r} is not host:port or unix:/path")
    if is_loopback(listen):
        return
    if not tls:
        raise ConfigError(
            f"listen: {host or '(all interfaces)'} is not a loopback address; listening "
            "beyond loopback requires TLS (set tls.cert_file and tls.key_file) and client "
            "authentication (auth.token_file or tls.client_ca_file)")
    if not authenticated:
        raise ConfigError(
            f"listen: {host or '(all interfaces)'} is not a loopback address; listening "
            "beyond loopback requires client authentication too: set auth.token_file "
            "(bearer tokens) or tls.client_ca_file (mutual TLS)")


_MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path holds 108 bytes, NUL included


def unix_socket_path(listen: str, state_dir: Path) -> Path | None:
    """The socket file of a ``unix:`` listen address (None for host:port).

    ``unix:/abs/path`` and ``unix:///abs/path`` are absolute; ``unix:name.sock`` is
    relative to the state directory.
    """
    if not listen.startswith("unix:"):
        return None
    rest = listen.removeprefix("unix:")
    if rest.startswith("//"):
        rest = rest[2:]
    path = Path(rest)
    return path if path.is_absolute() else state_dir / path


def _tls(values: Mapping[str, Any]) -> TlsMaterial | None:
    cert, key, ca = (values["tls.cert_file"], values["tls.key_file"],
                     values["tls.client_ca_file"])
    if not cert and not key:
        if ca:
            raise ConfigError("tls.client_ca_file: mutual TLS needs tls.cert_file and "
                              "tls.key_file too")
        return None
    if not cert or not key:
        missing = "tls.key_file" if cert else "tls.cert_file"
        raise ConfigError(f"{missing}: TLS needs both tls.cert_file and tls.key_file")
    try:
        return load_tls(cert, key, ca)
    except AccessError as exc:
        raise ConfigError(f"tls: {exc}") from None


def _tokens(values: Mapping[str, Any]) -> TokenTable | None:
    path = values["auth.token_file"]
    if not path:
        return None
    try:
        return load_tokens(path)
    except AccessError as exc:
        raise ConfigError(f"auth.token_file: {exc}") from None
