"""Every option, declared once: a field of a frozen section dataclass (``[retrieval]`` is
:class:`RetrievalSettings`), with its default and its metadata (:func:`setting`). The root,
:class:`Settings`, holds the top-level options and the sections in the order ``--help``
lists them; :data:`OPTIONS` is read off it.

A section's ``RELOAD`` is what a reload does with a change of its options but for those
that say otherwise (see :mod:`daemon.ops.reload`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar

from supervisor import DEFAULT_CACHE_RAM_MIB, KNOWN_TEMPLATES

from ._connections import ConnectionSettings
from ._console import ConsoleSettings
from ._options import (
    INSTALLED_MODELS_DIR,
    PER_SECTION,
    Option,
    Reload,
    options_of,
    setting,
)
from ._retrieval import RetrievalSettings
from ._sampling import sampling
from ._supervision import ChildSettings, RecycleSettings, RestartSettings, SwapSettings
from .inference_mode import InferenceMode

# The chat templates a model may be given: "auto" (its own, else one known for it).
_TEMPLATES = ("auto", *KNOWN_TEMPLATES)


@dataclass(frozen=True, kw_only=True)
class RoleSettings:
    """``[generation]`` and ``[embedding]``: the child serving a role, or its endpoint."""

    # A role's settings go through the swap or mode-switch path, but for its queue ahead.
    RELOAD: ClassVar[Reload] = "new_child"

    enabled: bool = setting(True, help="Serve {section} (false is {section}.mode = disabled).")
    # An enum member is immutable (ruff cannot tell from the annotation).
    mode: InferenceMode = setting(InferenceMode.EMBEDDED, help="""
        Where {section} runs: embedded (a supervised llama.cpp child), endpoint (an external
        OpenAI-compatible server), or disabled.""")  # noqa: RUF009
    model: str = setting("", help="Path of the {section} GGUF model (embedded mode).")
    endpoint_url: str = setting("", help="""
        Endpoint mode: the server's base URL, with or without /v1 (e.g.
        http://10.0.0.5:8080/v1).""")
    endpoint_model: str = setting("", help="""
        Endpoint mode: the model id to use (default: the only one it offers).""")
    api_key_file: str = setting("", help="""
        Endpoint mode: file holding the API key (a regular file owned by the daemon's user or
        root, not readable or writable by group or others).""")
    api_key_env: str = setting("", help="""
        Endpoint mode: name of the environment variable holding the API key.""")
    runtime: str = setting("auto", choices=("auto", "llama-server", "bundled"), help="""
        Runtime: llama-server, bundled (python -m llama_cpp.server), or auto (llama-server when
        found).""")
    ctx_size: int = setting(PER_SECTION, minimum=0, help="""
        Context tokens per slot (0: the model's training context).""")
    threads: int = setting(os.cpu_count() or 2, minimum=1, help="""
        CPU threads for the child (default: every core). Left at its default, the generation
        models that stay resident together (pinned or preloaded, at most [models] max_resident)
        divide the cores among them, and so does every generation model without a threads
        setting of its own: two children on the same cores wait on each other's threads. For
        the same reason an embedding model with a background instance (lanes on) gets half the
        cores, its instance the other half.""")
    parallel: int = setting(PER_SECTION, minimum=1, help="""
        Concurrent request slots (llama-server; the bundled runtime serves one; calls llamad
        sends an endpoint at once).""")
    queue_ahead: int = setting(PER_SECTION, minimum=0, reload="apply", help="""
        Calls sent to a llama-server child beyond its slots, to wait in its own queue: a slot
        that finishes starts the next one at once instead of idling for the round trip to llamad
        and back (short calls such as embeddings); 0 sends exactly as many calls as there are
        slots.""")
    batch: int = setting(512, minimum=1, help="Logical batch size in tokens.")
    cache_ram: int = setting(DEFAULT_CACHE_RAM_MIB, minimum=0, help="""
        Host RAM a llama-server child may keep for its prompt cache, MiB (its --cache-ram;
        llama-server's own default is 8192 per child), counted in the model's memory estimate; 0
        disables the cache.""")
    spin_count: int = setting(PER_SECTION, minimum=-1, help="""
        GOMP_SPINCOUNT of the child: how long llama.cpp's OpenMP threads spin at a barrier
        before they sleep. Short spins let the two children, a swap's overlap or other load
        share the cores instead of starving each other; -1 keeps the daemon's environment
        (OpenMP's default spins long), which is the default when [models] max_resident = 1 (one
        child at a time).""")
    extra_args: str = setting("", help="""
        Extra runtime arguments, space separated, appended to the child's command line. Refused
        at load: what llamad sets itself (address, port, key, model, alias, threads, context,
        batch, slots, embedding), what reaches the host (TLS, log and slot files, static files
        and the web UI, tools and MCP, RPC, downloads), options unknown to llama-server and
        llama_cpp.server, and file options outside models_dir. Swap's extra_args take
        performance and model-behaviour options only.""")
    background_instance: str = setting("auto", choices=("auto", "true", "false"),
                                       reload="restart", help="""
        Serve the batch and background lanes from a second child of the same model, started
        at a lower CPU priority (limits.background_instance_nice) on the first such call and
        stopped once they were idle for the model's ttl (else limits.background_instance_ttl),
        its memory counted by the pool's budget: the interactive lane's child then decodes
        alone and the kernel gives it the cores first. auto: on for embedding models, off for
        generation models (it doubles their memory).""")
    chat_template: str = setting("auto", choices=_TEMPLATES, help="""
        Chat template of a generation model: auto (the GGUF's own, else one llamad knows for
        it), or one of llamad's: chatml, chatml-tools (ChatML that renders tools, for tool
        calling), gemma.""")

    def __post_init__(self) -> None:
        # The option is read as a string (one of the choices, checked): its member, so
        # ``is`` comparisons hold.
        object.__setattr__(self, "mode", InferenceMode(self.mode))


@dataclass(frozen=True)
class TlsSettings:
    """``[tls]``: the files are re-read on a reload (see :mod:`daemon.ops.reload`)."""

    RELOAD: ClassVar[Reload] = "apply"

    cert_file: str = setting("", help="""
        PEM certificate chain the daemon presents; with tls.key_file, gRPC is served over TLS
        only. Re-read on SIGHUP.""")
    key_file: str = setting("", help="""
        PEM private key of tls.cert_file (unencrypted; must not be readable by others).""")
    client_ca_file: str = setting("", help="""
        PEM CA certificates for mutual TLS: clients must present a certificate signed by one of
        them.""")


@dataclass(frozen=True)
class AuthSettings:
    """``[auth]``."""

    token_file: str = setting("", reload="apply", help="""
        Bearer tokens, one '<role> <token>' per line (roles: read, admin), each optionally
        followed by class=NAME lane=interactive|batch rpm=N tpm=N (its quotas per
        auth.quota_window); when set, every RPC but health needs one. Must not be readable by
        others; re-read on SIGHUP.""")
    quota_mode: str = setting(
        "enforce", choices=("enforce", "shadow", "off"), reload="apply", help="""
        What the tokens' rpm and tpm do: enforce (a call past them is refused,
        RESOURCE_EXHAUSTED / HTTP 429 with a retry hint), shadow (never refused; counted and
        logged as it would have been), off.""")
    quota_window: float = setting(60.0, minimum=1.0, reload="apply", help="""
        Seconds of the sliding window the tokens' rpm and tpm count in (a token's rpm is its
        calls per this window).""")


@dataclass(frozen=True)
class EndpointKeySettings:
    """``[endpoint_keys]``: where an endpoint's API key may come from when SetMode names it
    (the configuration's own ``api_key_file`` and ``api_key_env`` may always be used)."""

    RELOAD: ClassVar[Reload] = "apply"

    dir: str = setting("", help="""
        Directory of the key files SetMode may name as an endpoint's api_key_file (a file inside
        it, symbolic links resolved; each must be a regular file owned by the daemon's user or
        root and not readable or writable by group or others). Empty: SetMode may name only the
        key files the configuration names.""")
    env_prefix: str = setting("LLAMAD_ENDPOINT_KEY_", help="""
        Prefix of the daemon's environment variables SetMode may name as an endpoint's
        api_key_env (besides those the configuration names). Empty: only those. It may not begin
        any of llamad's own option variables.""")


@dataclass(frozen=True)
class AnswerConfig:
    """``[answer]``: the Ask settings apply to the Asks that start after a reload; the
    response cache and the audit log keep theirs until a restart."""

    RELOAD: ClassVar[Reload] = "apply"

    max_question_chars: int = setting(4000, minimum=1, help="Longest Ask question, characters.")
    max_attachment_chars: int = setting(100_000, minimum=0, help="""
        Longest Ask attachment, characters.""")
    max_history_turns: int = setting(10, minimum=0, help="""
        Most conversation turns an Ask may carry.""")
    default_max_tokens: int = setting(512, minimum=1, help="Answer length when an Ask sets none.")
    default_k: int = setting(5, minimum=1, help="Sources retrieved when an Ask sets none.")
    min_vector_score: float = setting(0.30, minimum=-1, help="""
        Relevance floor: a source needs this cosine similarity (or a BM25 match).""")
    min_text_score: float = setting(3.0, minimum=0, help="""
        Relevance floor for sources without a close vector match: this BM25 score.""")
    cache_ttl: float = setting(300.0, minimum=0, reload="restart", help="""
        Seconds an identical Ask is served from the response cache; 0: no cache.""")
    cache_entries: int = setting(256, minimum=0, reload="restart", help="""
        Answers kept in the response cache.""")
    templates_dir: str = setting("", help="""
        Directory of operator answer templates (system.txt, answer.txt, no_context.txt, ...)
        replacing the packaged ones of the same name; checked at load and on reload
        (docs/answers.md). Empty: the packaged templates.""")
    audit_log: str = setting("", reload="restart", help="""
        Audit log file (JSON lines; default: <state_dir>/audit/answers.jsonl).""")
    audit_max_mb: int = setting(10, minimum=1, reload="restart", help="""
        Audit log size before rotation, MiB.""")
    audit_backups: int = setting(5, minimum=0, reload="restart", help="Rotated audit logs kept.")
    # Ask's sampling when a request leaves it unset (see daemon.config._sampling).
    temperature: float = sampling("Ask", "temperature")
    top_p: float = sampling("Ask", "top_p")
    min_p: float = sampling("Ask", "min_p")
    repeat_penalty: float = sampling("Ask", "repeat_penalty")
    dry_multiplier: float = sampling("Ask", "dry_multiplier")
    frequency_penalty: float = sampling("Ask", "frequency_penalty")


@dataclass(frozen=True)
class LogSettings:
    """``[log]``."""

    format: str = setting("auto", choices=("auto", "json", "console"), help="""
        Log format: auto (JSON unless a terminal), json, console.""")
    level: str = setting("info", choices=("debug", "info", "warning", "error"), help="Log level.")
    rate_limit: int = setting(20, minimum=0, help="""
        Identical warning and error lines (same logger, level, event and exception type) written
        per rate_interval; past it they are counted, and one 'log lines suppressed' line says
        how many (the first ones are always written; the calls' own summary lines, a child's
        output and access denials, which have limits of their own, are not limited here). 0: no
        limit.""")
    rate_interval: float = setting(10.0, minimum=0.1, help="""
        Seconds of the log rate limit's window.""")


@dataclass(frozen=True)
class HttpSettings:
    """``[http]``: the limits of the OpenAI-compatible HTTP listener (``http_listen``),
    fixed when it starts."""

    max_body_bytes: int = setting(8 * 1024 * 1024, minimum=1024, help="""
        Largest HTTP request body, bytes; past it: 413.""")
    max_header_bytes: int = setting(8190, minimum=256, help="""
        Longest HTTP request line or header field, bytes; past it: 400 (431 for a field).""")
    max_headers: int = setting(64, minimum=8, help="Most HTTP request headers; past it: 400.")
    idle_timeout: float = setting(15.0, minimum=0.5, help="""
        Seconds an HTTP connection may go without a complete request head (idle between
        requests, or sending its head slowly) before it is closed.""")
    body_timeout: float = setting(30.0, minimum=0.5, help="""
        Seconds an HTTP client has to send its request body; past it: 408.""")
    responses_stored: int = setting(100, minimum=0, help="""
        Responses of POST /v1/responses kept in memory to be continued by
        previous_response_id (each at most one request's text, limits.max_prompt_chars, and
        its output), the oldest dropped first; 0: none kept (store is answered false and
        previous_response_id is refused).""")
    responses_ttl: float = setting(3600.0, minimum=1.0, help="""
        Seconds a stored response can be continued.""")


@dataclass(frozen=True)
class AgentSettings:
    """``[agent]``: the limits of the HAProxy agent-check listener (``agent_listen``),
    fixed when it starts."""

    max_connections: int = setting(16, minimum=1, help="""
        Agent-check connections answered at once; more are closed unanswered (HAProxy takes that
        as no news, not as a failure).""")
    timeout: float = setting(2.0, minimum=0.1, help="""
        Seconds an agent-check connection has to take its one-line reply before it is
        closed.""")


@dataclass(frozen=True)
class PoolSettings:
    """``[models]``: the model pool's residency policy (the ``[models.NAME]`` tables under
    it are the catalog's models: :mod:`daemon.config._catalog_load`)."""

    max_resident: int = setting(0, minimum=0, help="""
        Most models resident at once, the roles' default models included; a model that would
        exceed it unloads the least recently used idle model that is not pinned first (a role's
        default is pinned unless its table says pin = false; 0: no limit).""")
    memory_budget_mb: int = setting(0, minimum=0, help="""
        Memory the resident models may hold together, MiB, each estimated from its GGUF metadata
        (weights, KV cache for ctx_size x slots, runtime overhead); a model that would exceed it
        unloads others as for max_resident (0: only what the system has available when a model
        loads).""")
    device_budgets_mb: str = setting("", help="""
        Memory budgets of the devices models are placed on ([models.NAME] device, e.g. a GPU the
        model is offloaded to with -ngl), as NAME=MiB pairs separated by commas
        (cuda0=7500,cuda1=7500): a model on a device counts against that device's budget instead
        of memory_budget_mb (a device not named here has no budget).""")
    ttl_check_interval: float = setting(5.0, minimum=0.1, help="""
        Seconds between looks for models idle longer than their ttl.""")
    on_demand: bool = setting(True, help="""
        A call naming a model that is not resident loads it (and may evict others); false: only
        LoadModel (admin) or preload loads a model, and such a call is refused
        (FAILED_PRECONDITION) unless it is a role's default.""")
    turn: float = setting(10.0, minimum=0, help="""
        Seconds a busy model that must make room for another keeps taking new calls while it has
        work, before it stops taking them, serves its queue and unloads (fewer switches, each
        serving a larger batch; the waiting model's calls wait up to this much longer; 0: it
        stops taking them at once).""")


@dataclass(frozen=True)
class Limits:
    """``[limits]``: the request limits, in force for the calls after a reload but for the
    gRPC server's message limits, fixed when it starts."""

    RELOAD: ClassVar[Reload] = "apply"

    max_prompt_chars: int = setting(262144, minimum=1, help="""
        Longest prompt or chat text, characters.""")
    max_messages: int = setting(256, minimum=1, help="Most chat messages per call.")
    max_tools: int = setting(128, minimum=1, help="""
        Most tools a chat call may offer, and tool calls one message may hold.""")
    default_max_tokens: int = setting(256, minimum=1, help="max_tokens when a call sets none.")
    max_tokens: int = setting(8192, minimum=1, help="Largest max_tokens a call may ask.")
    max_stop: int = setting(8, minimum=0, help="Most stop strings per call.")
    max_grammar_chars: int = setting(65536, minimum=1, help="""
        Longest GBNF grammar or JSON schema a call may constrain its output with,
        characters.""")
    max_grammar_rules: int = setting(1024, minimum=1, help="""
        Most rules a GBNF grammar (or a JSON schema's pattern) may expand to, as llama.cpp
        builds them (groups and repetitions count as rules).""")
    max_grammar_depth: int = setting(32, minimum=1, help="""
        Deepest nesting of groups in a GBNF grammar.""")
    max_grammar_repetition: int = setting(1000, minimum=1, help="""
        Largest count in a grammar's {m,n} and a JSON schema's minLength, minItems or
        minProperties.""")
    max_grammar_walks: int = setting(20000, minimum=1, help="""
        Most walks through its parse stacks a GBNF grammar (or a JSON schema's pattern) may cost
        the child for one 12-character token: an upper bound computed before the call. Grammars
        that can match the same text in several ways multiply it: a JSON grammar costs ~200,
        ([a-z]+ [a-z]+)+ 4095 (0.2 s per token on a 128k vocabulary), x+ over y+ over [a-z]+
        265720 (10 s per token).""")
    max_schema_depth: int = setting(64, minimum=1, help="""
        Deepest nesting (objects and arrays) of a JSON schema a call constrains its output or a
        tool's parameters with.""")
    max_logit_bias: int = setting(1024, minimum=0, help="Most logit_bias entries per call.")
    max_top_logprobs: int = setting(20, minimum=0, help="""
        Most alternatives per token a call may ask logprobs for (OpenAI's limit is 20).""")
    max_embed_batch: int = setting(256, minimum=1, help="Most texts per Embed call.")
    max_embed_chars: int = setting(32768, minimum=1, help="Longest text to embed, characters.")
    queue_size: int = setting(32, minimum=0, help="""
        Interactive calls that may wait for a busy child's slot; past it:
        RESOURCE_EXHAUSTED.""")
    lanes: bool = setting(True, help="""
        Lanes per model: interactive calls first, then batch (a client's x-llamad-lane: batch),
        then background (the retriever's embeddings); false: one FIFO for all.""")
    batch_queue_size: int = setting(64, minimum=0, help="""
        Batch calls that may wait for a child's slot; past it: RESOURCE_EXHAUSTED.""")
    background_queue_size: int = setting(256, minimum=0, help="""
        Background calls (ingest, backfill, Reprocess embeddings) that may wait for a child's
        slot; past it: RESOURCE_EXHAUSTED.""")
    lane_promote_after: int = setting(4, minimum=1, help="""
        Interactive calls admitted while a batch or background call waits before it goes
        first.""")
    lane_promote_seconds: float = setting(2.0, minimum=0.001, help="""
        Seconds a batch or background call waits before it goes first.""")
    interactive_reserved_slot: bool = setting(True, help="""
        Keep one slot of a child with two or more for interactive calls (batch and background
        are also never sent ahead into the child's own queue).""")
    background_instance_nice: int = setting(10, minimum=1, help="""
        Nice value added to a model's background instance ([ROLE] background_instance), 1-19:
        the kernel gives the cores to the interactive lane's child first. A reload applies
        it from the instance's next start.""")
    background_instance_threads: int = setting(0, minimum=0, help="""
        CPU threads of a background instance; 0: half the cores, at most the model's own
        threads. The instance runs beside the interactive children by design, and llama.cpp's
        threads meet at a barrier after every operation: a team as large as the cores, niced,
        waits on whichever of its threads the interactive children preempt (on 2 cores an
        ingest beside a chat client ran at 0.47x of alone with two threads, 0.71-0.76x with
        one). Every core makes an ingest on a quiet machine faster (37 against 25-27
        documents/s there). A reload applies it from the instance's next start.""")
    background_instance_ttl: float = setting(300.0, minimum=1, help="""
        Seconds a background instance stays after its last batch or background call, for a
        model without a ttl of its own.""")
    switch_interval_ms: float = setting(1.0, minimum=0.1, help="""
        How long one of the daemon's threads may keep Python's interpreter while another
        waits for it, ms (sys.setswitchinterval; Python's default is 5). A search's index
        reads, an ingest's chunking and the batch calls' encoding share the interpreter;
        each time a search's thread gets it back it waited up to this long: under an ingest
        and 8 batch Embed clients, hybrid Search p95 was 65 ms at 5 and 34-54 ms at 1 over two
        runs (2 cores, bench/RESULTS.md "Lanes").""")
    max_message_bytes: int = setting(16 * 1024 * 1024, minimum=1024, reload="restart", help="""
        Largest gRPC message received or sent, bytes.""")
    # Chat's sampling when a request leaves it unset (Generate stays greedy; see
    # daemon.config._sampling).
    chat_temperature: float = sampling("Chat", "temperature")
    chat_top_p: float = sampling("Chat", "top_p")
    chat_min_p: float = sampling("Chat", "min_p")
    chat_repeat_penalty: float = sampling("Chat", "repeat_penalty")
    chat_dry_multiplier: float = sampling("Chat", "dry_multiplier")
    chat_frequency_penalty: float = sampling("Chat", "frequency_penalty")


@dataclass(frozen=True)
class Settings:
    """Every option as read (flag > environment > file > default): the top-level ones and
    a field per section, in ``--help`` order."""

    listen: str = setting("127.0.0.1:50051", help="""
        gRPC address: host:port (loopback by default; port 0 picks a free one) or
        unix:/path/to.sock.""")
    metrics_listen: str = setting("", help="""
        Serve Prometheus metrics over HTTP on this loopback host:port (off when empty).""")
    http_listen: str = setting("", help="""
        Serve the OpenAI-compatible HTTP API on this host:port (off when empty; beyond loopback
        only with TLS and client authentication, as for listen).""")
    agent_listen: str = setting("", help="""
        Answer HAProxy agent checks on this host:port (off when empty): one line, 'up ready'
        with a weight from the free slots, 'drain' or 'down#reason'. Any address may be given:
        the port reads nothing and tells only that state and weight.""")
    state_dir: str = setting("", help="""
        Directory for the retrieval indexes (default: $STATE_DIRECTORY, else ./var).""")
    llama_bin: str = setting("", reload="new_child", help="""
        llama-server binary (default: beside the daemon's Python, then inside the installed
        llama-cpp-python package, then PATH).""")
    models_dir: str = setting("", reload="new_child", help=f"""
        Directory of the prepared models (its manifest.json, written by `python -m models
        prepare`): an embedded role whose model is not set runs the manifest's default model
        for it (default: models/gguf in a source checkout once prepared, else
        {INSTALLED_MODELS_DIR}). Every other GGUF file directly in it is a model of the
        catalog too, named after its file stem, its role from its metadata.""")
    models_preset: str = setting("", help="""
        llama-server's router preset INI (its --models-preset format): each section is a model
        of the catalog, beside the [models.NAME] tables.""")
    tls: TlsSettings = field(default_factory=TlsSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    endpoint_keys: EndpointKeySettings = field(default_factory=EndpointKeySettings)
    # Spin counts measured on 2 cores: see supervisor.LaunchSpec.spin_count.
    generation: RoleSettings = field(default_factory=partial(
        RoleSettings, ctx_size=4096, parallel=4, queue_ahead=0, spin_count=300))
    embedding: RoleSettings = field(default_factory=partial(
        RoleSettings, ctx_size=0, parallel=2, queue_ahead=2, spin_count=3000))
    restart: RestartSettings = field(default_factory=RestartSettings)
    child: ChildSettings = field(default_factory=ChildSettings)
    swap: SwapSettings = field(default_factory=SwapSettings)
    recycle: RecycleSettings = field(default_factory=RecycleSettings)
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    drain_grace: float = setting(30.0, minimum=0, help="""
        On SIGTERM, seconds in-flight calls get to finish before they are cancelled.""")
    drain_notice: float = setting(0.0, minimum=0, help="""
        On SIGTERM, seconds between reporting the drain (health NOT_SERVING, agent 'drain') and
        refusing new calls, for load balancers to notice; calls arriving meanwhile are
        served.""")
    log: LogSettings = field(default_factory=LogSettings)
    limits: Limits = field(default_factory=Limits)
    http: HttpSettings = field(default_factory=HttpSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    models: PoolSettings = field(default_factory=PoolSettings)


OPTIONS: tuple[Option, ...] = tuple(options_of(Settings()))
"""Every option, in declaration order: its flag, variable, TOML key and help come from it."""

_BY_KEY = {o.key: o for o in OPTIONS}


def option(key: str) -> Option:
    """The declared option ``key`` (``section.name`` or ``name``), for messages that tell
    an operator how to set it.

    Raises:
        KeyError: no such option.
    """
    return _BY_KEY[key]
