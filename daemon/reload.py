"""Configuration reload (SIGHUP): re-read the configuration, apply what can change live.

* A child whose settings changed (model, runtime, context, threads, slots, batch, extra
  arguments) goes through the swap path: the new child is test-launched beside the old
  one and takes over only once ready. If it fails, the old child and its configuration
  stay, and the reason is logged.
* A role whose mode or endpoint settings changed (``mode``, ``enabled``, ``endpoint_*``,
  ``api_key_*``) switches mode through :mod:`daemon.modes` — the same make-before-break
  path — and keeps the old mode if the new one does not become ready.
* Request limits apply at once.
* Everything else (listen addresses, logging, restart policy, timeouts) needs a
  restart; the reload says so and keeps the running values.
* An invalid configuration is refused as a whole: nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from supervisor import SupervisorError, pick_runtime

from .children import ManagedChild, Setup, make_setup
from .config import ChildConfig, Config, ConfigError
from .errors import RequestError
from .modes import ModeManager, ModeRequest
from .swaps import SwapManager

_log = structlog.get_logger("llamad.reload")


@dataclass
class ReloadReport:
    """What a reload did."""

    swapped: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    restart_needed: list[str] = field(default_factory=list)
    limits_changed: bool = False
    error: str = ""


def _child_settings(cc: ChildConfig) -> tuple[object, ...]:
    return (cc.model, cc.runtime, cc.ctx_size, cc.threads, cc.parallel, cc.batch,
            cc.extra_args)


async def _apply_role(child: ManagedChild, current: Config, new: Config,
                      swaps: SwapManager, modes: ModeManager) -> None:
    """Bring one role to its new configuration: a mode switch, a swap, or nothing live
    (settings of a mode not in use apply at the next switch)."""
    old_cc, new_cc = current.child(child.role), new.child(child.role)
    target: Setup | None = None
    if new_cc.model:
        runtime = pick_runtime(new_cc.runtime, new.llama_bin or None)
        target = make_setup(child.role, new_cc.model, runtime, new_cc)
    live = child.mode.kind
    if new_cc.mode == "embedded" and live == "embedded":
        changed = (_child_settings(old_cc) != _child_settings(new_cc)
                   or current.llama_bin != new.llama_bin)
        if changed and target is not None:
            await swaps.swap_to(child.role, target, reason="reload")
    elif new_cc.mode != live or (live == "endpoint" and old_cc.endpoint() != new_cc.endpoint()):
        await modes.set_mode(child.role, ModeRequest(
            new_cc.mode, new_cc.endpoint() if new_cc.mode == "endpoint" else None,
            setup=target if new_cc.mode == "embedded" else None, reason="reload"))
        if new_cc.mode != "embedded" and target is not None:
            child.current = target
    elif target is not None and live != "embedded":
        child.current = target


async def reload_config(
    current: Config,
    load: Callable[[], Config],
    children: dict[str, ManagedChild],
    swaps: SwapManager,
    modes: ModeManager,
) -> tuple[Config, ReloadReport]:
    """Apply a fresh configuration; return the configuration now in force and a report."""
    report = ReloadReport()
    try:
        new = load()
    except ConfigError as exc:
        report.error = str(exc)
        _log.warning("reload refused: invalid configuration; nothing changed", error=str(exc))
        return current, report

    applied = current
    for role in ("generation", "embedding"):
        old_cc, new_cc = current.child(role), new.child(role)
        child = children.get(role)
        if child is None or (old_cc == new_cc and current.llama_bin == new.llama_bin):
            continue
        try:
            await _apply_role(child, current, new, swaps, modes)
        except (SupervisorError, FileNotFoundError, RequestError) as exc:
            report.kept[role] = str(exc)
            _log.warning("reload kept the running child", role=role, error=str(exc))
            continue
        child.config = new_cc
        if role == "generation":
            applied = dataclasses.replace(applied, generation=new_cc)
        else:
            applied = dataclasses.replace(applied, embedding=new_cc)
        report.swapped.append(role)
    if new.limits != current.limits:
        applied = dataclasses.replace(applied, limits=new.limits)
        report.limits_changed = True
    for name in ("listen", "metrics_listen", "policy", "timeouts", "request_timeout",
                 "swap_ready_timeout", "swap_drain_timeout", "recycle_after_requests",
                 "recycle_max_rss_mb", "recycle_check_interval", "recycle_min_uptime",
                 "log_lines", "drain_grace",
                 "log_format", "log_level"):
        if getattr(new, name) != getattr(current, name):
            report.restart_needed.append(name)
    if current.llama_bin != new.llama_bin and not report.swapped:
        report.restart_needed.append("llama_bin")
    applied = dataclasses.replace(applied, sources=new.sources)
    _log.info("reloaded", swapped=report.swapped, kept=report.kept,
              limits_changed=report.limits_changed, restart_needed=report.restart_needed)
    return applied, report
