"""One model, one owner: :class:`Model` alone holds a model's state and makes its changes.

What the daemon keeps per model — its inference mode (a supervised child, an external
endpoint, or disabled), its setup (launch spec, runtime, GGUF facts), the previous setup
and last swap, the last error, its admission queue and its supervisor — is read through
properties and changed only by the model's own methods, each state change checked
against an explicit transition table (:mod:`daemon.models._states`). Swaps
(:mod:`daemon.models.swaps`), mode switches (:mod:`daemon.models.modes`), reloads
(:mod:`daemon.ops.reload`) and planned recycling (:mod:`daemon.models.recycle`) decide *what* to
run; they all carry it out through one make-before-break primitive, :meth:`Model.replace`:

1. refuse at once what cannot work: another operation running (SwapInProgressError), a
   new child that does not fit in memory beside the serving one (SwapRefusedError);
2. validate the new model file, once (the ``validating`` stage);
3. launch it beside the old one and wait for readiness (the supervisor's swap: the same
   readiness gate, backoff and breaker as any start);
4. cut over, atomically: the next call gets the new one; mode, setup and admission
   change together;
5. drain the old one, bounded by ``swap.drain_timeout``, then stop it.

On any failure before the cut-over the old one keeps serving, untouched. The paths that
have no old child to keep — a disabled role switched on — or no room beside it — a swap
asked to stop the old child first — run the same steps minus the overlap (the steps, which
drive the model's supervisor for it, are in :mod:`daemon.models._replace`). Going out of service
(a switch to disabled, the pool's eviction) is :meth:`Model.unload`, with the same drain
(:func:`supervisor.drain`).

The registry (:class:`daemon.models.pool.Pool`) holds one ``Model`` per catalog model, each
role's own among them; ``daemon.models.children.ManagedChild`` is an old alias.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import structlog

from supervisor import (
    ChildNotReadyError,
    Clock,
    EndpointClient,
    EndpointSpec,
    IllegalTransitionError,
    Launcher,
    LogRing,
    State,
    StateChange,
    Supervisor,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    SwapRecord,
    SwapRefusedError,
    SystemClock,
    drain,
)

from ..config.inference_mode import InferenceMode, Mode
from ..errors import Disabled, FailedPrecondition
from . import memory
from ._replace import (
    Handover,
    ProgressSink,
    Target,
    ahead_for,
    beside,
    fits,
    handover_settings,
    load,
    serve_waiting,
    slots_for,
    stop_first,
    validate,
)
from ._states import ModelState, moved, status_of
from .admission import Admission
from .backend import ChildBackend, DisabledBackend, EndpointBackend, InferenceBackend

if TYPE_CHECKING:
    from ..config import ChildConfig
    from .children import Setup
    from .lane_instance import LaneInstance

__all__ = ["Handover", "Model", "Target", "ahead_for", "handover_settings", "slots_for"]

_log = structlog.get_logger("llamad.model")


Listener = Callable[["Model"], None]


def _ignore(_: SwapProgress) -> None:
    return None


class Model:
    """One model (today: one role's), the only writer of its state.

    Args:
        role: what it serves (a :class:`~daemon.config.Role`).
        config: the role's configuration in force.
        setup: the embedded child's setup (None while no model was ever configured).
        ring: the child's log lines.
        supervisor: runs the child or watches the endpoint; the model drives its
            lifecycle (start, stop, reset, swap), nobody else.
        launchers: make the launcher for a setup, with the swap readiness deadline.
        endpoints: make the launcher of an endpoint, with the swap readiness deadline.
        admission: its slots and queue.
        mode: where its inference runs.
        handover: how a replacement takes over.
        clock: time source (tests inject a manual one).
        available: bytes the system can give a new child (None: unknown); by default
            :func:`daemon.models.memory.memory_available`.
    """

    def __init__(
        self,
        role: str,
        config: ChildConfig,
        setup: Setup | None,
        ring: LogRing,
        supervisor: Supervisor,
        *,
        launchers: Callable[[Setup], Launcher],
        endpoints: Callable[[EndpointSpec], Launcher],
        admission: Admission,
        mode: Mode,
        handover: Handover | None = None,
        clock: Clock | None = None,
        available: Callable[[], int | None] | None = None,
    ) -> None:
        self.role = role
        self._config = config
        self._current = setup
        self._previous: Setup | None = None
        self._last_swap: SwapRecord | None = None
        self._last_error = ""
        self.ring: Final = ring
        self.supervisor: Final = supervisor  # others observe it; only the model drives it
        self._launchers = launchers
        self._endpoints = endpoints
        self.admission: Final = admission
        self._mode = mode
        self._handover = handover or Handover()
        self._clock = clock or SystemClock()
        self._available = available
        self._state = ModelState.UNLOADED
        self._unloaded_for = ""  # why the pool unloaded it, while it stays unloaded
        self._began, self._reason = 0.0, ""  # of the replace() running, for its record
        self._switching = asyncio.Lock()  # held by replace() and unload(): never interleave
        self._listeners: list[Listener] = []
        self.lane_instance: LaneInstance | None = None  # its batch/background child
        supervisor.subscribe(self._on_child)

    # -- observation ------------------------------------------------------------------

    @property
    def state(self) -> ModelState:
        return self._state

    @property
    def status(self) -> str:
        """What an operator is told: unloaded, loading, ready, draining or failed (the
        model's own state, and while it serves, its supervisor's)."""
        return status_of(self._state, self.supervisor.state)

    @property
    def unloaded_by_pool(self) -> bool:
        """Unloaded by the pool (evicted, idle past its ttl, UnloadModel): it loads again
        on demand, unlike a model disabled by its mode."""
        return self._state is ModelState.UNLOADED and bool(self._unloaded_for)

    @property
    def config(self) -> ChildConfig:
        return self._config

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def current(self) -> Setup | None:
        """The embedded child's setup (None while no model was ever configured)."""
        return self._current

    @property
    def previous(self) -> Setup | None:
        """The setup before the last swap (what a rollback returns to)."""
        return self._previous

    @property
    def last_swap(self) -> SwapRecord | None:
        return self._last_swap

    @property
    def last_error(self) -> str:
        """The latest failure: a child's exit, an endpoint's, or a failed swap or switch."""
        return self._last_error

    @property
    def switching(self) -> bool:
        """A swap, mode switch or unload is running."""
        return self._switching.locked()

    @property
    def setup(self) -> Setup:
        """The embedded child's setup.

        Raises:
            FailedPrecondition: no model has been configured for this role.
        """
        if self._current is None:
            raise FailedPrecondition(
                f"no {self.role} model is configured: set {self.role}.model, or give "
                "model_path")
        return self._current

    @property
    def serving_pid(self) -> int:
        """The child process serving now (0: none, or an endpoint)."""
        return self.supervisor.pid

    def backend(self) -> InferenceBackend:
        """What serves the model now: the one place a mode becomes an implementation.

        Raises:
            supervisor.ChildNotReadyError: the child or endpoint is not ready.
        """
        if self._mode.kind is InferenceMode.DISABLED:
            return DisabledBackend(self.role, self._unloaded_for)
        client = self.supervisor.client
        if isinstance(client, EndpointClient):
            return EndpointBackend(client)
        return ChildBackend(client, self._current)

    def busy(self) -> int:
        """Calls running on the model: admitted ones, or HTTP requests on its client."""
        requests = 0
        if self.supervisor.state is State.RUNNING:
            with contextlib.suppress(ChildNotReadyError):  # stopped in between: none
                requests = self.supervisor.client.in_flight
        lower = self.lane_instance.busy() if self.lane_instance is not None else 0
        return max(self.admission.in_flight, requests) + lower

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` after each change of what serves the model (a cut-over, an
        unload); it runs synchronously and must not block or raise."""
        self._listeners.append(listener)

    async def hash_model(self) -> None:
        """Compute the model file's SHA-256 in a thread (for Status); never raises."""
        if self._current is not None:
            await self._current.model.hash_in_background()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start serving in the configured mode (a disabled model stays unloaded).
        Returns at once: the supervisor brings the child up, and says when it is ready."""
        if self._mode.kind is InferenceMode.DISABLED:
            return
        self._move(ModelState.SERVING)
        self.supervisor.start()

    async def stop(self) -> None:
        """Shut down with the daemon: stop and reap the child. Idempotent and final; an
        operation still running finds the model stopped and ends without changing it."""
        if self._state is not ModelState.STOPPED:
            self._move(ModelState.STOPPED)
        if self.lane_instance is not None:
            await self.lane_instance.close()
        await self.supervisor.stop()

    def reset(self) -> None:
        """Close the breaker and retry now (:meth:`supervisor.Supervisor.reset`).

        Raises:
            Disabled: the model is disabled.
        """
        if self._mode.kind is InferenceMode.DISABLED:
            raise Disabled(f"{self.role} is disabled; ControlService/SetMode enables it")
        self.supervisor.reset()

    def configure(self, config: ChildConfig, setup: Setup | None = None) -> None:
        """Take new settings that need no new child: the configuration in force (its
        queue ahead applies now) and, while not embedded, the setup a later switch to
        embedded mode runs (``setup``; None: keep the current one).

        Raises:
            IllegalTransitionError: ``setup`` given while embedded (a running child's
                setup changes only through :meth:`replace`).
        """
        if setup is not None and self._mode.kind is InferenceMode.EMBEDDED:
            what = "the embedded setup changes only through replace()"
            _log.error("illegal model change", role=self.role, state=self._state.value,
                       error=what)
            raise IllegalTransitionError(f"{self.role}: {what}")
        self._config = config
        if setup is not None:
            self._current = setup
        self.admission.resize(self.admission.limit,
                               ahead_for(self._mode, self._current, config))

    def set_queue_size(self, size: int) -> None:
        """Calls that may wait for a slot (``limits.queue_size``)."""
        self.admission.queue_size = size

    # -- the make-before-break primitive ----------------------------------------------

    def target_for(self, setup: Setup) -> Target:
        """A :class:`Target` running ``setup`` in embedded mode."""
        return Target(Mode(InferenceMode.EMBEDDED), setup, self._launchers(setup),
                      setup.model.validate)

    def target_endpoint(self, spec: EndpointSpec) -> Target:
        """A :class:`Target` serving from the endpoint ``spec``."""
        return Target(Mode(InferenceMode.ENDPOINT, spec), None, self._endpoints(spec), None)

    async def replace(self, target: Target, *, reason: str = "",
                      stop_old_first: bool = False,
                      progress: ProgressSink | None = None) -> SwapRecord | None:
        """Bring ``target`` up and make it what serves, make-before-break (see the module
        docstring); report each stage to ``progress``.

        From unloaded (a disabled model switched on), calls are still refused until the
        target is ready; if it never is, the model stays unloaded. With
        ``stop_old_first``, a new child that does not fit beside the old one replaces it
        after the old one stopped (the model is unavailable meanwhile; on failure the old
        one is started again).

        Returns:
            The record of a swap between two children (kept as :attr:`last_swap`); None
            for a mode switch.

        Cancellation: before the cut-over the new one is dropped and the old one serves
        on; after it, only the wait for the old one's calls is cut short (it is still
        stopped, in the background).

        Raises:
            supervisor.SwapInProgressError: another swap, switch or unload is running.
            supervisor.SwapRefusedError: the new child does not fit in memory (and
                ``stop_old_first`` is unset or does not apply), or the model is shut down.
            supervisor.SwapFailedError: the new one failed validation or never became
                ready; nothing changed (its cause is :attr:`last_error`).
        """
        report = progress or _ignore
        if self._switching.locked():
            raise SwapInProgressError(f"a swap or mode switch of the {self.role} role is "
                                      "already running")
        async with self._switching:
            if self._state is ModelState.STOPPED:
                raise SwapRefusedError(f"the {self.role} model is shut down")
            self._began, self._reason = self._clock.monotonic(), reason
            earlier = self._last_swap
            swap = (self._mode.kind is InferenceMode.EMBEDDED
                    and target.mode.kind is InferenceMode.EMBEDDED)
            fresh = self._state is ModelState.UNLOADED
            available = (self._available or memory.memory_available)()
            side_by_side = fits(target, role=self.role, swap=swap and not fresh,
                                stop_old_first=stop_old_first, available=available)
            self._move(ModelState.LOADING if fresh else ModelState.SWAPPING)
            sup = self.supervisor

            def cut_over(resize: bool) -> None:
                self._cut_over(target, resize=resize)

            try:
                await validate(target, report, self._clock)
                if fresh:
                    await load(sup, target, report=report, cut_over=cut_over,
                               clock=self._clock)
                elif side_by_side:
                    await beside(sup, self.admission, target, local=swap,
                                 handover=self._handover, report=report,
                                 cut_over=cut_over, resize=self._resize)
                else:
                    old = self._current.model.validate if self._current is not None else None
                    await stop_first(sup, target, old, report=report, cut_over=cut_over,
                                     clock=self._clock)
            except SwapFailedError as exc:
                self._last_error = exc.cause.message
                raise
            finally:
                self._settle()
            record = self._last_swap
            if record is None or record is earlier:  # a mode switch: no swap record
                return None
            # Recorded at the cut-over; its duration now includes the drain.
            self._last_swap = dataclasses.replace(
                record, seconds=self._clock.monotonic() - self._began)
            return self._last_swap

    async def unload(self, progress: ProgressSink | None = None, *, why: str = "",
                     queued: Callable[[], int] | None = None) -> None:
        """Go out of service: refuse new calls now (the mode becomes disabled), let the
        running ones finish (bounded by the drain timeout), then stop the child (or close
        the endpoint's connections). ``why`` (the pool's unloads: eviction, ttl, an
        admin's UnloadModel) makes the refusal of calls still waiting say so, retryable,
        instead of "disabled".

        ``queued``: first serve, still in service, the calls running, those waiting in
        its queue and the ``queued()`` more on their way into it, within the same drain
        timeout (the pool's eviction: it stops other calls from coming meanwhile, so
        they wait for the model's next load instead; a call woken from the queue is never
        refused by the mode changing under it).

        Cancellation: the drain and stop go on in the background.

        Raises:
            supervisor.SwapInProgressError: another swap, switch or unload is running.
        """
        report = progress or _ignore
        if self._switching.locked():
            raise SwapInProgressError(f"a swap or mode switch of the {self.role} role is "
                                      "already running")
        async with self._switching:
            if queued is not None:
                await serve_waiting(self.busy, self.admission, queued, report,
                                    timeout=self._handover.drain_timeout, clock=self._clock)
            self._move(ModelState.DRAINING)
            self._mode = Mode(InferenceMode.DISABLED)
            self._unloaded_for = why
            self._last_error = ""
            self._notify()
            report(SwapProgress("swapping", "new calls are refused from now on"))
            report(SwapProgress("draining", f"{self.busy()} calls running"))
            await asyncio.shield(self._drain_and_stop())
            self._notify()
            report(SwapProgress("done"))

    async def _drain_and_stop(self) -> None:
        left = await drain(self.busy, self._handover.drain_timeout, self._clock)
        if left:
            _log.warning("drain timed out; stopping anyway", role=self.role, in_flight=left)
        await self.supervisor.stop()
        if self._state is ModelState.DRAINING:  # else the daemon shut it down meanwhile
            self._move(ModelState.UNLOADED)

    def _cut_over(self, target: Target, *, resize: bool = True) -> None:
        """``target`` serves from now on: mode, setup and admission change together."""
        swap = (self._mode.kind is InferenceMode.EMBEDDED
                and target.mode.kind is InferenceMode.EMBEDDED)
        old = self._current
        if target.setup is not None and target.setup is not old:
            if swap:
                self._previous = old
            self._current = target.setup
        if swap and old is not None and target.setup is not None:
            self._last_swap = SwapRecord(self.role, str(old.spec.model),
                                         str(target.setup.spec.model), self._clock.wall(),
                                         self._reason, self._clock.monotonic() - self._began)
        if not swap:  # a mode switch starts with a clean record
            self._last_error = ""
        self._mode = target.mode
        self._unloaded_for = ""
        if self._state is ModelState.LOADING:
            self._move(ModelState.SERVING)
        if resize:
            self._resize()
        self._notify()

    def _settle(self) -> None:
        """An operation ended: back to serving (or unloaded, if a load never got there);
        a model the daemon shut down meanwhile stays stopped."""
        if self._state is ModelState.SWAPPING:
            self._move(ModelState.SERVING)
        elif self._state is ModelState.LOADING:
            self._move(ModelState.UNLOADED)

    def _resize(self) -> None:
        self.admission.resize(slots_for(self._mode, self._current, self._config),
                               ahead_for(self._mode, self._current, self._config))

    # -- state --------------------------------------------------------------------------

    def _move(self, new: ModelState) -> None:
        """The one way the state changes: checked against the table, logged."""
        self._state = moved(self.role, self._state, new)

    def _notify(self) -> None:
        for listener in list(self._listeners):
            listener(self)

    def _on_child(self, change: StateChange) -> None:
        if change.cause is not None:  # set on the way into backoff or failed
            self._last_error = change.cause.message
