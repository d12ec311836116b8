"""Model swaps, as the daemon offers them: what to swap to, and rollback.

Only a role in embedded mode has a model to swap; :mod:`daemon.models.modes` switches modes.

This module decides the new :class:`~daemon.models.children.Setup` — a new model, other
arguments, or the previous setup for a rollback — and logs the outcome; the model carries
the swap out (:meth:`daemon.models.model.Model.replace`: the memory check, validation, the
launch beside the old child, the cut-over, the drain, or stop-old-first when asked to and
needed) and records it for Status.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from supervisor import SwapInProgressError, SwapProgress, SwapRecord, SwapRefusedError

from ..config.inference_mode import InferenceMode
from ..errors import InvalidArgument
from .children import Setup, make_setup
from .model import Model

if TYPE_CHECKING:
    from .pool import Pool

_log = structlog.get_logger("llamad.swaps")


@dataclass(frozen=True)
class SwapPlan:
    """What the caller asked for, validated."""

    model: str = ""
    extra_args: tuple[str, ...] | None = None
    ctx_size: int | None = None
    rollback: bool = False
    stop_old_first: bool = False
    reason: str = ""


class SwapManager:
    """Runs swaps for the daemon's models."""

    def __init__(self, registry: Pool) -> None:
        self._registry = registry  # asked for the model serving a role, at each swap

    @staticmethod
    def _check(model: Model) -> None:
        if model.mode.kind is not InferenceMode.EMBEDDED:
            raise SwapRefusedError(
                f"the {model.role} role is in {model.mode.kind} mode: Swap replaces a "
                "supervised child's model; ControlService/SetMode switches modes")
        if model.switching:
            raise SwapInProgressError(f"a swap or mode switch of the {model.role} role is "
                                      "already running")

    def _target(self, model: Model, plan: SwapPlan) -> Setup:
        if plan.rollback:
            if plan.model or plan.extra_args is not None or plan.ctx_size is not None:
                raise InvalidArgument("rollback takes no model_path, extra_args or ctx_size")
            if model.previous is None:
                raise InvalidArgument(f"the {model.role} child has not been swapped: "
                                      "nothing to roll back to")
            previous = model.previous
            # Re-read the file: it may have changed since.
            return make_setup(model.role, previous.spec.model, previous.runtime, model.config,
                              ctx_size=previous.spec.ctx_size,
                              extra_args=previous.spec.extra_args)
        if not plan.model and plan.extra_args is None and plan.ctx_size is None:
            raise InvalidArgument("nothing to swap: give model_path, extra_args or ctx_size")
        current = model.setup
        return make_setup(
            model.role, plan.model or current.spec.model, current.runtime, model.config,
            ctx_size=current.spec.ctx_size if plan.ctx_size is None else plan.ctx_size,
            extra_args=current.spec.extra_args if plan.extra_args is None else plan.extra_args,
        )

    async def swap(self, role: str, plan: SwapPlan,
                   progress: Callable[[SwapProgress], None], *,
                   model: Model | None = None) -> SwapRecord:
        """Swap ``role``'s child (or ``model``'s, a pool model of that role) according to
        ``plan``; report stages to ``progress``.

        Raises:
            InvalidArgument: the plan is inconsistent.
            supervisor.SwapInProgressError, supervisor.SwapRefusedError,
            supervisor.SwapFailedError: see :meth:`daemon.models.model.Model.replace`.
        """
        target_model = self._registry.of_role(role) if model is None else model
        self._check(target_model)
        target = self._target(target_model, plan)
        reason = plan.reason or ("rollback" if plan.rollback else "")
        return await self.swap_to(role, target, reason=reason,
                                  stop_old_first=plan.stop_old_first, progress=progress,
                                  model=model)

    async def swap_to(
        self,
        role: str,
        target: Setup,
        *,
        reason: str,
        stop_old_first: bool = False,
        progress: Callable[[SwapProgress], None] | None = None,
        model: Model | None = None,
    ) -> SwapRecord:
        """Swap ``role``'s child to ``target`` (a reload, a recycle, or a plan).

        Raises:
            supervisor.SwapRefusedError: the role is not in embedded mode, or the new
                child does not fit beside the old one (and ``stop_old_first`` is unset).
            supervisor.SwapInProgressError, supervisor.SwapFailedError: see
                :meth:`daemon.models.model.Model.replace`.
        """
        if model is None:
            model = self._registry.of_role(role)
        self._check(model)
        record = await model.replace(model.target_for(target), reason=reason,
                                     stop_old_first=stop_old_first, progress=progress)
        if record is None:  # cannot happen: checked embedded above, under no other switch
            raise SwapRefusedError(f"the {role} role left embedded mode during the swap")
        _log.info("swapped", role=role, old=record.old, new=record.new, reason=record.reason,
                  seconds=round(record.seconds, 3))
        return record


def check_plan_model(path: str) -> None:
    """Refuse paths that cannot name a model file before touching the disk."""
    if "\x00" in path:
        raise InvalidArgument("model_path contains a NUL character")
    if path and not os.path.isabs(os.path.expanduser(path)):
        raise InvalidArgument("model_path must be absolute")
