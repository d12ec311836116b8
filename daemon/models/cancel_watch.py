"""After a cancelled call, make sure its child stopped working for it (issue 25).

Cancelling a call (its deadline passed, its client left) closes the HTTP request to the
child, and llama-server stops that slot's task at its next step. A child stuck inside one
step (a grammar that costs minutes per token, before llamad bounded them) takes the
cancel only once that step ends, and meanwhile samples no token for any other slot, while
its ``/health`` still answers from another thread.

So when a call on a llama-server child is cancelled, the child's serving loop is asked a
question only it answers (:meth:`supervisor.InferenceClient.loop_answers`). A child that
has not answered within ``recycle.cancel_grace`` seconds is replaced through the swap path
(make-before-break: the new child starts beside it and takes the calls once ready; where
there is no room for two, the stuck one, which serves nobody, is stopped first), logged and
counted (``llamad_stuck_replacements``). One watch per child process at a time.

The grace must outlast one step of a healthy child: a step that evaluates a prompt batch
(``batch`` tokens) of a large model on few cores can take tens of seconds, hence 60 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from supervisor import ChildNotReadyError, SupervisorError, SwapRefusedError

from ..config.inference_mode import InferenceMode
from ..errors import RequestError
from ..telemetry.metrics import Metrics
from .model import Model
from .router import Role
from .swaps import SwapManager

_log = structlog.get_logger("llamad.cancel_watch")


class CancelWatch:
    """Watches children after cancelled calls; replaces one whose loop stays silent."""

    def __init__(self, swaps: SwapManager, metrics: Metrics | None,
                 grace: Callable[[], float]) -> None:
        """Args:
            grace: ``recycle.cancel_grace`` now (read at each cancel: a reload changes it);
                0 turns the watch off.
        """
        self._swaps = swaps
        self._metrics = metrics
        self._grace = grace
        self._watching: dict[int, asyncio.Task[None]] = {}

    def cancelled(self, role: Role, pid: int) -> None:
        """A call on ``role``'s child ``pid`` was cancelled: watch that child (once)."""
        grace = self._grace()
        if grace <= 0 or pid <= 0 or pid in self._watching or not isinstance(role, Model):
            return
        current = role.current
        if (role.mode.kind is not InferenceMode.EMBEDDED or current is None
                or current.runtime.name != "llama-server"):
            return  # an endpoint is not ours; the bundled runtime has no such loop
        self._watching[pid] = asyncio.create_task(self._watch(role, pid, grace),
                                                  name=f"cancel-watch-{pid}")

    async def _watch(self, model: Model, pid: int, grace: float) -> None:
        try:
            try:
                client = model.supervisor.client
            except ChildNotReadyError:
                return  # stopped or restarting: nothing left to stop
            if await client.loop_answers(grace) or model.serving_pid != pid:
                return
            _log.warning("child stuck after a cancelled call: replacing it", role=model.role,
                         pid=pid, grace_s=grace)
            if self._metrics is not None:
                self._metrics.stuck_replaced(model.role)
            reason = (f"stuck: its serving loop did not answer within {grace:g} s of a "
                      "cancelled call (recycle.cancel_grace)")
            try:
                try:
                    await self._swaps.swap_to(model.role, model.setup, model=model,
                                              reason=reason)
                except SwapRefusedError:
                    # No room for a second child: the stuck one serves nobody meanwhile,
                    # so it goes first (what a swap's stop_old_first does).
                    await self._swaps.swap_to(model.role, model.setup, model=model,
                                              reason=reason, stop_old_first=True)
            except (SupervisorError, RequestError) as exc:
                _log.warning("replacing a stuck child failed", role=model.role, pid=pid,
                             error=str(exc))
        finally:
            self._watching.pop(pid, None)

    async def aclose(self) -> None:
        """Stop every watch (a replacement already running is cancelled with it)."""
        tasks = list(self._watching.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
