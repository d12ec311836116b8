"""The daemon: composition root. Builds each role's model and the model registry that owns
them and every other model (:class:`daemon.models.pool.Pool`), serves gRPC, drains on
SIGTERM.

Start-up order: the state directory is locked first (one daemon per state directory,
:mod:`daemon.ops.statelock`), then the gRPC server listens (health answers NOT_SERVING while
the children load, so clients can Watch), then the supervisors start the children.

Shutdown (SIGTERM or SIGINT): health turns NOT_SERVING everywhere and the agent-check port
answers ``drain``; after ``drain_notice`` seconds (0 by default; calls arriving meanwhile
are served) gRPC sends GOAWAY and new calls are refused with UNAVAILABLE, in-flight calls
get ``drain_grace`` seconds to finish (on every model, those loaded on demand too), then
the registry stops every model's child (those loaded on demand, then generation, then
embedding) and they are reaped, and the process exits with status 0 (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from llamad_protocol.v1 import (
    answer_pb2_grpc,
    control_pb2_grpc,
    inference_pb2_grpc,
    retrieval_pb2_grpc,
    wire,
)
from retrieval import Retriever
from supervisor import Clock, State, StateChange, SystemClock

from .config import Config, Role
from .config._catalog import Catalog, CatalogEntry
from .config.inference_mode import InferenceMode
from .console import console
from .grpcapi import rpc
from .grpcapi.answer import AnswerServicer
from .grpcapi.auth import AuthInterceptor, TlsCredentials
from .grpcapi.connlimits import ConnectionCap, budget_of, grpc_options
from .grpcapi.control import ControlServicer
from .grpcapi.health import HealthReporter
from .grpcapi.inference import InferenceServicer
from .grpcapi.listen import Bound, bind, unbind
from .grpcapi.peerguard import guard_loop
from .grpcapi.retrieval import RetrievalServicer
from .grpcapi.wire import DecodeGuard
from .httpapi import HttpApi
from .models.cancel_watch import CancelWatch
from .models.children import build_child
from .models.lanes import policy_from
from .models.model import Model
from .models.modes import ModeManager
from .models.pool import Pool, pooled_config
from .models.recycle import recycle_loop
from .models.router import InferenceRouter
from .models.swaps import SwapManager
from .ops.balancing import AgentServer, Drainer, agent_reply
from .ops.metrics_http import MetricsServer, serve_metrics
from .ops.reload import ReloadReport, reload_config
from .ops.startup import (
    describe_mode,
    log_default_models,
    version,
    warn_unprotected_hard_links,
)
from .ops.statelock import StateLock
from .ops.systemd import Notifier, status_line, watchdog_loop
from .services.ask import ResponseCache
from .services.knowledge import Knowledge
from .services.retrieval_bridge import (
    backfill_loop,
    limits_from,
    make_lookup,
    make_provider,
    postgres_from,
    rescan_loop,
    unavailable_reason,
    watch_sources,
)
from .telemetry.audit import AuditLog
from .telemetry.metrics import Metrics
from .telemetry.model_gauges import model_lives

_log = structlog.get_logger("llamad.daemon")

CALLS_ENDING_MAX = 5.0
"""Seconds a shutdown waits, after everything is stopped, for gRPC calls the drain cut
that are still ending, so that their summary lines come before ``stopped``."""

SERVICE_NAMES = (  # what reflection lists (test_proto ties the names to the descriptors)
    wire.INFERENCE_SERVICE, wire.CONTROL_SERVICE, wire.RETRIEVAL_SERVICE,
    wire.ANSWER_SERVICE, wire.HEALTH_SERVICE,
    reflection.SERVICE_NAME,
)


class Daemon:
    """One llamad instance. ``await start()``, then ``await run_until_stopped()``."""

    def __init__(self, config: Config, *, clock: Clock | None = None,
                 reload: Callable[[], Config] | None = None,
                 notifier: Notifier | None = None) -> None:
        """Args:
            config: the validated configuration.
            clock: time source for supervision (tests inject one).
            reload: re-reads the configuration on SIGHUP (None: reload is refused).
            notifier: tells systemd about readiness, state and shutdown (None: silent).
        """
        self._notifier = notifier or Notifier(None)
        self._watchdog: asyncio.Task[None] | None = None
        self.config = config
        # The interpreter is the process's: the latest daemon made (one per process,
        # but for tests) sets how long a thread may keep it while another waits.
        sys.setswitchinterval(config.settings.limits.switch_interval_ms / 1000)
        self._reload_source = reload
        self._reloading = asyncio.Lock()
        self._clock = clock or SystemClock()
        # Every role has its model whatever its mode, so a mode can be switched live.
        roles: dict[str, Model] = {role: build_child(config, role, clock=self._clock)
                                   for role in Role}
        self.metrics = Metrics(version=version(), models=_model_roles(config.catalog))
        for child in roles.values():
            # A role's series carry the catalog name of the model it serves (its default).
            name = config.catalog.defaults.get(child.role, child.role)
            self.metrics.child_state(child.role, child.supervisor.state.value, name)
            self.metrics.mode(child.role, child.mode.kind)
            child.supervisor.subscribe(functools.partial(self._observe_child, name))
            child.subscribe(self._after_change)
        self._metrics_server: MetricsServer | None = None
        self._http: HttpApi | None = None
        self.http_port = 0
        self.auth = AuthInterceptor(config.tokens, self.metrics, config.settings.auth)
        self._tls = TlsCredentials(config.tls) if config.tls is not None else None
        self._bound: Bound | None = None
        # The model registry: every catalog model by name, the roles' models its pinned
        # defaults (issues 14 and 26); whoever needs a role's model asks it.
        self.pool = Pool(config.catalog, roles, self._pool_model, clock=self._clock,
                         settings=config.settings.models, metrics=self.metrics)
        self.router = InferenceRouter(self.pool.roles())
        self.router.metrics = self.metrics
        self.metrics.watch_models(functools.partial(model_lives, self.pool))
        # Any model's state or what serves it changed: systemd's status line says so.
        self.pool.subscribe(self._tell_status)
        for name in config.catalog.defaults.values():  # the roles' models serve
            self.metrics.model_resident(name, True)
        self.router.attach(self.pool)
        self.swaps = SwapManager(self.pool)
        self.cancel_watch = CancelWatch(self.swaps, self.metrics,
                                        lambda: self.config.settings.recycle.cancel_grace)
        self.router.on_cancelled = self.cancel_watch.cancelled
        self.modes = ModeManager(self.pool, lambda: self.config)
        self.retriever: Retriever | None = None
        self._answer: AnswerServicer | None = None
        self._retrieval: RetrievalServicer | None = None
        if config.settings.retrieval.enabled:
            provider = make_provider(self.router, self.children)
            self.retriever = Retriever(config.state_dir / "retrieval", provider,
                                       limits_from(config),
                                       unavailable_reason=unavailable_reason(self.children),
                                       embedder_for=make_lookup(provider),
                                       clock=self._clock, postgres=postgres_from(config))
        self.health = HealthReporter(self.pool, retrieval=self.retriever is not None)
        self.drainer = Drainer(self.pool.every_model, self.health.set_drained)
        self._agent: AgentServer | None = None
        self.agent_port = 0
        self._server: grpc.aio.Server | None = None
        self._state_lock = StateLock(config.state_dir)
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = time.monotonic()
        self.address = ""

    async def start(self) -> str:
        """Lock the state directory, listen and start the children; return the bound
        address (``host:port``).

        Raises:
            StateDirInUse: another daemon holds the state directory.
            OSError: the address cannot be bound, or the state directory locked.
        """
        # Before anything in the state directory is opened (the socket, the indexes):
        # a second daemon on it is refused here, naming the first one's pid.
        self._state_lock.acquire()
        try:
            return await self._start()
        except BaseException:
            self._state_lock.release()
            raise

    async def _start(self) -> str:
        log_default_models(self.config)
        limit, cfg = self.config.settings.limits.max_message_bytes, self.config
        # The listeners' share of the descriptors (issue 25: a flood must not take them).
        conns = budget_of(cfg)
        # Access first: a call without a valid token is refused before anything else.
        server = grpc.aio.server(interceptors=[self.auth, DecodeGuard(self.metrics)], options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # Never share a port with another process: a second daemon must fail to bind.
            ("grpc.so_reuseport", 0),
            *grpc_options(cfg.settings.connections, conns),
        ])
        # The generated *_grpc modules carry no type hints (grpcio-tools makes no .pyi).
        self._inference = InferenceServicer(self.router, self.config.settings.limits, self.metrics)
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            self._inference, server)
        control_pb2_grpc.add_ControlServiceServicer_to_server(
            ControlServicer(self.pool, version(), self._started,
                            lambda: self.router.draining, swaps=self.swaps,
                            modes=self.modes, metrics=self.metrics, drainer=self.drainer),
            server)
        if self.retriever is not None:
            retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
                self._retrieval_servicer(self.retriever), server)
        # Served in every mode: a disabled generation role answers FAILED_PRECONDITION.
        self._answer = self._answer_servicer()
        answer_pb2_grpc.add_AnswerServiceServicer_to_server(self._answer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, server)
        reflection.enable_server_reflection(SERVICE_NAMES, server)
        self._bound = bind(server, self.config,
                           self._tls.server_credentials() if self._tls is not None else None)
        if self.retriever is not None:
            await self.retriever.open()
            warn_unprotected_hard_links(self.config)
        if self.config.settings.metrics_listen:
            host, _, mport = self.config.settings.metrics_listen.rpartition(":")
            try:
                self._metrics_server = await serve_metrics(
                    self.metrics, host, int(mport), max_connections=conns.metrics)
            except OSError as exc:
                raise OSError(f"cannot serve metrics on {self.config.settings.metrics_listen}: "
                              f"{exc.strerror or exc}") from None
        self.address = self._bound.address
        if self.config.settings.http_listen:
            self._http = HttpApi(
                router=self.router, served=self.pool.roles(),
                limits=lambda: self.config.settings.limits,
                settings=self.config.settings.http, auth=self.auth, metrics=self.metrics,
                tls=self.config.tls, drain_grace=self.config.settings.drain_grace,
                answer=None if self._answer is None else self._answer.service,
                pool=self.pool,
                connections=ConnectionCap(conns.http, conns.per_peer),
                handshake_timeout=cfg.settings.connections.handshake_timeout,
                serving=self.health.serving, knowledge=self._knowledge(),
                mount=console(self.pool, version(), started=self._started, drainer=self.drainer,
                              draining=lambda: self.router.draining, auth=self.auth,
                              metrics=self.metrics, settings=cfg.settings.console))
            self.http_port = await self._http.start(self.config.settings.http_listen)
        if self.config.settings.agent_listen:
            self._agent = AgentServer(
                lambda: agent_reply(self.pool.every_model(), draining=self.health.draining),
                max_connections=self.config.settings.agent.max_connections,
                timeout=self.config.settings.agent.timeout)
            self.agent_port = await self._agent.start(self.config.settings.agent_listen)
        await self.health.start()
        await server.start()
        self._server = server
        if conns.per_peer and self._bound.socket_path is None:  # gRPC's core cannot
            self._tasks.add(asyncio.create_task(guard_loop(
                self._bound.port, conns.per_peer, cfg.settings.connections.guard_interval),
                name="peer-guard"))
        tls = self.config.tls
        _log.info("listening", address=self.address, version=version(),
                  tls="mutual" if tls and tls.require_client_cert else bool(tls),
                  tokens=self.config.tokens.roles() if self.config.tokens else None,
                  metrics_port=self._metrics_server.port if self._metrics_server else None,
                  http_port=self.http_port or None,
                  agent_port=self.agent_port or None,
                  connections={"fd_limit": conns.nofile, "grpc": conns.grpc,
                               "http": conns.http or None, "per_peer": conns.per_peer},
                  modes={r: describe_mode(c) for r, c in self.pool.roles().items()})
        recycle = cfg.settings.recycle
        if recycle.after_requests or recycle.max_rss_mb:
            task = asyncio.create_task(recycle_loop(
                self.pool, self.swaps, after_requests=recycle.after_requests,
                max_rss_mb=recycle.max_rss_mb, interval=recycle.check_interval,
                min_uptime=recycle.min_uptime), name="recycle")
            self._tasks.add(task)
        rescan = self.config.settings.retrieval.rescan_interval
        if self.retriever is not None and rescan > 0:
            self._tasks.add(asyncio.create_task(
                rescan_loop(self.retriever, rescan, self._allowed_roots), name="rescan"))
        if self.retriever is not None and self.config.settings.retrieval.watch:
            self._tasks.add(asyncio.create_task(
                watch_sources(self.retriever, self.config.settings.retrieval,
                              self._allowed_roots), name="watch-sources"))
        backfill = self.config.settings.retrieval.backfill_interval
        if self.retriever is not None and backfill > 0:
            self._tasks.add(asyncio.create_task(
                backfill_loop(self.retriever, backfill), name="backfill"))
        for child in self.pool.roles().values():  # a model loaded on demand starts then
            if child.mode.kind is InferenceMode.DISABLED:
                continue
            child.start()
            self._tasks.add(asyncio.create_task(child.hash_model(), name=f"hash-{child.role}"))
        self._tasks.update(self.pool.preload())
        self._tasks.add(asyncio.create_task(self.pool.expire_loop(), name="model-ttl"))
        interval = self._notifier.watchdog_interval()
        if interval is not None:
            self._watchdog = asyncio.create_task(watchdog_loop(self._notifier, interval),
                                                 name="sd-watchdog")
        self._notifier.status(self.status_line())
        self._notifier.ready()
        return self.address

    def _retrieval_servicer(self, retriever: Retriever) -> RetrievalServicer:
        self._retrieval = RetrievalServicer(
            retriever, self.metrics, self._allowed_roots, audit=self._search_audit(),
            refresh_interval=lambda: self.config.settings.retrieval.refresh_min_interval)
        return self._retrieval

    def _search_audit(self) -> AuditLog | None:
        """The Search audit log (retrieval.search_audit_log), rotated like Ask's; None:
        off (the default)."""
        path, a = self.config.settings.retrieval.search_audit_log, self.config.settings.answer
        return AuditLog(Path(path), a.audit_max_mb * 1024 * 1024, a.audit_backups) \
            if path else None

    def _answer_servicer(self) -> AnswerServicer:
        a = self.config.settings.answer
        audit_path = Path(a.audit_log) if a.audit_log else (
            self.config.state_dir / "audit" / "answers.jsonl")
        return AnswerServicer(
            self.router, self.retriever, self.config.settings.limits,
            settings=self.config.settings.answer,
            cache=ResponseCache(a.cache_ttl, a.cache_entries),
            audit=AuditLog(audit_path, a.audit_max_mb * 1024 * 1024, a.audit_backups),
            metrics=self.metrics,
        )

    def _knowledge(self) -> Knowledge | None:
        """The knowledge base as the HTTP API serves it (None: retrieval is off)."""
        if self.retriever is None or self._retrieval is None:
            return None
        return Knowledge(self.retriever, self._retrieval.search_service, self._allowed_roots)

    def _allowed_roots(self) -> tuple[str, ...]:
        """Where directory sources may live (retrieval.allowed_roots, as reloaded)."""
        return self.config.settings.retrieval.allowed_roots

    @property
    def children(self) -> dict[str, Model]:
        """Each role's model by role, from the registry (:meth:`~daemon.models.pool.Pool.roles`;
        a copy: the registry holds them)."""
        return dict(self.pool.roles())

    def status_line(self) -> str:
        """One line for systemd's STATUS=: every model of the registry, its state (and
        pid, or endpoint)."""
        return status_line(self.pool.every_model(), draining=self.router.draining)

    def _tell_status(self) -> None:
        self._notifier.status(self.status_line())

    def _observe_child(self, model: str, change: StateChange) -> None:
        """The child of the catalog model ``model`` changed state: its series say so."""
        m = self.metrics
        m.child_state(change.role, change.new.value, model)
        if change.cause is not None:  # set on the way into backoff or failed
            m.child_exit(change.role, change.cause.kind, model)
        if change.new is State.STARTING and change.old in (State.BACKOFF, State.FAILED):
            m.child_restart(change.role, model)
        if change.new is State.FAILED:  # entered only when the breaker opens
            m.breaker_opened(change.role, model)
    def _after_change(self, child: Model) -> None:
        """What serves a model changed (a swap's or switch's cut-over, an unload)."""
        self.metrics.mode(child.role, child.mode.kind)
        self.health.refresh()
        if child.mode.kind is InferenceMode.EMBEDDED:
            self._tasks.add(asyncio.create_task(child.hash_model(), name=f"hash-{child.role}"))

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        # `kill -USR1` dumps every thread's Python stack to stderr (the journal): the
        # first thing to look at when the daemon seems stuck. Runs in C, so it works
        # even when the event loop is wedged.
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def _on_sighup(self) -> None:
        async def run() -> None:
            await self.reload()

        task = asyncio.create_task(run(), name="reload")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> ReloadReport:
        """Re-read the configuration and apply it (see :mod:`daemon.ops.reload`).

        Reloads never overlap: a second one waits for the first.
        """
        if self._reload_source is None:
            report = ReloadReport(error="this daemon was started without a reloadable config")
            _log.warning("reload refused", error=report.error)
            return report
        async with self._reloading:
            self._notifier.reloading()
            self._notifier.status("reloading configuration")
            try:
                self.config, report = await reload_config(
                    self.config, self._reload_source, self.swaps, self.modes, pool=self.pool)
                self.metrics.add_models(_model_roles(self.pool.catalog))
                self._tasks.update(self.pool.preload())  # a reload's new preload models
                self._inference.set_limits(self.config.settings.limits)
                if self.retriever is not None:
                    self.retriever.limits = limits_from(self.config)
                if self._answer is not None:
                    self._answer.configure(self.config.settings.limits, self.config.settings.answer)
                self.auth.set_tokens(self.config.tokens, self.config.settings.auth)
                if self._tls is not None and self.config.tls is not None:
                    self._tls.update(self.config.tls)
                if self._http is not None and self.config.tls is not None:
                    self._http.update_tls(self.config.tls)
                limits = self.config.settings.limits
                sys.setswitchinterval(limits.switch_interval_ms / 1000)
                lanes = policy_from(limits)
                for model in self.pool.built():  # one loaded later keeps it too
                    model.set_queue_size(limits.queue_size)
                    model.admission.configure(lanes)
                    if model.lane_instance is not None:
                        model.lane_instance.configure(
                            nice=limits.background_instance_nice,
                            threads=limits.background_instance_threads,
                            idle=limits.background_instance_ttl)
                return report
            finally:
                self._notifier.status(self.status_line())
                self._notifier.ready()

    async def run_until_stopped(self) -> None:
        """Serve until :meth:`request_stop` (or a signal), then drain and stop."""
        await self._stop.wait()
        await self.shutdown()

    def _pool_model(self, entry: CatalogEntry) -> Model:
        """The Model of a catalog model the pool loads on demand: unloaded until then
        (its child's states counted under its name)."""
        model = build_child(self.config, entry.role, clock=self._clock,
                            child=pooled_config(entry))
        model.supervisor.subscribe(functools.partial(self._observe_child, entry.name))
        return model

    async def shutdown(self) -> None:
        """Drain and stop everything. Idempotent."""
        if self._server is None:
            return
        server, self._server = self._server, None
        _log.info("draining", grace_s=self.config.settings.drain_grace)
        for task in list(self._tasks):
            if task.get_name() in ("recycle", "rescan", "backfill", "model-ttl", "peer-guard"):
                task.cancel()
        self._notifier.stopping()
        await self.health.drain()  # and the agent port answers "drain"
        # For load balancers to notice; calls still served.
        if self.config.settings.drain_notice > 0:
            await asyncio.sleep(self.config.settings.drain_notice)
        self.router.draining = True
        self._notifier.status(self.status_line())
        # HTTP calls drain beside gRPC's, for the same grace.
        await asyncio.gather(server.stop(self.config.settings.drain_grace),
                             self._http.stop() if self._http is not None else asyncio.sleep(0))
        for model in self.pool.built():  # TailLogs' followers end
            model.ring.close()
        if self._retrieval is not None:
            await self._retrieval.close()  # refreshes first: they write to the retriever
        if self.retriever is not None:
            await self.retriever.close()
        await self.cancel_watch.aclose()
        await self.pool.stop()  # every model, the roles' last (generation, then embedding)
        await self.health.close()
        if self._agent is not None:
            await self._agent.close()
        unbind(self._bound)
        if self._metrics_server is not None:
            await self._metrics_server.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        # A call the drain cut may still be ending (a swap stopping what it loaded):
        # its summary line comes before this daemon's last.
        if left := await rpc.calls_ended(CALLS_ENDING_MAX):
            _log.warning("calls still ending at stop", calls=left)
        self._notifier.close()
        self._state_lock.release()  # last: everything in the state directory is closed
        _log.info("stopped")

    async def __aenter__(self) -> Daemon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.shutdown()


def _model_roles(catalog: Catalog) -> dict[str, str]:
    """Each catalog model's role by name: the ``model`` label values of the metrics."""
    return {entry.name: entry.role for entry in catalog.entries}
