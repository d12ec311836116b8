"""Prometheus metrics: what llamad counts, with bounded label sets.

:class:`Metrics` owns its own :class:`prometheus_client.CollectorRegistry` (never the
process-global one), so tests and several daemons in one process do not collide. It does
not import gRPC: callers pass plain strings.

Cardinality is bounded by construction. Every label value comes from a small fixed set;
anything else is recorded as ``"other"``, so a bug (or a new value nobody added here)
shows up as an ``other`` series instead of an unbounded number of new ones. The sets:

=========  ===========================================================================
label      allowed values (anything else becomes ``other``)
=========  ===========================================================================
role       :data:`ROLES` (``generation``, ``embedding``), or the ``roles`` argument
model      the catalog's model names (the ``models`` argument: the ids ``/v1/models``
           lists); a series labelled by model carries its ``role`` too (the model's
           role, so it adds no series), and one of a name outside the catalog is
           ``model="other"``
state      :data:`CHILD_STATES`: idle starting running backoff failed stopped
mode       :data:`MODES`: embedded endpoint disabled
kind       :data:`EXIT_KINDS`: the :class:`supervisor.ExitCause` kinds
method     :data:`METHODS` (the gRPC method names), or the ``methods`` argument
code       :data:`CODES`: the ``grpc.StatusCode`` names (OK, CANCELLED, ...)
outcome    :data:`SWAP_OUTCOMES`: ok failed rejected
reason     :data:`REJECT_REASONS`: queue_full deadline
lane       :data:`LANES`: interactive batch background
protocol   :data:`PROTOCOLS`: grpc http (the API a call came in on)
outcome    of a model load: ok failed rejected; of a call: ok error cancelled
reason     of a model unload (:data:`UNLOAD_REASONS`): room ttl admin
=========  ===========================================================================

Per call and per model (issue 28): calls, time to first token, inter-token gaps, tokens,
queue depth, slots busy, rejections, child state, exits, restarts and breaker openings
are labelled ``role`` and ``model``; the role's totals are ``sum by (role)``. The
lifecycle gauges (loading, last used) are read from the pool when scraped
(:mod:`daemon.telemetry.model_gauges`): a scrape never loads or wakes a model.

Prompts, pids, model paths and peers are never labels. The only free-form label is
``llamad_build_info{version}``, which has one series per process.

The HTTP endpoint is in :mod:`daemon.ops.metrics_http`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..config import InferenceMode, Role
from .model_gauges import ModelGauges, ModelLife, StreamSeries

_log = structlog.get_logger("llamad.metrics")

OTHER = "other"
"""The label value that stands for anything outside an allowed set."""

ROLES: tuple[str, ...] = tuple(r.value for r in Role)
CHILD_STATES: tuple[str, ...] = ("idle", "starting", "running", "backoff", "failed", "stopped")
EXIT_KINDS: tuple[str, ...] = (
    "crash", "signal", "oom", "port_in_use", "usage_error", "model_error", "invalid_model",
    "hung", "never_ready", "start_timeout", "spawn_error", "stranger", "stopped",
    # Taken out of service by its outcomes while its /health answered (issue 28).
    "calls_failing", "probe_failed", "probe_stalled",
    # An external endpoint's failures (supervisor.ENDPOINT_KINDS).
    "refused", "unreachable", "timeout", "endpoint_error", "tls", "auth", "api_key",
    "not_openai", "unknown_model", "not_chat", "no_embeddings",
)
MODES: tuple[str, ...] = tuple(m.value for m in InferenceMode)
METHODS: tuple[str, ...] = (
    "Generate", "Chat", "Embed", "Tokenize", "Detokenize", "Status", "TailLogs", "Swap",
    "Reset", "SetMode", "SetDraining", "UpsertDocument", "DeleteDocument", "GetDocument",
    "ListDocuments", "AddSource", "RemoveSource", "ListSources", "Reindex", "Search", "Ask",
    "ListModels", "LoadModel", "UnloadModel",
)
"""gRPC method names counted under their own label; extend it (or pass ``methods=``)."""
UNLOAD_REASONS: tuple[str, ...] = ("room", "ttl", "admin")
"""Why the pool unloaded a model: to make room for another, idle past its ttl, asked."""
# grpc.StatusCode names, spelled out so this module stays grpc-free
# (tests/unit/test_metrics.py checks the list against grpc.StatusCode).
CODES: tuple[str, ...] = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
)
SWAP_OUTCOMES: tuple[str, ...] = ("ok", "failed", "rejected")
CALL_OUTCOMES: tuple[str, ...] = ("ok", "error", "cancelled")
"""How a call admitted to a model (or refused on its way there) ended."""
REJECT_REASONS: tuple[str, ...] = ("queue_full", "deadline")
LANES: tuple[str, ...] = ("interactive", "batch", "background")
"""The admission lanes (:class:`daemon.models.lanes.Lane`)."""
PROTOCOLS: tuple[str, ...] = ("grpc", "http")
"""The APIs a call can come in on: gRPC, or the OpenAI-compatible HTTP API (whose calls
are counted under the gRPC method they correspond to, and the code gRPC would give)."""

# Bucket upper bounds, in seconds.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0)
"""Whole calls: a Tokenize takes milliseconds, a long Generate stream minutes."""
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Time to first token: 5 ms (tiny prompt, idle slot) to 30 s (long prompt, busy child)."""
INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
"""Gaps between streamed chunks: 1 ms to 2 s."""
SWAP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""A swap starts and readies a new child: up to the 300 s start cap."""


def _version() -> str:
    try:
        return metadata.version("llamad")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _fold(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else OTHER


class _WithoutCreated(Collector):
    """The registry's metrics minus the ``*_created`` samples.

    In the 0.0.4 text format prometheus_client exports each counter's and histogram's
    creation time as a separate ``<name>_created`` gauge series, doubling their series
    count for a timestamp Prometheus does not use. The library's switch for this
    (``disable_created_metrics``) is process-global; this filter is per registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            created = family.name + "_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family


class Metrics:
    """The daemon's metrics, in a registry of their own.

    Every method is cheap, synchronous, thread-safe and never raises on odd input (an
    unknown label value becomes ``"other"``, a negative count or duration is clamped to 0),
    so it may be called from a supervisor listener or a ``finally`` block.

    Args:
        version: for ``llamad_build_info``; the installed llamad's version by default.
        methods: gRPC method names kept as ``method`` label values (default
            :data:`METHODS`).
        roles: child roles kept as ``role`` label values (default :data:`ROLES`); their
            counters and gauges are exported at 0 from the start, so ``rate()`` and
            ``increase()`` see the first event.
        models: the catalog's model names kept as ``model`` label values; given as a
            mapping of name to role, each model's per-call series are exported at 0 from
            the start too (without one, each role's under ``model="other"``).
    """

    def __init__(
        self,
        *,
        version: str | None = None,
        methods: Iterable[str] = METHODS,
        roles: Iterable[str] = ROLES,
        models: Iterable[str] | Mapping[str, str] = (),
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._exposed = _WithoutCreated(self.registry)
        self._methods = frozenset(methods)
        self._roles = frozenset(roles)
        self._kinds = frozenset(EXIT_KINDS)
        self._codes = frozenset(CODES)
        self._outcomes = frozenset(SWAP_OUTCOMES)
        self._reasons = frozenset(REJECT_REASONS)
        self._lanes = frozenset(LANES)
        self._protocols = frozenset(PROTOCOLS)
        self._models: frozenset[str] = frozenset()
        self._role_of: dict[str, str] = {}  # catalog model -> its role (when given)
        self._states = frozenset(CHILD_STATES)
        self._call_outcomes = frozenset(CALL_OUTCOMES)
        # Children whose state gauge has an "other" series (only after a bad state value).
        self._other_state: set[tuple[str, str]] = set()
        self._series_cache: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry

        self._build_info = Gauge(
            "llamad_build_info", "Always 1; the version label says which llamad is running.",
            ["version"], registry=r)
        self._build_info.labels(version=version or _version()).set(1)

        self._child_state = Gauge(
            "llamad_child_state",
            "1 for the state the child is in now, 0 for the other states.",
            ["role", "model", "state"], registry=r)
        self._lane_instance = Gauge(
            "llamad_lane_instance_state",
            "1 for the state a model's background instance (its batch and background "
            "lanes' child) is in now, 0 for the other states.",
            ["role", "model", "state"], registry=r)
        self._lane_instance_exits = Counter(
            "llamad_lane_instance_exits",
            "A model's background instance: exits and failed starts, by classified cause "
            "(see ExitCause.kind; the model's own child counts in llamad_child_exits).",
            ["role", "model", "kind"], registry=r)
        self._child_exits = Counter(
            "llamad_child_exits",
            "Child exits and failed starts, by classified cause (see ExitCause.kind).",
            ["role", "model", "kind"], registry=r)
        self._child_restarts = Counter(
            "llamad_child_restarts",
            "Starts after a backoff delay or a failed state (what Status calls restarts).",
            ["role", "model"], registry=r)
        self._breaker_opens = Counter(
            "llamad_breaker_opens",
            "Times the circuit breaker opened (the child entered the failed state).",
            ["role", "model"], registry=r)
        self._mode = Gauge(
            "llamad_inference_mode",
            "1 for the role's inference mode now (embedded, endpoint, disabled), 0 for the "
            "others.", ["role", "mode"], registry=r)
        self._swaps = Counter(
            "llamad_swaps", "Model swaps and mode switches, by outcome: ok, failed (the old "
            "one kept serving) or rejected.",
            ["role", "outcome"], registry=r)
        self._stuck = Counter(
            "llamad_stuck_replacements", "Children replaced as stuck: their serving loop did "
            "not answer within recycle.cancel_grace of a cancelled call on them.",
            ["role"], registry=r)
        self._swap_seconds = Histogram(
            "llamad_swap_duration_seconds",
            "Time from a swap request until the new child served (or the swap gave up).",
            ["role"], buckets=SWAP_BUCKETS, registry=r)

        self._requests = Counter(
            "llamad_requests", "Finished calls, by protocol (grpc, http), method and status "
            "code.", ["protocol", "method", "code"], registry=r)
        self._request_seconds = Histogram(
            "llamad_request_duration_seconds",
            "Duration of calls, streams included, from arrival to the last message.",
            ["protocol", "method"], buckets=REQUEST_BUCKETS, registry=r)
        self._ttft = Histogram(
            "llamad_time_to_first_token_seconds",
            "Time from a Generate or Chat call's arrival to its first streamed token.",
            ["role", "model"], buckets=TTFT_BUCKETS, registry=r)
        self._inter_token = Histogram(
            "llamad_inter_token_latency_seconds",
            "Time between consecutive streamed chunks of one call.",
            ["role", "model"], buckets=INTER_TOKEN_BUCKETS, registry=r)
        self._tokens = Counter(
            "llamad_tokens_generated", "Tokens streamed to clients.",
            ["role", "model"], registry=r)
        self._calls = Counter(
            "llamad_model_calls", "Calls given to a model (admitted, or refused on the way "
            "to its slots), by outcome: ok, error, cancelled.",
            ["role", "model", "outcome"], registry=r)

        self._queue_depth = Gauge(
            "llamad_queue_depth", "Calls waiting for a slot of the model (sum by (role): "
            "every model of the role).",
            ["role", "model"], registry=r)
        self._lane_depth = Gauge(
            "llamad_lane_queue_depth", "Calls waiting for a slot of the model, by lane "
            "(sum by (role, model): llamad_queue_depth).",
            ["role", "model", "lane"], registry=r)
        self._in_flight = Gauge(
            "llamad_requests_in_flight",
            "Calls holding one of the model's slots now (slots busy; running, or waiting "
            "in the child's queue: queue_ahead).",
            ["role", "model"], registry=r)
        self._rejections = Counter(
            "llamad_rejections", "Calls refused by the model's admission control, by "
            "reason.", ["role", "model", "reason"], registry=r)

        self._model_resident = Gauge(
            "llamad_model_resident", "1 while the catalog model is resident (loaded by the "
            "pool or a role's model that serves), else 0.", ["model"], registry=r)
        self._model_loads = Counter(
            "llamad_model_loads", "Loads of catalog models by the pool, by outcome: ok, "
            "failed (it never became ready) or rejected (no room).",
            ["model", "outcome"], registry=r)
        self._model_unloads = Counter(
            "llamad_model_unloads", "Unloads of catalog models by the pool, by reason: room "
            "(evicted for another), ttl (idle), admin (UnloadModel).",
            ["model", "reason"], registry=r)
        self._gauges: Collector | None = None

        for role in sorted(self._roles):
            self._stuck.labels(role=role)
            for outcome in SWAP_OUTCOMES:
                self._swaps.labels(role=role, outcome=outcome)
        self.add_models(models)
        if not self._role_of:  # no catalog given: each role's series under "other"
            for role in sorted(self._roles):
                self._per_model_zeros(role, OTHER)

    def _role(self, role: str) -> str:
        return _fold(role, self._roles)

    def _model(self, model: str) -> str:
        return _fold(model, self._models)

    def _per_model_zeros(self, role: str, model: str) -> None:
        """Export a model's counters and gauges at 0 (``rate()`` sees the first event)."""
        self._child_restarts.labels(role, model)
        self._breaker_opens.labels(role, model)
        self._tokens.labels(role, model)
        self._queue_depth.labels(role, model)
        self._in_flight.labels(role, model)
        for lane in LANES:
            self._lane_depth.labels(role, model, lane)
        for kind in EXIT_KINDS:
            self._child_exits.labels(role, model, kind)
        for reason in REJECT_REASONS:
            self._rejections.labels(role, model, reason)
        for outcome in CALL_OUTCOMES:
            self._calls.labels(role, model, outcome)
        if role == Role.GENERATION:  # only generation streams tokens
            self._ttft.labels(role, model)
            self._inter_token.labels(role, model)

    def _series(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per label set: the hot paths (every
        call, every streamed chunk) skip prometheus_client's validation and locking. The
        label values are folded to fixed sets, so the cache stays small."""
        key = (id(metric), values)
        series = self._series_cache.get(key)
        if series is None:
            series = self._series_cache[key] = metric.labels(*values)
        return series

    # -- children ------------------------------------------------------------------------

    def child_state(self, role: str, state: str, model: str = "") -> None:
        """Make ``state`` the current state of the child serving ``model`` (a catalog
        name) in ``role``: its series 1, the other states 0."""
        role, model = self._role(role), self._model(model)
        state = _fold(state, self._states)
        if state == OTHER:
            self._other_state.add((role, model))
        names = (*CHILD_STATES, OTHER) if (role, model) in self._other_state else CHILD_STATES
        for name in names:
            self._child_state.labels(role, model, name).set(1 if name == state else 0)

    def lane_instance_state(self, role: str, model: str, state: str) -> None:
        """Make ``state`` (a child state) the current state of ``model``'s background
        instance: its series 1, the other states 0."""
        role, model = self._role(role), self._model(model)
        state = _fold(state, self._states)
        for name in (*CHILD_STATES, OTHER):
            self._lane_instance.labels(role, model, name).set(1 if name == state else 0)

    def mode(self, role: str, mode: str) -> None:
        """Make ``mode`` the role's inference mode: its series 1, the other modes 0."""
        role = self._role(role)
        for name in MODES:
            self._mode.labels(role=role, mode=name).set(1 if name == mode else 0)

    def child_exit(self, role: str, kind: str, model: str = "") -> None:
        """Count an exit or failed start of ``model``'s child classified as ``kind``."""
        self._child_exits.labels(self._role(role), self._model(model),
                                 _fold(kind, self._kinds)).inc()

    def lane_instance_exit(self, role: str, model: str, kind: str) -> None:
        """Count an exit or failed start of ``model``'s background instance classified as
        ``kind``."""
        self._lane_instance_exits.labels(self._role(role), self._model(model),
                                         _fold(kind, self._kinds)).inc()

    def child_restart(self, role: str, model: str = "") -> None:
        """Count a restart of ``model``'s child (a start after backoff or after the failed
        state)."""
        self._child_restarts.labels(self._role(role), self._model(model)).inc()

    def breaker_opened(self, role: str, model: str = "") -> None:
        """Count an opening of ``model``'s circuit breaker."""
        self._breaker_opens.labels(self._role(role), self._model(model)).inc()

    def swap(self, role: str, outcome: str, seconds: float) -> None:
        """Count a finished swap or mode switch (``ok``, ``failed`` or ``rejected``) and
        observe its duration."""
        role = self._role(role)
        self._swaps.labels(role=role, outcome=_fold(outcome, self._outcomes)).inc()
        self._swap_seconds.labels(role=role).observe(max(0.0, seconds))

    def stuck_replaced(self, role: str) -> None:
        """Count a child replaced as stuck after a cancelled call."""
        self._stuck.labels(role=self._role(role)).inc()

    # -- the model pool ------------------------------------------------------------------

    def add_models(self, models: Iterable[str] | Mapping[str, str]) -> None:
        """Catalog names that may label the model series from now on (a reload's new
        models), each series exported from 0; names already known are kept. Given as a
        mapping of name to role, the per-call series of each are exported from 0 too."""
        if isinstance(models, Mapping):
            for model, role in models.items():
                if self._role_of.get(model) != role:
                    self._role_of[model] = self._role(role)
                    self._per_model_zeros(self._role(role), model)
        self._models = self._models | frozenset(models)
        for model in sorted(self._models):
            self._model_resident.labels(model=model)
            for outcome in SWAP_OUTCOMES:
                self._model_loads.labels(model=model, outcome=outcome)
            for why in UNLOAD_REASONS:
                self._model_unloads.labels(model=model, reason=why)

    def model_load(self, model: str, outcome: str) -> None:
        """Count a load of a catalog model (``ok``, ``failed`` or ``rejected``); one that
        went ok makes it resident."""
        model = _fold(model, self._models)
        self._model_loads.labels(model=model, outcome=_fold(outcome, self._outcomes)).inc()
        if outcome == "ok":
            self._model_resident.labels(model=model).set(1)

    def model_unload(self, model: str, reason: str) -> None:
        """Count an unload (``room``, ``ttl`` or ``admin``): the model is not resident."""
        model = _fold(model, self._models)
        self._model_unloads.labels(model=model,
                                   reason=_fold(reason, frozenset(UNLOAD_REASONS))).inc()
        self._model_resident.labels(model=model).set(0)

    def model_resident(self, model: str, resident: bool) -> None:
        """Say whether ``model`` is resident (a role's model, at start)."""
        self._model_resident.labels(model=_fold(model, self._models)).set(int(resident))

    # -- requests ------------------------------------------------------------------------

    def request(self, method: str, code: str, seconds: float, protocol: str = "grpc") -> None:
        """Count a finished call and observe its duration (``protocol``: the API it came
        in on; an HTTP call names its gRPC method and the code gRPC would give)."""
        method = _fold(method, self._methods)
        protocol = _fold(protocol, self._protocols)
        self._series(self._requests, protocol, method, _fold(code, self._codes)).inc()
        self._series(self._request_seconds, protocol, method).observe(max(0.0, seconds))

    def stream(self, role: str, model: str) -> StreamSeries:
        """The series one generation stream of ``model`` counts in, resolved once per call
        (:class:`daemon.services.inference.Meter` uses them for every token)."""
        role, model = self._role(role), self._model(model)
        return StreamSeries(self._series(self._tokens, role, model),
                            self._series(self._ttft, role, model),
                            self._series(self._inter_token, role, model))

    def time_to_first_token(self, role: str, seconds: float, model: str = "") -> None:
        """Observe the time from a call's arrival to its first token."""
        self._series(self._ttft, self._role(role), self._model(model)).observe(
            max(0.0, seconds))

    def inter_token(self, role: str, seconds: float, model: str = "") -> None:
        """Observe the gap between two consecutive streamed chunks."""
        self._series(self._inter_token, self._role(role), self._model(model)).observe(
            max(0.0, seconds))

    def tokens(self, role: str, n: int, model: str = "") -> None:
        """Add ``n`` streamed tokens (a negative ``n`` is ignored)."""
        self._series(self._tokens, self._role(role), self._model(model)).inc(max(0, n))

    def call(self, role: str, model: str, outcome: str) -> None:
        """Count a call given to ``model``: ``ok``, ``error`` or ``cancelled``."""
        self._series(self._calls, self._role(role), self._model(model),
                     _fold(outcome, self._call_outcomes)).inc()

    # -- admission control ---------------------------------------------------------------

    def queue_depth(self, role: str, n: int, model: str = "") -> None:
        """Set how many calls wait for a slot of ``model``."""
        self._series(self._queue_depth, self._role(role), self._model(model)).set(max(0, n))

    def lane_queue_depth(self, role: str, model: str, lane: str, n: int) -> None:
        """Set how many calls wait for a slot of ``model`` in ``lane``."""
        self._series(self._lane_depth, self._role(role), self._model(model),
                     _fold(lane, self._lanes)).set(max(0, n))

    def in_flight(self, role: str, n: int, model: str = "") -> None:
        """Set how many of ``model``'s slots are busy."""
        self._series(self._in_flight, self._role(role), self._model(model)).set(max(0, n))

    def rejected(self, role: str, reason: str, model: str = "") -> None:
        """Count a call refused by ``model``'s admission control (``queue_full`` or
        ``deadline``)."""
        self._rejections.labels(self._role(role), self._model(model),
                                _fold(reason, self._reasons)).inc()

    # -- lifecycle, read when scraped -----------------------------------------------------

    def watch_models(self, source: Callable[[], Iterable[ModelLife]]) -> None:
        """Export each catalog model's lifecycle gauges from ``source`` (called at every
        scrape, on the scraping thread; it must only read). Names outside the catalog are
        left out. A second call replaces the first source."""
        if self._gauges is not None:
            self.registry.unregister(self._gauges)
        self._gauges = ModelGauges(source, lambda: self._models, self._role)
        self.registry.register(self._gauges)

    # -- exposition ----------------------------------------------------------------------

    def render(self) -> bytes:
        """Everything, in the Prometheus text exposition format (version 0.0.4)."""
        return generate_latest(self._exposed)
