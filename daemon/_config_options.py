"""The option registry: what an option is (:class:`Option`), how a raw value becomes its
typed value, and the table of every option (:data:`OPTIONS`)."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal


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

