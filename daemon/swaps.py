"""Model swaps, as the daemon offers them: what to swap to, whether it fits, rollback.

Only a role in embedded mode has a model to swap; :mod:`daemon.modes` switches modes.

The make-before-break mechanics live in :meth:`supervisor.Supervisor.swap`; this module
decides the new :class:`~daemon.children.Setup` (a new model, other arguments, or the
previous setup for a rollback), checks that the new child fits in memory beside the old
one, takes the stop-old-first path when asked to, and records the swap for Status.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from supervisor import (
    ExitCause,
    InvalidModelError,
    State,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    SwapRecord,
    SwapRefusedError,
    can_lower_niceness,
    renice,
)

from .children import ManagedChild, Setup, ahead_for, make_setup
from .errors import InvalidArgument
from .inference_mode import InferenceMode

_log = structlog.get_logger("llamad.swaps")

# Beyond weights and KV cache: compute buffers, runtime, thread stacks.
_OVERHEAD_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class SwapPlan:
    """What the caller asked for, validated."""

    model: str = ""
    extra_args: tuple[str, ...] | None = None
    ctx_size: int | None = None
    rollback: bool = False
    stop_old_first: bool = False
    reason: str = ""


def memory_available() -> int | None:
    """Bytes the system can give a new process: MemAvailable, capped by a cgroup v2
    memory.max when one is set. None if unknown."""
    available: int | None = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((ln.strip()[3:] for ln in fh if ln.startswith("0::")), None)
        if path is not None:
            base = f"/sys/fs/cgroup{path}"
            with open(f"{base}/memory.max") as fh:
                limit = fh.read().strip()
            if limit != "max":
                with open(f"{base}/memory.current") as fh:
                    headroom = int(limit) - int(fh.read().strip())
                available = headroom if available is None else min(available, headroom)
    except (OSError, ValueError, StopIteration):
        pass
    return available


def memory_needed(setup: Setup) -> int:
    """An estimate of a child's resident memory: weights, KV cache, overhead."""
    info = setup.model.info
    if info is None:
        return 0
    slots = max(1, setup.runtime.max_concurrency(setup.spec))
    ctx = setup.spec.ctx_size or info.context_length or 2048
    return info.size + info.kv_cache_bytes(ctx * slots) + _OVERHEAD_BYTES


class SwapManager:
    """Runs swaps for the daemon's children."""

    def __init__(self, children: dict[str, ManagedChild], drain_timeout: float,
                 on_swapped: Callable[[ManagedChild], None] | None = None, *,
                 handover_hold: float = 0.0, launch_nice: int = 0) -> None:
        self._children = children
        self._drain_timeout = drain_timeout
        self._handover_hold = handover_hold
        # The incoming child loads (vocabulary, weights: ~1 s of CPU for gemma-3-270m)
        # beside the serving one on the same cores; niced, it takes what the serving child
        # leaves. It gets the daemon's own nice value back at the switch, which needs the
        # right to lower a nice value (root, CAP_SYS_NICE or RLIMIT_NICE: the unit's
        # LimitNICE=); without it the incoming child is not niced at all.
        self._base_nice = os.getpriority(os.PRIO_PROCESS, 0)
        self._launch_nice = launch_nice if launch_nice and can_lower_niceness(
            self._base_nice) else 0
        if launch_nice and not self._launch_nice:
            _log.info("swap.launch_nice unused: this process may not lower a nice value "
                      "again (run with LimitNICE=+0 or CAP_SYS_NICE)", launch_nice=launch_nice)
        self._on_swapped = on_swapped

    @staticmethod
    def _check(child: ManagedChild) -> None:
        if child.mode.kind is not InferenceMode.EMBEDDED:
            raise SwapRefusedError(
                f"the {child.role} role is in {child.mode.kind} mode: Swap replaces a "
                "supervised child's model; ControlService/SetMode switches modes")
        if child.switching.locked():
            raise SwapInProgressError(f"a swap or mode switch of the {child.role} role is "
                                      "already running")

    def _target(self, child: ManagedChild, plan: SwapPlan) -> Setup:
        if plan.rollback:
            if plan.model or plan.extra_args is not None or plan.ctx_size is not None:
                raise InvalidArgument("rollback takes no model_path, extra_args or ctx_size")
            if child.previous is None:
                raise InvalidArgument(f"the {child.role} child has not been swapped: "
                                      "nothing to roll back to")
            previous = child.previous
            # Re-read the file: it may have changed since.
            return make_setup(child.role, previous.spec.model, previous.runtime, child.config,
                              ctx_size=previous.spec.ctx_size,
                              extra_args=previous.spec.extra_args)
        if not plan.model and plan.extra_args is None and plan.ctx_size is None:
            raise InvalidArgument("nothing to swap: give model_path, extra_args or ctx_size")
        current = child.setup
        return make_setup(
            child.role, plan.model or current.spec.model, current.runtime, child.config,
            ctx_size=current.spec.ctx_size if plan.ctx_size is None else plan.ctx_size,
            extra_args=current.spec.extra_args if plan.extra_args is None else plan.extra_args,
        )

    async def swap(self, role: str, plan: SwapPlan,
                   progress: Callable[[SwapProgress], None]) -> SwapRecord:
        """Swap ``role``'s child according to ``plan``; report stages to ``progress``.

        Raises:
            InvalidArgument: the plan is inconsistent.
            supervisor.SwapInProgressError, supervisor.SwapRefusedError,
            supervisor.SwapFailedError: see :meth:`supervisor.Supervisor.swap`.
        """
        child = self._children[role]
        self._check(child)
        target = self._target(child, plan)
        reason = plan.reason or ("rollback" if plan.rollback else "")
        return await self.swap_to(role, target, reason=reason,
                                  stop_old_first=plan.stop_old_first, progress=progress)

    async def swap_to(
        self,
        role: str,
        target: Setup,
        *,
        reason: str,
        stop_old_first: bool = False,
        progress: Callable[[SwapProgress], None] | None = None,
    ) -> SwapRecord:
        """Swap ``role``'s child to ``target`` (a reload, a recycle, or a plan).

        Raises:
            supervisor.SwapRefusedError: the role is not in embedded mode, or the new
                child does not fit beside the old one (and ``stop_old_first`` is unset).
            supervisor.SwapInProgressError, supervisor.SwapFailedError: see
                :meth:`supervisor.Supervisor.swap`.
        """
        child = self._children[role]
        self._check(child)
        async with child.switching:
            try:
                return await self._swap_to(child, target, reason, stop_old_first,
                                           progress or (lambda _: None))
            except SwapFailedError as exc:
                child.last_error = exc.cause.message
                raise

    async def _swap_to(self, child: ManagedChild, target: Setup, reason: str,
                       stop_old_first: bool,
                       report: Callable[[SwapProgress], None]) -> SwapRecord:
        role = child.role
        began = time.monotonic()
        need = memory_needed(target)
        available = memory_available()
        fits = available is None or need <= available
        if not fits and not stop_old_first:
            raise SwapRefusedError(
                f"{target.spec.model.name} needs about {need >> 20} MiB and "
                f"{available >> 20 if available else 0} MiB are available beside the running "
                "child; retry with stop_old_first to stop the old child first (the "
                f"{role} service is then unavailable until the new child is ready)"
            )
        old = child.setup
        if fits:
            handover: asyncio.Task[None] | None = None
            launcher = child.launcher_factory(target)
            launcher.launch_nice = self._launch_nice

            def progress(p: SwapProgress) -> None:
                nonlocal handover
                if p.stage == "draining" and handover is None:  # new calls: new child
                    self._restore_priority(child)
                    handover = asyncio.create_task(
                        child.admission.hand_over(self._handover_hold))
                report(p)

            try:
                await child.supervisor.swap(
                    launcher, validate=target.model.validate,
                    drain_timeout=self._drain_timeout, progress=progress,
                )
            finally:
                launcher.launch_nice = 0  # its restarts start at the normal priority
                self._restore_priority(child)  # threads started since the switch, too
                if handover is not None and not handover.done():
                    handover.cancel()
        else:
            await self._stop_old_first(child, target, report)
        record = SwapRecord(role, str(old.spec.model), str(target.spec.model), time.time(),
                            reason, time.monotonic() - began)
        child.previous, child.current, child.last_swap = old, target, record
        child.admission.resize(target.runtime.max_concurrency(target.spec),
                               ahead_for(child.mode, target, child.config))
        _log.info("swapped", role=role, old=record.old, new=record.new, reason=record.reason,
                  seconds=round(record.seconds, 3))
        if self._on_swapped is not None:
            self._on_swapped(child)
        return record

    def _restore_priority(self, child: ManagedChild) -> None:
        pid = child.supervisor.pid
        if self._launch_nice and pid and not renice(pid, self._base_nice):
            _log.warning("could not restore the child's priority", role=child.role, pid=pid)

    async def _stop_old_first(self, child: ManagedChild, target: Setup,
                              progress: Callable[[SwapProgress], None]) -> None:
        """Break-before-make, on request: stop, start the new setup; on failure, restore."""
        sup = child.supervisor
        progress(SwapProgress("validating"))
        try:
            target.model.validate()
        except InvalidModelError as exc:
            cause = ExitCause("invalid_model", True, str(exc), at=time.time())
            progress(SwapProgress("failed", str(exc), cause))
            raise SwapFailedError(cause) from exc
        progress(SwapProgress("draining", "stopping the old child first (asked for)"))
        old_launcher, old_validate = sup.launcher, child.setup.model.validate
        await sup.stop()
        progress(SwapProgress("launching"))
        sup.reconfigure(child.launcher_factory(target), target.model.validate)
        sup.start()
        state = await sup.wait_for(State.RUNNING, State.FAILED, State.BACKOFF)
        if state is State.RUNNING:
            progress(SwapProgress("done"))
            return
        cause = sup.last_exit or ExitCause("never_ready", False, "did not start", at=time.time())
        await sup.stop()
        sup.reconfigure(old_launcher, old_validate)
        sup.start()
        progress(SwapProgress("failed", f"{cause.message}; restarting the old model", cause))
        raise SwapFailedError(cause)


def check_plan_model(path: str) -> None:
    """Refuse paths that cannot name a model file before touching the disk."""
    if "\x00" in path:
        raise InvalidArgument("model_path contains a NUL character")
    if path and not os.path.isabs(os.path.expanduser(path)):
        raise InvalidArgument("model_path must be absolute")
