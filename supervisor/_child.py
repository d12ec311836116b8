"""One launch of a child: spawn it, wait until it is ready, watch it while it runs.

A :class:`LiveChild` is what the supervisor's state machine drives. Its contract:

* :meth:`ProcessLauncher.launch` returns only once the child is *usable*: the health
  endpoint answered, the server proved it is our child (it reports the per-launch alias
  we gave it, so a stale server on a reused socket is never mistaken for it), and a tiny
  real request succeeded (one generated token, or one embedding). Otherwise it raises
  :class:`StartFailure` carrying the classified :class:`ExitCause`, with the process
  already reaped.

A child listens on a UNIX socket in the daemon's private runtime directory (never a TCP
port) and wants a per-launch key, handed through its environment
(:mod:`supervisor._rundir`, :class:`~supervisor._runtime.Runtime`). Its socket file is
removed once it is gone.
* :meth:`LiveChild.watch` returns the cause when the child dies or stops answering
  liveness probes.
* :meth:`LiveChild.stop` stops and reaps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from . import _loading as loading
from ._client import ApiShape, Health, InferenceClient
from ._clock import Clock
from ._exits import ExitCause, cgroup_oom_kills, classify_exit
from ._liveness import ProbeFailure, ProbePolicy, watch_liveness
from ._logring import LogRing
from ._process import ChildProcess, LineSink, process_cpu_seconds
from ._rundir import child_key, remove_socket, socket_path
from ._runtime import LaunchSpec, Runtime
from ._sampling import Sampling
from ._transport import ChildAddress
from .errors import SupervisorError
from .outcomes import OUTCOME_KINDS, OutcomePolicy, WatchedClient, watch_outcomes

_log = structlog.get_logger("llamad.supervisor")


@dataclass(frozen=True)
class Timeouts:
    """Deadlines of a launch and of liveness probing.

    Attributes:
        start: seconds a start may go without any sign of progress (new output lines,
            or the health endpoint saying "loading") before it is declared stuck.
        start_cap: hard limit of a start, progress or not, for a model of no size.
        start_cap_per_gib: seconds the hard limit grows by per GiB of model file (a 40 GiB
            model takes longer to read than a 100 MB one).
        start_cap_max: the most the hard limit grows to with the model's size (never
            below ``start_cap``).
        probe_interval: seconds between liveness probes while running.
        probe_timeout: seconds a probe may take.
        probe_failures: consecutive failed probes that declare the child hung.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping.
        busy_silence: while requests run, probes are skipped (a child serving one
            request at a time cannot answer them); only this long without a byte from
            the child makes a busy child suspect again.
        failed_calls: calls in a row that fail on the child (a 5xx, a dropped
            connection, a timeout, a stream with no token and no usage) before it is
            taken out of service and replaced; 0: never (:mod:`supervisor.outcomes`).
        token_probe_interval: seconds between looks at its outcomes; a stream silent
            this long (or a failed call) gets the child a 1-token probe.
        token_probe_timeout: seconds a 1-token probe may go unanswered before the child
            is taken out of service (unless it answered other calls meanwhile, or its
            serving loop answered); 0: no probes.
        token_probe_per_gib: seconds added to ``token_probe_timeout`` per GiB of model
            file (one step of a bigger model takes longer).
        token_probe_busy_max: longest a probe may go unanswered while the child's
            process gets CPU time (computing, not stuck) before it is judged stuck anyway.
        unresponsive_grace: seconds between SIGTERM and SIGKILL for a child taken out of
            service (a stuck llama-server may ignore SIGTERM).
    """

    start: float = 60.0
    start_cap: float = 300.0
    start_cap_per_gib: float = 10.0
    start_cap_max: float = 1800.0
    probe_interval: float = 5.0
    probe_timeout: float = 3.0
    probe_failures: int = 3
    stop_grace: float = 10.0
    busy_silence: float = 120.0
    failed_calls: int = 3
    token_probe_interval: float = 1.0
    token_probe_timeout: float = 4.0
    token_probe_per_gib: float = 5.0
    token_probe_busy_max: float = 60.0
    unresponsive_grace: float = 2.0

    def start_cap_for(self, model_bytes: int) -> float:
        """The hard limit of a start of a model file of ``model_bytes``: ``start_cap``
        plus ``start_cap_per_gib`` per GiB, at most ``start_cap_max`` (but never below
        ``start_cap``)."""
        grown = self.start_cap + self.start_cap_per_gib * max(0, model_bytes) / 2**30
        return max(self.start_cap, min(grown, self.start_cap_max))

    @property
    def probes(self) -> ProbePolicy:
        """What the liveness loop (:func:`supervisor._liveness.watch_liveness`) needs."""
        return ProbePolicy(self.probe_interval, self.probe_failures, self.busy_silence)

    def outcomes(self, model_bytes: int = 0) -> OutcomePolicy:
        """What the outcome watch (:func:`supervisor.outcomes.watch_outcomes`) needs, for
        a model file of ``model_bytes``."""
        timeout = self.token_probe_timeout
        if timeout > 0:
            timeout += self.token_probe_per_gib * model_bytes / 2**30
        return OutcomePolicy(self.failed_calls, self.token_probe_interval, timeout,
                             self.busy_silence, max(timeout, self.token_probe_busy_max))


class StartFailure(SupervisorError):
    """A launch did not produce a ready child."""

    def __init__(self, cause: ExitCause) -> None:
        self.cause = cause
        super().__init__(cause.message)


class LiveChild(Protocol):
    """A ready child, as seen by the state machine."""

    pid: int
    socket: str
    """Its UNIX socket's path ("" when it has none: an endpoint)."""
    client: InferenceClient

    async def watch(self) -> ExitCause:
        """Return why the child stopped serving (it died, or it hangs)."""
        ...

    async def stop(self) -> None:
        """Stop and reap the child. Idempotent."""
        ...


StageSink = Callable[[str], None]
"""Told "loading" once the process runs and "probing" once it answers health."""


class Launcher(Protocol):
    """Starts children; the real one is :class:`ProcessLauncher`."""

    async def launch(self, on_stage: StageSink | None = None) -> LiveChild:
        """Start a child and return it once ready, or raise :class:`StartFailure`.

        Cancellation stops and reaps the half-started child.
        """
        ...


class ProcessChild:
    """A child process with its HTTP client."""

    def __init__(
        self,
        process: ChildProcess,
        client: InferenceClient,
        socket: Path,
        clock: Clock,
        timeouts: Timeouts,
        *,
        model_bytes: int = 0,
        embedding: bool = False,
    ) -> None:
        self.process = process
        self.client = client
        self._model_bytes = model_bytes
        self._embedding = embedding
        self._grace = timeouts.stop_grace
        self.socket = str(socket)
        self._socket = socket
        self.pid = process.pid
        self._clock = clock
        self._timeouts = timeouts
        self._exit_task = asyncio.ensure_future(process.wait())
        # Reaped (whoever stopped it, or it died): nobody listens on its socket any more.
        self._exit_task.add_done_callback(
            lambda task: None if task.cancelled() else remove_socket(socket))
        self._oom_kills = cgroup_oom_kills()

    def _cause(self, code: int) -> ExitCause:
        now = cgroup_oom_kills()
        oom = None if now is None or self._oom_kills is None else now - self._oom_kills
        return classify_exit(
            code, self.process.recent_lines(),
            we_killed=self.process.killed_by_us, oom_kills=oom, at=self._clock.wall(),
        )

    async def wait_ready(self, spec: LaunchSpec, on_stage: StageSink | None = None) -> None:
        """Poll until ready; raise :class:`StartFailure` (child reaped) otherwise."""
        t = self._timeouts
        cap = t.start_cap_for(self._model_bytes)
        began = self._clock.monotonic()
        soft_deadline = began + t.start
        lines_seen = 0  # every line, from the first: the watch reads them all
        watch = loading.current()
        interval = 0.01
        try:
            while True:
                if self._exit_task.done():
                    raise StartFailure(self._cause(self._exit_task.result()))
                health = await self.client.health(timeout=min(2.0, t.probe_timeout))
                now = self._clock.monotonic()
                if watch is not None:
                    self._feed(watch, lines_seen)
                if health is Health.READY:
                    if watch is not None:
                        watch.stage("probing")
                    if on_stage is not None:
                        on_stage("probing")
                    await self._prove_identity_and_usable(spec)
                    return
                if health is Health.LOADING and watch is not None:
                    watch.stage("loading")
                if health is Health.LOADING or self.process.lines_seen != lines_seen:
                    lines_seen = self.process.lines_seen
                    soft_deadline = now + t.start
                if now >= began + cap or now >= soft_deadline:
                    limit = "hard cap" if now >= began + cap else "no progress for"
                    seconds = cap if limit == "hard cap" else t.start
                    raise StartFailure(ExitCause(
                        "start_timeout", False,
                        f"not ready after {now - began:.1f}s ({limit} {seconds:g}s)",
                        at=self._clock.wall(),
                    ))
                await self._sleep_or_exit(interval)
                # At most 0.02 s between probes: a start is seen ready within 0.02 s of
                # it (with 0.5 s, a gemma-3-270m load of 1.05 s was seen at 1.54 s; a
                # model loaded on demand keeps its first caller waiting meanwhile).
                interval = min(interval * 1.5, 0.02)
        except BaseException:
            await self.stop()
            raise

    def _feed(self, watch: loading.LoadWatch, seen: int) -> None:
        """Give ``watch`` the lines printed since ``seen`` were (the last 50 at most:
        a phase is never lost, as later lines only move it on)."""
        new = self.process.lines_seen - seen
        if new > 0:
            for text in self.process.recent_lines()[-new:]:
                watch.line(text)

    async def _prove_identity_and_usable(self, spec: LaunchSpec) -> None:
        try:
            ids = await self.client.model_ids(timeout=self._timeouts.probe_timeout)
        except SupervisorError as exc:
            raise StartFailure(self._not_ready(f"/v1/models failed: {exc}")) from exc
        if self.client.model_id not in ids:
            # Someone else's server answers on this socket (only the daemon's user can put
            # one in the private directory): never taken for our child.
            raise StartFailure(ExitCause(
                "stranger", False,
                f"the server on {self.socket} reports models {ids}, not ours",
                at=self._clock.wall(),
            ))
        try:
            if spec.embedding:
                await self.client.embed(["ready"])
            else:
                await self.client.complete("Hello", Sampling(max_tokens=1, temperature=0.0))
        except SupervisorError as exc:
            if self._exit_task.done():
                raise StartFailure(self._cause(self._exit_task.result())) from exc
            raise StartFailure(self._not_ready(f"readiness request failed: {exc}")) from exc
        if not spec.embedding and self.client.dialect.llama_cpp:
            # Once per start: whether its chat template renders tools (an unanswered
            # /props leaves tools refused, never the child unready).
            await self.client.read_chat_caps(timeout=self._timeouts.probe_timeout)

    def _not_ready(self, message: str) -> ExitCause:
        return ExitCause("never_ready", False, message, at=self._clock.wall())

    async def _sleep_or_exit(self, seconds: float) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({sleeper, self._exit_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()

    async def watch(self) -> ExitCause:
        """Return why the child stopped serving: it exited, it hangs (its ``/health``), or
        its outcomes took it out of service (:mod:`supervisor.outcomes`). A child that
        hangs or was taken out of service is condemned first: calls waiting on it end
        as soon as it is stopped, with the cause. The supervisor marks it not ready, then
        stops it."""
        client = self.client
        liveness = asyncio.ensure_future(self._watch_health())
        watches = {liveness}
        if isinstance(client, WatchedClient):
            loop_check = client.loop_answers if client.dialect.llama_cpp else None
            watches.add(asyncio.ensure_future(watch_outcomes(
                client.outcomes, lambda: self._token_probe(client), clock=self._clock,
                policy=self._timeouts.outcomes(self._model_bytes), loop_answers=loop_check,
                cpu_seconds=lambda: process_cpu_seconds(self.pid))))
        try:
            done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.wait(watches)  # their probes are cancelled with them
        # An exit the liveness loop saw is the cause, whatever the outcomes said.
        cause = (liveness if liveness in done else next(iter(done))).result()
        if cause.kind in OUTCOME_KINDS and self._exit_task.done():
            cause = self._cause(self._exit_task.result())
        if cause.kind in OUTCOME_KINDS:
            self._grace = self._timeouts.unresponsive_grace
            _log.warning("child taken out of service", pid=self.pid, cause=cause.kind,
                         reason=cause.message)
        if isinstance(client, WatchedClient) and cause.kind in (*OUTCOME_KINDS, "hung"):
            client.outcomes.condemn(cause)
        return cause

    async def _token_probe(self, client: WatchedClient) -> str | None:
        """The outcome watch's probe; a probe that failed because the process is dying is
        no verdict (the liveness loop reports the exit, with its signal or status)."""
        failure = await client.probe(self._embedding)
        if failure is not None:
            await asyncio.wait({self._exit_task}, timeout=0.5)
            if self._exit_task.done():
                return None
        return failure

    async def _watch_health(self) -> ExitCause:
        """The ``/health`` liveness loop: why the child exited or hangs."""

        async def probe() -> ProbeFailure | None:
            health = await self.client.health(timeout=self._timeouts.probe_timeout)
            return None if health is Health.READY else ProbeFailure("hung", False, health.value)

        def exited() -> ExitCause | None:
            done = self._exit_task.done()
            return self._cause(self._exit_task.result()) if done else None

        return await watch_liveness(probe, activity=self.client.activity, clock=self._clock,
                                    policy=self._timeouts.probes, exited=exited,
                                    pause=self._sleep_or_exit)

    async def stop(self) -> None:
        """Terminate and reap the child, close its client and remove its socket.

        Cancelling the caller still kills and reaps the child (``terminate`` shields
        that) and still removes the socket; the caller's ``CancelledError`` propagates.
        """
        client = self.client
        if isinstance(client, WatchedClient):
            # Taken out of service: its waiting calls end now, naming why, not when the
            # killed child drops their connections (a stuck one ignores SIGTERM).
            client.outcomes.interrupt()
        try:
            if self.client.in_flight == 0:
                # Idle (a drained child): close our keep-alive connections first, so
                # llama-server need not wait out its connection threads at exit (gemma:
                # 62 ms to exit without one open, 162 ms with one; a switch between
                # models with room for one waits for this exit).
                await self.client.aclose()
            await self.process.terminate(self._grace)
            # The exit task ends with the reaped process; wait() neither raises its
            # result's exception nor swallows our own cancellation.
            await asyncio.wait({self._exit_task})
            if not self._exit_task.cancelled():
                self._exit_task.exception()  # retrieved: never "exception never retrieved"
        finally:
            await self.client.aclose()


@dataclass(eq=False, repr=False)
class ProcessLauncher:
    """Launches real child processes for one role.

    Attributes:
        spec: what to launch (model, arguments, environment).
        runtime: llama-server or the bundled runtime.
        clock: the clock of readiness deadlines and exit times.
        ring: where the child's output lines go.
        timeouts: readiness and stop deadlines.
        sink: also given each output line (None: only the ring).
        env: the environment the child's is built on (None: this process's).
        socket_picker: the path of each launch's private socket.
        read_timeout: seconds a call to the child may wait for its answer.
        max_connections: requests open to the child at once (its socket's connections).
        max_idle: connections kept open between requests for reuse (0: none).
        stream_interval: seconds between two reads of a stream once a chunk was relayed
            (0: none; see :class:`supervisor.http._read.Silence`).
        stream_interval_max: the longest such wait, for a slow stream.
        launch_nice: added to the child's nice value at launch (a swap's incoming child),
            0: none.
    """

    spec: LaunchSpec
    runtime: Runtime
    _: KW_ONLY
    clock: Clock
    ring: LogRing
    timeouts: Timeouts = Timeouts()
    sink: LineSink | None = None
    env: dict[str, str] | None = None
    socket_picker: Callable[[], Path] = socket_path
    read_timeout: float = 300.0
    max_connections: int = 64
    max_idle: int = 16
    stream_interval: float = 0.0
    stream_interval_max: float = 0.0
    launch_nice: int = field(default=0, init=False)

    @property
    def api(self) -> ApiShape:
        return self.runtime.api

    def _child_env(self, key: str, private: Path) -> dict[str, str]:
        base = os.environ if self.env is None else self.env
        spin = {} if self.spec.spin_count < 0 else {"GOMP_SPINCOUNT": str(self.spec.spin_count)}
        env = self.runtime.environment({**base, **spin, **dict(self.spec.env)}, key)
        # llama.cpp reads ${XDG_CONFIG_HOME:-~/.config}/llama.cpp/config.ini before its
        # arguments: the child's own 0700 directory holds none.
        env["XDG_CONFIG_HOME"] = str(private)
        return env

    async def _discard(self, spawning: asyncio.Future[ChildProcess], sock: Path) -> None:
        """Stop and reap a process whose launch was cancelled while it was created."""
        try:
            process = await spawning
        except BaseException:  # never started (or the spawn failed): nothing to reap
            remove_socket(sock)
            return
        await process.terminate(self.timeouts.stop_grace)
        remove_socket(sock)

    async def launch(self, on_stage: StageSink | None = None) -> ProcessChild:
        alias = f"llamad-{self.spec.role}-{secrets.token_hex(6)}"
        try:
            sock = self.socket_picker()
        except OSError as exc:  # no private directory: never fall back to a shared one
            raise StartFailure(ExitCause(
                "spawn_error", True, f"no private directory for the child's socket: {exc}",
                at=self.clock.wall())) from exc
        try:
            argv = self.runtime.command(self.spec, socket=sock, alias=alias)
        except ValueError as exc:
            raise StartFailure(ExitCause(
                "usage_error", True, str(exc), at=self.clock.wall())) from exc
        nice = shutil.which("nice") if self.launch_nice else None
        if nice:
            argv = [nice, "-n", str(self.launch_nice), *argv]
        _log.info("launching child", role=self.spec.role, runtime=self.runtime.name,
                  socket=str(sock), argv=" ".join(argv))
        # A file left at the path (a stale socket) would fail the child's bind.
        remove_socket(sock)
        key = child_key()
        # Shielded: cancelled while the process is being created (its pipes connected),
        # the process may exist already, and nobody would stop it (it would outlive this
        # supervisor until the daemon itself exits).
        spawning = asyncio.ensure_future(ChildProcess.spawn(
            argv, ring=self.ring, env=self._child_env(key, sock.parent), sink=self.sink))
        try:
            process = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            reaping = asyncio.ensure_future(self._discard(spawning, sock))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(reaping)
            raise
        except OSError as exc:
            remove_socket(sock)
            raise StartFailure(ExitCause(
                "spawn_error", True, f"cannot start {argv[0]}: {exc.strerror or exc}",
                at=self.clock.wall(),
            )) from exc
        client = WatchedClient(
            ChildAddress.BASE_URL,
            model_id=alias,
            model_name=self.spec.model.name,
            api=self.runtime.api,
            read_timeout=self.read_timeout,
            max_connections=self.max_connections,
            max_idle=self.max_idle,
            stream_interval=self.stream_interval,
            stream_interval_max=self.stream_interval_max,
            child=ChildAddress(str(sock), key),
            now=self.clock.monotonic,
        )
        try:
            model_bytes = self.spec.model.stat().st_size
        except OSError:
            model_bytes = 0
        child = ProcessChild(process, client, sock, self.clock, self.timeouts,
                             model_bytes=model_bytes, embedding=self.spec.embedding)
        if on_stage is not None:
            on_stage("loading")
        await child.wait_ready(self.spec, on_stage)
        return child
