"""Loading the configuration: flags, environment and TOML file, then validation into a
:class:`~daemon.config.Config`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from models import Manifest
from supervisor import RestartPolicy, Timeouts

from ._config_checks import (
    _MAX_SOCKET_PATH,
    _check_endpoint,
    _default_model,
    _mode,
    _prepared,
    _tls,
    _tokens,
    check_listen,
    default_models_dir,
    unix_socket_path,
)
from ._config_options import _BY_KEY, OPTIONS, ConfigError, _coerce
from ._config_sections import (
    AnswerConfig,
    ChildConfig,
    Config,
    Limits,
    RetrievalSettings,
    _section,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option as a flag (with its env variable and default in the help)."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration file (env LLAMAD_CONFIG).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in OPTIONS:
        section = opt.key.split(".")[0] if "." in opt.key else "daemon"
        group = groups.setdefault(section, parser.add_argument_group(section))
        default = "" if opt.default in ("", ()) else f" Default: {opt.default}."
        text = f"{opt.help}{default} Env: {opt.env}."
        if opt.kind is bool:
            group.add_argument(opt.flag, dest=opt.dest, default=None,
                               action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(opt.flag, dest=opt.dest, default=None, help=text,
                               metavar=opt.key.split(".")[-1].upper(),
                               choices=opt.choices or None)

def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out


def load(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    file: str | os.PathLike[str] | None = None,
) -> Config:
    """Build the configuration from flags, environment and file.

    Raises:
        ConfigError: an unknown file key, a bad value, or an inconsistent combination.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {o.key: o.default for o in OPTIONS}
    sources: dict[str, str] = {o.key: "default" for o in OPTIONS}

    path = file or (getattr(args, "config", None) if args else None) or env.get("LLAMAD_CONFIG")
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        for key, raw in _flatten(data).items():
            if key not in _BY_KEY:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(_BY_KEY[key], raw, f"file {path}")
            sources[key] = "file"
    for opt in OPTIONS:
        if opt.env in env:
            values[opt.key] = _coerce(opt, env[opt.env], f"env {opt.env}")
            sources[opt.key] = "env"
    if args is not None:
        for opt in OPTIONS:
            raw = getattr(args, opt.dest, None)
            if raw is not None:
                values[opt.key] = _coerce(opt, raw, f"flag {opt.flag}")
                sources[opt.key] = "flag"
    return _build(values, sources, env)


def _child(values: Mapping[str, Any], sources: Mapping[str, str], env: Mapping[str, str],
           role: str) -> ChildConfig:
    mode = _mode(values, sources, role)
    _check_endpoint(values, env, role, mode)
    return ChildConfig(
        role=role,
        enabled=mode != "disabled",
        mode=mode,
        endpoint_url=values[f"{role}.endpoint_url"],
        endpoint_model=values[f"{role}.endpoint_model"],
        api_key_file=values[f"{role}.api_key_file"],
        api_key_env=values[f"{role}.api_key_env"],
        model=values[f"{role}.model"],
        runtime=values[f"{role}.runtime"],
        ctx_size=values[f"{role}.ctx_size"],
        threads=values[f"{role}.threads"],
        parallel=values[f"{role}.parallel"],
        batch=values[f"{role}.batch"],
        extra_args=tuple(str(values[f"{role}.extra_args"]).split()),
        spin_count=values[f"{role}.spin_count"],
        queue_ahead=values[f"{role}.queue_ahead"],
    )


def _build(
    values: Mapping[str, Any], sources: Mapping[str, str], env: Mapping[str, str]
) -> Config:
    origins = dict(sources)
    models_dir = Path(values["models_dir"]).expanduser().absolute() if values["models_dir"] \
        else default_models_dir()
    children = {role: _child(values, sources, env, role) for role in ("generation", "embedding")}
    prepared: Manifest | None = None
    for role, child in children.items():
        if child.mode == "embedded" and not child.model:
            if prepared is None:
                prepared = _prepared(models_dir, role)
            model = _default_model(prepared, models_dir, role)
            children[role] = dataclasses.replace(child, model=str(model))
            origins[f"{role}.model"] = "models_dir"
    if values["restart.backoff_cap"] < values["restart.backoff_base"]:
        raise ConfigError("restart.backoff_cap must be >= restart.backoff_base")
    if values["child.start_cap"] < values["child.start_timeout"]:
        raise ConfigError("child.start_cap must be >= child.start_timeout")
    if values["limits.default_max_tokens"] > values["limits.max_tokens"]:
        raise ConfigError("limits.default_max_tokens must be <= limits.max_tokens")
    tls = _tls(values)
    tokens = _tokens(values)
    listen = values["listen"]
    check_listen(listen, tls=tls is not None,
                 authenticated=tokens is not None or (tls is not None
                                                      and tls.require_client_cert))
    for root in values["retrieval.allowed_roots"]:
        if not os.path.isabs(root):
            raise ConfigError(f"retrieval.allowed_roots: {root!r} is not an absolute path")
    metrics_listen = values["metrics_listen"]
    if metrics_listen:
        if metrics_listen.startswith("unix:"):
            raise ConfigError("metrics_listen: must be a loopback host:port, not a unix socket")
        try:
            check_listen(metrics_listen)
        except ConfigError as exc:
            raise ConfigError(f"metrics_{exc}") from None
    cooldown = values["restart.breaker_cooldown"]
    state_dir = Path(values["state_dir"] or env.get("STATE_DIRECTORY", "").split(":")[0]
                     or "var")
    socket = unix_socket_path(listen, state_dir)
    if socket is not None and len(os.fsencode(socket.absolute())) > _MAX_SOCKET_PATH:
        raise ConfigError(f"listen: the unix socket path {socket.absolute()} is longer than "
                          f"{_MAX_SOCKET_PATH} bytes")
    return Config(
        tls=tls,
        tokens=tokens,
        listen=listen,
        metrics_listen=metrics_listen,
        llama_bin=values["llama_bin"],
        state_dir=state_dir,
        retrieval=_section(RetrievalSettings, values, "retrieval"),
        answer=_section(AnswerConfig, values, "answer"),
        generation=children["generation"],
        embedding=children["embedding"],
        policy=RestartPolicy(
            base=values["restart.backoff_base"],
            cap=values["restart.backoff_cap"],
            max_failures=values["restart.breaker_failures"],
            stable_after=values["restart.breaker_reset"],
            cooldown=cooldown or None,
        ),
        timeouts=Timeouts(
            start=values["child.start_timeout"],
            start_cap=values["child.start_cap"],
            probe_interval=values["child.probe_interval"],
            probe_timeout=values["child.probe_timeout"],
            probe_failures=values["child.probe_failures"],
            stop_grace=values["child.stop_grace"],
            busy_silence=values["child.busy_silence"],
        ),
        request_timeout=values["child.request_timeout"],
        swap_ready_timeout=values["swap.ready_timeout"],
        swap_drain_timeout=values["swap.drain_timeout"],
        swap_handover_hold=values["swap.handover_hold"],
        swap_launch_nice=values["swap.launch_nice"],
        recycle_after_requests=values["recycle.after_requests"],
        recycle_max_rss_mb=values["recycle.max_rss_mb"],
        recycle_check_interval=values["recycle.check_interval"],
        recycle_min_uptime=values["recycle.min_uptime"],
        log_lines=values["child.log_lines"],
        drain_grace=values["drain_grace"],
        log_format=values["log.format"],
        log_level=values["log.level"],
        limits=_section(Limits, values, "limits"),
        sources=origins,
        models_dir=models_dir,
        values=dict(values),
    )
