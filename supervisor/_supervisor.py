"""The supervisor: keeps one child alive under a state machine.

Life of a child (see :mod:`supervisor._states` for the table)::

    idle ─► starting ─► running ─┐
               ▲  │              │ crash / hang / taken out of service by its outcomes
               │  ├─(transient)─►backoff ──(delay)──► starting
               │  └─(permanent or breaker trips)─► failed ──(reset / cool-down)──► starting
    any ─(stop)─► stopped ─(start)─► starting

A child that failed is marked not ready (backoff or failed) *before* it is stopped, so no
call reaches it during its stop grace (a stuck child may ignore SIGTERM); the child's
watch (:meth:`~supervisor._child.ProcessChild.watch`) judges it by ``/health`` and by
its outcomes (:mod:`supervisor.outcomes`).

Every state change is published as a :class:`StateChange` to subscribers (health,
metrics, logs). Time comes from an injected :class:`Clock`, randomness from an injected
``random.Random``, and children from an injected :class:`Launcher`, so every edge is
unit-tested without processes or real sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from . import _loading as loading
from ._backoff import CircuitBreaker, RestartPolicy
from ._child import Launcher, LiveChild, StartFailure
from ._client import InferenceClient
from ._clock import Clock, SystemClock
from ._drain import drain
from ._exits import ExitCause
from ._states import State, check_transition
from ._swap import (
    ProgressSink,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    SwapRefusedError,
)
from .errors import ChildNotReadyError, InvalidModelError


@dataclass(frozen=True)
class StateChange:
    """One transition, as published to subscribers."""

    role: str
    old: State
    new: State
    at: float
    pid: int
    cause: ExitCause | None


Listener = Callable[[StateChange], None]
Validator = Callable[[], None]
"""Checks the model before each launch; raises :class:`InvalidModelError`."""


class Supervisor:
    """Runs one child (generation or embedding) and restarts it when it fails.

    Args:
        role: "generation" or "embedding".
        launcher: starts a child and returns it once ready.
        validate: checks the model file before each launch (permanent failure if bad).
        policy: backoff and circuit-breaker settings.
        clock: time source; the real one by default.
        rng: randomness for jitter.
    """

    def __init__(
        self,
        role: str,
        launcher: Launcher,
        *,
        validate: Validator | None = None,
        policy: RestartPolicy | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.role = role
        self.launcher = launcher
        self.policy = policy or RestartPolicy()
        self.breaker = CircuitBreaker(self.policy)
        self._validate = validate
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._state = State.IDLE
        self._listeners: list[Listener] = []
        self._child: LiveChild | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._log = structlog.get_logger("llamad.supervisor").bind(role=role)
        self.restarts = 0
        self.last_exit: ExitCause | None = None
        self.running_since: float | None = None
        self._starting_since: float | None = None
        self._start_seconds = 0.0  # how long the last successful start took (0: none yet)
        self._loading: loading.LoadWatch | None = None  # the start under way
        self.retry_at: float | None = None
        self._stopping = False
        self._swap_lock = asyncio.Lock()
        # A ready child handed over by swap(), with the launcher and validator that made it.
        self._adopt: tuple[LiveChild, Launcher, Validator | None] | None = None
        self._adopted: asyncio.Future[LiveChild | None] | None = None
        self._swap_signal = asyncio.Event()

    # -- observation ------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def pid(self) -> int:
        """The child's pid, or 0 when none is alive."""
        return self._child.pid if self._child is not None else 0

    @property
    def socket(self) -> str:
        """The running child's UNIX socket path ("" when none runs, or for an endpoint)."""
        return (self._child.socket if self._child is not None and self._state is State.RUNNING
                else "")

    @property
    def client(self) -> InferenceClient:
        """The running child's client.

        Raises:
            ChildNotReadyError: not running; carries a retry hint.
        """
        child = self._child
        if self._state is not State.RUNNING or child is None:
            progress = self.load_progress()
            raise ChildNotReadyError(self.role, self._state.value, self.retry_after(),
                                     progress.describe() if progress is not None else "")
        return child.client

    def load_progress(self) -> loading.LoadProgress | None:
        """How far the start under way is (None: no start under way): its phase, seconds
        so far, and how long the last start took (:mod:`supervisor._loading`)."""
        watch = self._loading
        if self._state is not State.STARTING or watch is None:
            return None
        return watch.progress(self._start_seconds)

    def uptime(self) -> float:
        """Seconds since the child became running; 0 when not running."""
        if self._state is not State.RUNNING or self.running_since is None:
            return 0.0
        return self._clock.monotonic() - self.running_since

    def retry_after(self) -> float | None:
        """Seconds until the child may be usable again; None when nobody knows.

        A start is expected to take as long as the last successful one (1 s before any):
        a client told to come back then finds the child running, not one second later.
        """
        now = self._clock.monotonic()
        start = self._start_seconds or 1.0
        if self._state is State.BACKOFF and self.retry_at is not None:
            return max(0.0, self.retry_at - now) + start
        if self._state is State.STARTING:
            progress = self.load_progress()
            if progress is not None:  # its phase, or what is left of its last start
                return progress.retry_after()
            began = self._starting_since if self._starting_since is not None else now
            return max(0.1, began + start - now)
        if self._state is State.FAILED:
            half_open = self.breaker.half_open_at()
            return None if half_open is None else max(0.0, half_open - now) + 1.0
        return None

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` on every state change; returns an unsubscribe function.

        Listeners run synchronously inside the transition and must not block or raise.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def wait_for(self, *states: State, timeout: float | None = None) -> State:
        """Wait until the state is one of ``states``; return it.

        Raises:
            TimeoutError: ``timeout`` (real seconds) passed first.
        """
        async def _wait() -> State:
            while self._state not in states:
                changed = self._changed
                await changed.wait()
            return self._state

        return await asyncio.wait_for(_wait(), timeout)

    # -- control ----------------------------------------------------------------------

    def start(self) -> None:
        """Begin supervising (from idle or stopped). Returns at once; see :meth:`wait_for`."""
        if self._task is not None and not self._task.done():
            return
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"supervise-{self.role}")

    def reconfigure(self, launcher: Launcher, validate: Validator | None) -> None:
        """Use another launcher and validator from the next start on (only while stopped
        or never started; a running child is replaced with :meth:`swap`)."""
        if self._task is not None and not self._task.done():
            raise SwapRefusedError("reconfigure needs a stopped supervisor; use swap()")
        self.launcher = launcher
        self._validate = validate
        self.breaker.reset()

    def reset(self) -> None:
        """Close the breaker and retry now: cuts short a backoff delay or a failed wait.

        A no-op while starting or running (the breaker is still reset).
        """
        self.breaker.reset()
        self._wake.set()

    async def stop(self) -> None:
        """Stop supervising; stop and reap the child. Idempotent.

        Cancelling the caller does not leave the child running: the stop goes on in the
        background (the caller's cancellation still propagates).
        """
        task = self._task
        if task is None:
            if self._state is State.IDLE:
                self._set(State.STOPPED)
            return
        self._task = None
        self._stopping = True
        task.cancel()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                raise  # our caller was cancelled; the task finishes the stop by itself

    # -- the loop -----------------------------------------------------------------------

    def _set(self, new: State, cause: ExitCause | None = None) -> None:
        old = self._state
        check_transition(old, new)
        self._state = new
        change = StateChange(self.role, old, new, self._clock.wall(), self.pid, cause)
        self._changed.set()
        self._changed = asyncio.Event()
        level = "warning" if new in (State.BACKOFF, State.FAILED) else "info"
        getattr(self._log, level)(
            "child state", old=old.value, new=new.value, pid=self.pid,
            cause=cause.kind if cause else None,
            reason=cause.message if cause else None,
        )
        for listener in list(self._listeners):
            listener(change)

    async def _run(self) -> None:
        try:
            while True:
                self._starting_since = self._clock.monotonic()
                self._set(State.STARTING)
                cause = await self._one_life()
                self.running_since = None
                self.last_exit = cause
                now = self._clock.monotonic()
                if self.breaker.record_failure(now, permanent=cause.permanent):
                    self.retry_at = self.breaker.half_open_at()
                    self._set(State.FAILED, cause)
                    await self._stop_child()
                    woken = await self._wait(
                        None if self.retry_at is None
                        else self.retry_at - self._clock.monotonic())
                    if not woken:
                        self.breaker.half_open()
                else:
                    delay = self.policy.delay(self.breaker.failures - 1, self._rng)
                    self.retry_at = now + delay
                    self._set(State.BACKOFF, cause)
                    await self._stop_child()
                    await self._wait(max(0.0, self.retry_at - self._clock.monotonic()))
                self.retry_at = None
                if self._adopt is None:
                    self.restarts += 1
        finally:
            child, self._child = self._child, None
            if child is not None:
                await asyncio.shield(child.stop())
            if self._adopt is not None:  # a swap handed over a child nobody will run
                adopted, self._adopt = self._adopt, None
                await asyncio.shield(adopted[0].stop())
                self._ack_adoption(None)
            if self._stopping:
                self._stopping = False
                self._set(State.STOPPED)

    async def _stop_child(self) -> None:
        """Stop and reap the child that just failed, once it is no longer served: the
        state change before this already refuses new calls (a child that ignores SIGTERM
        is not given calls during its grace)."""
        child = self._child
        if child is not None:
            await child.stop()
        self._child = None

    def _take_adopted(self) -> LiveChild | None:
        if self._adopt is None:
            return None
        child, self.launcher, self._validate = self._adopt
        self._adopt = None
        self.breaker.reset()  # a new configuration starts with a clean record
        return child

    def _ack_adoption(self, old: LiveChild | None) -> None:
        if self._adopted is not None and not self._adopted.done():
            self._adopted.set_result(old)

    async def _one_life(self) -> ExitCause:
        """Start (or adopt) a child, run it until it fails; return why it failed. The
        child is left to the caller to stop, after it marked it not ready."""
        adopted = self._take_adopted()
        if adopted is not None:
            self._child = adopted
            self._ack_adoption(None)
        else:
            # Watched from here (a large file's validation is part of its start); the
            # launcher finds the watch in the context (supervisor._loading).
            self._loading = loading.LoadWatch(self._clock.monotonic)
            watched = loading.WATCH.set(self._loading)
            try:
                if self._validate is not None:
                    await asyncio.to_thread(self._validate)
                self._child = await self.launcher.launch()
            except InvalidModelError as exc:
                return ExitCause("invalid_model", True, str(exc), at=self._clock.wall())
            except StartFailure as exc:
                return exc.cause
            finally:
                loading.WATCH.reset(watched)
                self._loading = None
        self.running_since = self._clock.monotonic()
        if self._starting_since is not None:
            self._start_seconds = self.running_since - self._starting_since
        self._set(State.RUNNING)
        while True:
            watch = asyncio.ensure_future(self._child.watch())
            swapped = asyncio.ensure_future(self._swap_signal.wait())
            try:
                await asyncio.wait({watch, swapped}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                # Stopped: the watch ends with its child. Left running, an endpoint's
                # liveness probe went on against the closed client ("client has been
                # closed", an unretrieved task exception and an unclosed socket).
                watch.cancel()
                raise
            finally:
                swapped.cancel()
            if watch.done():
                cause = watch.result()
                break
            # A swap: the new child takes over now; the old one is the swapper's to drain.
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            self._swap_signal.clear()
            old = self._child
            new = self._take_adopted()
            if new is None:
                continue
            self._child = new
            self.running_since = self._clock.monotonic()
            self._ack_adoption(old)
            self._log.info("child swapped", old_pid=old.pid, new_pid=new.pid)
        if self._clock.monotonic() - self.running_since >= self.policy.stable_after:
            self.breaker.record_stable()
        return cause  # the child is stopped by the caller, once it is marked not ready

    # -- swaps ----------------------------------------------------------------------------

    async def swap(
        self,
        launcher: Launcher,
        *,
        validate: Validator | None = None,
        drain_timeout: float = 30.0,
        progress: ProgressSink | None = None,
    ) -> None:
        """Replace the child, make-before-break.

        The new child starts beside the old one and must become ready; only then does it
        take over (atomically: the next :attr:`client` is the new child's). Calls already
        running on the old child get ``drain_timeout`` seconds to finish, then it stops.
        If the old child is down (backing off or failed) when the new one is ready, the
        new one simply takes over. Stages are reported to ``progress``, from
        ``launching`` on.

        The caller has checked the new model (the ``validating`` stage is its:
        :meth:`daemon.models.model.Model.replace` checks the file and the memory once, for every
        path); ``validate`` is what checks it again before each later restart.

        Cancellation: before the take-over, cancelling stops the new child and leaves
        the old one serving; after it, the swap is complete and only the drain is cut
        short (the old child is still stopped, in the background).

        Raises:
            SwapInProgressError: another swap of this child is running.
            SwapRefusedError: the supervisor is not running (never started, or stopped).
            SwapFailedError: the new child never became ready; nothing changed.
        """
        report = progress or (lambda _: None)
        if self._swap_lock.locked():
            raise SwapInProgressError(f"a swap of the {self.role} child is already running")
        async with self._swap_lock:
            if self._task is None or self._task.done():
                raise SwapRefusedError(f"the {self.role} child is stopped; start it first")
            report(SwapProgress("launching"))
            try:
                new = await launcher.launch(on_stage=lambda s: report(SwapProgress(s)))
            except StartFailure as exc:
                report(SwapProgress("failed", exc.cause.message, exc.cause))
                raise SwapFailedError(exc.cause) from exc
            report(SwapProgress("swapping", f"new child pid {new.pid}"))
            try:
                old = await self._hand_over(new, launcher, validate)
            except BaseException:
                if self._adopt is not None and self._adopt[0] is new:
                    self._adopt = None
                    await asyncio.shield(new.stop())
                raise
        if old is None:
            report(SwapProgress("done", "the old child was not running"))
            return
        report(SwapProgress("draining", f"old child pid {old.pid}"))
        await asyncio.shield(self._drain(old, drain_timeout))
        report(SwapProgress("done"))

    async def _hand_over(
        self, new: LiveChild, launcher: Launcher, validate: Validator | None
    ) -> LiveChild | None:
        """Give ``new`` to the supervision loop; return the child it replaced, if any."""
        # A restart of the old configuration may be in flight: let it settle first.
        settled = await self.wait_for(State.RUNNING, State.BACKOFF, State.FAILED, State.STOPPED)
        if settled is State.STOPPED:
            await new.stop()
            raise SwapRefusedError(f"the {self.role} child was stopped during the swap")
        loop = asyncio.get_running_loop()
        self._adopted = loop.create_future()
        self._adopt = (new, launcher, validate)
        if self._state is State.RUNNING:
            self._swap_signal.set()
        else:
            self._wake.set()  # cut the backoff or failed wait short; the loop adopts
        return await self._adopted

    async def _drain(self, old: LiveChild, timeout: float) -> None:
        """Let calls on ``old`` finish (up to ``timeout`` s), then stop it."""
        left = await drain(lambda: old.client.in_flight, timeout, self._clock)
        if left:
            self._log.warning("drain timed out", pid=old.pid, in_flight=left)
        await old.stop()

    async def _wait(self, seconds: float | None) -> bool:
        """Sleep ``seconds`` (forever if None) unless :meth:`reset` wakes us first.

        Returns:
            True if :meth:`reset` woke us, False if the time passed.
        """
        self._wake.clear()
        waiter = asyncio.ensure_future(self._wake.wait())
        sleeper = asyncio.ensure_future(
            self._clock.sleep(seconds) if seconds is not None else asyncio.Event().wait()
        )
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
        return self._wake.is_set()
