"""Configuration reload (SIGHUP): re-read the configuration, apply what can change live.

* A child whose settings changed (model, runtime, context, threads, slots, batch, extra
  arguments) goes through the swap path: the new child is test-launched beside the old
  one and takes over only once ready. If it fails, the old child and its configuration
  stay, and the reason is logged.
* A role whose mode or endpoint settings changed (``mode``, ``enabled``, ``endpoint_*``,
  ``api_key_*``) switches mode through :mod:`daemon.models.modes` — the same make-before-break
  path — and keeps the old mode if the new one does not become ready.
* Request limits apply at once (but the gRPC message limit), and so do retrieval's limits
  (to the ingests, scans and searches that start after the reload; but the embedding
  batch, its concurrency and the group commit's size), and the Ask settings (to the Asks
  that start after it; but the response cache and the audit log).
* Access: the bearer tokens (``auth.token_file``, re-read), the TLS certificate, key and
  client CA (re-read; new handshakes get them, open connections keep theirs) and
  ``retrieval.allowed_roots`` apply at once. A token, certificate or key file that fails
  its checks makes the whole configuration invalid (below), so the running ones stay and
  the report's ``error`` says why. Turning TLS or mutual TLS on or off needs a restart; so
  does dropping every token while the daemon listens beyond loopback without mutual TLS.
* The model catalog (``[models.NAME]`` tables, the preset, the files of ``models_dir``):
  new models can be loaded at once, removed ones are drained and stopped, a resident
  model whose file or child settings changed gets a new child make-before-break (and
  keeps the old one if that fails), and aliases, pin, ttl and preload apply at once
  (:meth:`daemon.models.pool.Pool.reconfigure`). A role's default model being renamed needs a
  restart.
* Everything else (listen addresses, logging, restart policy, timeouts, the state
  directory, ``retrieval.enabled`` and ``rescan_interval``, ``answer.cache_*`` and ``audit_*``)
  needs a restart; the reload says so and keeps the running values.
* An invalid configuration is refused as a whole: nothing changes.

Which of these a changed option gets is declared once, on the option's field in its
section (its ``reload``, else the section's ``RELOAD``: :mod:`daemon.config._sections`,
read as :attr:`daemon.config.Option.reload`); :func:`reload_plan` reads it and
:attr:`ReloadReport.changes` names the outcome of every changed option, so none is
silently ignored. What is in force after a reload is the running configuration with the
options that were applied or brought to a new child taken from the new one
(:meth:`daemon.config.Config.with_options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from supervisor import SupervisorError, pick_runtime

from ..config import (
    OPTIONS,
    ChildConfig,
    Config,
    ConfigError,
    Reload,
    Role,
    is_loopback,
    value_of,
)
from ..config._catalog import CatalogEntry
from ..config.inference_mode import InferenceMode
from ..errors import RequestError
from ..models.children import Setup, make_setup
from ..models.model import Model
from ..models.modes import ModeManager, ModeRequest
from ..models.pool import Pool
from ..models.swaps import SwapManager

_log = structlog.get_logger("llamad.reload")


@dataclass
class ReloadReport:
    """What a reload did."""

    swapped: list[str] = field(default_factory=list)
    """Roles brought to their new settings through a swap or a mode switch."""
    updated: list[str] = field(default_factory=list)
    """Roles whose new settings apply without a new child (``queue_ahead``)."""
    kept: dict[str, str] = field(default_factory=dict)
    restart_needed: list[str] = field(default_factory=list)
    """Option keys whose change waits for a restart (the running value is kept)."""
    limits_changed: bool = False
    reloaded: list[str] = field(default_factory=list)
    """Access settings now in force: ``auth.token_file``, ``tls``, ``retrieval.allowed_roots``."""
    changes: dict[str, str] = field(default_factory=dict)
    """Every changed option by key: "applied", "new child" (a swap or a mode switch),
    "kept" (refused: see :attr:`kept`) or "restart needed"."""
    error: str = ""


_ROLES = tuple(Role)


CATALOG = "models.*"
"""The plan's key for a change of the model catalog's models (their tables, the preset,
the files of models_dir): the pool takes the new catalog (:meth:`daemon.models.pool.Pool.
reconfigure`); renaming a role's default model waits for a restart."""


def reload_plan(current: Config, new: Config) -> dict[str, Reload]:
    """Every option whose value differs between ``current`` and ``new``, with what a
    reload does with it (its declared :attr:`~daemon.config.Option.reload`); and
    :data:`CATALOG` when the catalog's models other than the roles' defaults differ."""
    plan: dict[str, Reload] = {
        o.key: o.reload for o in OPTIONS
        if value_of(current.settings, o.key) != value_of(new.settings, o.key)}
    if _declared(current) != _declared(new):
        plan[CATALOG] = "restart"
    return plan


def _declared(config: Config) -> set[tuple[object, ...]]:
    """The catalog's models but the roles' defaults, as declared: name, role, file,
    aliases, pin, ttl, preload."""
    return {(e.name, e.role, e.path, e.aliases, e.pin, e.ttl, e.preload)
            for e in config.catalog.entries if e.origin not in _ROLES}


def settle(plan: dict[str, Reload], report: ReloadReport) -> None:
    """Name the outcome of every planned option in ``report.changes`` (and the options that
    wait for a restart in ``report.restart_needed``), from what the reload did with the
    roles (``swapped``, ``updated``, ``kept``) and access (``reloaded``, ``kept``)."""
    for key, kind in plan.items():
        section = key.split(".", 1)[0]
        if kind == "restart":
            outcome = "restart needed"
        elif section in _ROLES:
            outcome = ("new child" if section in report.swapped and kind == "new_child"
                       else "applied" if section in report.swapped + report.updated
                       else "kept" if section in report.kept
                       else "restart needed")  # no such child running
        elif kind == "new_child":  # llama_bin, models_dir: through the swaps, if any
            outcome = "new child" if report.swapped else "restart needed"
        elif section == "tls":
            outcome = "restart needed" if "tls" in report.kept else "applied"
        else:
            outcome = "kept" if key in report.kept else "applied"
        report.changes[key] = outcome
        if outcome == "restart needed":
            report.restart_needed.append(key)


def _child_settings(cc: ChildConfig) -> tuple[object, ...]:
    """The settings a launched child is started with (everything ``make_setup`` puts in
    its launch): a change needs a new child."""
    return (cc.model, cc.runtime, cc.ctx_size, cc.threads, cc.parallel, cc.batch,
            cc.cache_ram, cc.chat_template, cc.extra_args, cc.spin_count, cc.env)


async def _apply_role(model: Model, current: Config, new: Config,
                      swaps: SwapManager, modes: ModeManager) -> tuple[bool, Setup | None]:
    """Bring one role to its new configuration: a mode switch, a swap, or nothing live
    (settings of a mode not in use apply at the next switch). Returns whether a swap or a
    mode switch ran, and the setup to keep for a later switch to embedded mode (when the
    role is not embedded now)."""
    old_cc, new_cc = current.child(model.role), new.child(model.role)
    target: Setup | None = None
    if new_cc.model:
        runtime = pick_runtime(new_cc.runtime, new.settings.llama_bin or None,
                               slots=new.settings.child.slots)
        target = make_setup(model.role, new_cc.model, runtime, new_cc)
    live = model.mode.kind
    if new_cc.mode is InferenceMode.EMBEDDED and live is InferenceMode.EMBEDDED:
        changed = (_child_settings(old_cc) != _child_settings(new_cc)
                   or current.settings.llama_bin != new.settings.llama_bin)
        if changed and target is not None:
            await swaps.swap_to(model.role, target, reason="reload")
            return True, None
        return False, None
    if new_cc.mode is not live or (live is InferenceMode.ENDPOINT
                                   and old_cc.endpoint() != new_cc.endpoint()):
        await modes.set_mode(model.role, ModeRequest(
            new_cc.mode, new_cc.endpoint() if new_cc.mode is InferenceMode.ENDPOINT else None,
            setup=target if new_cc.mode is InferenceMode.EMBEDDED else None, reason="reload"))
        return True, target if new_cc.mode is not InferenceMode.EMBEDDED else None
    return False, target if live is not InferenceMode.EMBEDDED else None


async def reload_config(
    current: Config,
    load: Callable[[], Config],
    swaps: SwapManager,
    modes: ModeManager,
    *,
    pool: Pool | None = None,
) -> tuple[Config, ReloadReport]:
    """Apply a fresh configuration; return the configuration now in force and a report.
    The model registry ``pool`` gives each role's model (a changed role section swaps or
    switches it) and takes a changed catalog (models added, removed, relaunched with new
    settings); None: no models to change."""
    report = ReloadReport()
    try:
        new = load()
    except ConfigError as exc:
        report.error = str(exc)
        _log.warning("reload refused: invalid configuration; nothing changed", error=str(exc))
        return current, report

    plan = reload_plan(current, new)
    applied = current
    for role in _ROLES:
        old_cc, new_cc = current.child(role), new.child(role)
        model = pool.roles().get(role) if pool is not None else None
        if model is None or (old_cc == new_cc
                             and current.settings.llama_bin == new.settings.llama_bin):
            continue
        try:
            live, keep = await _apply_role(model, current, new, swaps, modes)
        except (SupervisorError, FileNotFoundError, RequestError) as exc:
            report.kept[role] = str(exc)
            _log.warning("reload kept the running child", role=role, error=str(exc))
            continue
        model.configure(new_cc, keep)
        if role is Role.GENERATION:
            applied = dataclasses.replace(applied, generation=new_cc)
        else:
            applied = dataclasses.replace(applied, embedding=new_cc)
        (report.swapped if live else report.updated).append(role)
    applied = _apply_access(applied, current, new, report)
    if CATALOG in plan and pool is not None:
        applied = await _apply_catalog(pool, new, applied, plan, report)
    settle(plan, report)
    # What is in force now: an option kept or waiting for a restart keeps its running
    # value (so the next reload sees it as changed still); the limits, retrieval's and the
    # Ask settings read theirs.
    done = [key for key, outcome in report.changes.items()
            if outcome in ("applied", "new child") and key != CATALOG]  # not an option
    applied = dataclasses.replace(applied.with_options(new, done), sources=new.sources)
    report.limits_changed = applied.settings.limits != current.settings.limits
    _log.info("reloaded", swapped=report.swapped, updated=report.updated, kept=report.kept,
              limits_changed=report.limits_changed, reloaded=report.reloaded,
              restart_needed=report.restart_needed, changes=report.changes)
    return applied, report


async def _apply_catalog(pool: Pool, new: Config, applied: Config,
                         plan: dict[str, Reload], report: ReloadReport) -> Config:
    """The new catalog into the pool; the catalog in force into ``applied``."""
    def setup_for(entry: CatalogEntry) -> Setup:
        runtime = pick_runtime(entry.child.runtime, new.settings.llama_bin or None,
                               slots=new.settings.child.slots)
        return make_setup(entry.role, entry.path, runtime, entry.child)

    change = await pool.reconfigure(new.catalog, setup_for)
    if change.kept:
        report.kept[CATALOG] = "; ".join(f"{n}: {why}" for n, why in change.kept.items())
    if not change.defaults_renamed:
        plan[CATALOG] = "apply"
    _log.info("catalog reloaded", added=change.added, removed=change.removed,
              relaunched=change.relaunch, updated=change.updated, kept=change.kept or None,
              defaults_renamed=change.defaults_renamed)
    return dataclasses.replace(applied, catalog=pool.catalog)


def _apply_access(applied: Config, current: Config, new: Config,
                  report: ReloadReport) -> Config:
    """Tokens, TLS material and allowed roots: what can change live, in ``applied``."""
    if new.tokens != current.tokens:
        mutual = current.tls is not None and current.tls.require_client_cert
        if new.tokens is None and not is_loopback(current.settings.listen) and not mutual:
            report.kept["auth.token_file"] = (
                "the daemon listens beyond loopback without mutual TLS: it keeps requiring "
                "tokens until it is restarted")
            _log.warning("reload kept the tokens", why=report.kept["auth.token_file"])
        else:
            applied = dataclasses.replace(applied, tokens=new.tokens)
            report.reloaded.append("auth.token_file")
            _log.info("tokens reloaded",
                      tokens=new.tokens.roles() if new.tokens is not None else None)
    if new.tls != current.tls:
        if current.tls is None or new.tls is None:
            report.kept["tls"] = "turning TLS on or off needs a restart"
        elif current.tls.require_client_cert != new.tls.require_client_cert:
            report.kept["tls"] = "turning mutual TLS on or off needs a restart"
        else:
            applied = dataclasses.replace(applied, tls=new.tls)
            report.reloaded.append("tls")
    if "tls" in report.kept:
        _log.warning("reload kept the TLS material", why=report.kept["tls"])
    if new.settings.retrieval.allowed_roots != current.settings.retrieval.allowed_roots:
        report.reloaded.append("retrieval.allowed_roots")
    return applied

