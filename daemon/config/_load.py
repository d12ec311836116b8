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

from ._catalog_load import build_catalog, catalog_tables
from ._checks import (
    _MAX_SOCKET_PATH,
    _check_endpoint,
    _default_model,
    _mode,
    _prepared,
    _tls,
    _tokens,
    check_child,
    check_endpoint_keys,
    check_listen,
    default_models_dir,
    unix_socket_path,
)
from ._options import ConfigError, _coerce, with_values
from ._resolved import ChildConfig, Config
from ._retrieval import check_store
from ._sections import _BY_KEY, OPTIONS, RoleSettings, Settings
from .answer_templates import load_templates
from .inference_mode import InferenceMode
from .role import Role


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
    tables: dict[str, Mapping[str, Any]] = {}
    sources: dict[str, str] = {o.key: "default" for o in OPTIONS}

    path = file or (getattr(args, "config", None) if args else None) or env.get("LLAMAD_CONFIG")
    if path:
        data = read_config_file(path)
        tables = catalog_tables(data, f"config file {path}")
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
    return _build(values, sources, env, tables)


def _child(settings: RoleSettings, sources: Mapping[str, str], env: Mapping[str, str],
           role: Role) -> ChildConfig:
    mode = _mode(settings, sources, role)
    _check_endpoint(settings, env, role, mode)
    return ChildConfig.of(settings, role, mode=mode,
                          enabled=mode is not InferenceMode.DISABLED)


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML configuration file at ``path``.

    Raises:
        ConfigError: unreadable, or not TOML (the message names the file).
    """
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def state_dir_of(setting: str, env: Mapping[str, str]) -> Path:
    """The state directory: ``state_dir``, else systemd's ``$STATE_DIRECTORY`` (its
    first entry), else ``./var``."""
    return Path(setting or env.get("STATE_DIRECTORY", "").split(":")[0] or "var")


def _build(
    values: Mapping[str, Any], sources: Mapping[str, str], env: Mapping[str, str],
    tables: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """The configuration of the options ``values`` (by key; the others at their default)
    that came from ``sources``, and of the catalog's ``[models.NAME]`` ``tables``, checked
    and resolved."""
    s = with_values(Settings(), values)
    if s.models.max_resident == 1:
        # One child at a time: none shares the cores with another, and short OpenMP
        # spins only cost it (measured: 99 vs 74 calls in 66 s, 21 vs 25 ms a token,
        # 8 streaming clients switching two models). An explicit spin_count still wins.
        s = with_values(s, {f"{role}.spin_count": -1 for role in Role
                            if sources.get(f"{role}.spin_count", "default") == "default"})
    origins = dict(sources)
    models_dir = Path(s.models_dir).expanduser().absolute() if s.models_dir \
        else default_models_dir()
    children = {role: _child(getattr(s, role), sources, env, role) for role in Role}
    for role, child in children.items():
        check_child(role, child.extra_argv, child.env, models_dir)
    check_endpoint_keys(s.endpoint_keys)
    load_templates(s.answer.templates_dir)  # refused here, at load and on reload
    prepared: Manifest | None = None
    for role, child in children.items():
        if child.mode is InferenceMode.EMBEDDED and not child.model:
            if prepared is None:
                prepared = _prepared(models_dir, role)
            model = _default_model(prepared, models_dir, role)
            children[role] = dataclasses.replace(child, model=str(model))
            origins[f"{role}.model"] = "models_dir"
    catalog = build_catalog(
        s, children, tables or {}, models_dir,
        share_cores=sources.get("generation.threads", "default") == "default",
        share_embedding_cores=sources.get("embedding.threads", "default") == "default")
    if s.restart.backoff_cap < s.restart.backoff_base:
        raise ConfigError("restart.backoff_cap must be >= restart.backoff_base")
    if s.child.start_cap < s.child.start_timeout:
        raise ConfigError("child.start_cap must be >= child.start_timeout")
    if s.limits.default_max_tokens > s.limits.max_tokens:
        raise ConfigError("limits.default_max_tokens must be <= limits.max_tokens")
    tls = _tls(s.tls)
    tokens = _tokens(s.auth)
    authenticated = tokens is not None or (tls is not None and tls.require_client_cert)
    check_listen(s.listen, tls=tls is not None, authenticated=authenticated)
    if s.http_listen:
        if s.http_listen.startswith("unix:"):
            raise ConfigError("http_listen: must be a host:port, not a unix socket")
        try:
            check_listen(s.http_listen, tls=tls is not None, authenticated=authenticated)
        except ConfigError as exc:
            raise ConfigError(f"http_{exc}") from None
    if s.agent_listen:
        if s.agent_listen.startswith("unix:"):
            raise ConfigError("agent_listen: must be a host:port, not a unix socket")
        try:  # any address: the port reads nothing and answers a state (docs/scale-out.md)
            check_listen(s.agent_listen, tls=True, authenticated=True)
        except ConfigError as exc:
            raise ConfigError(f"agent_{exc}") from None
    for root in s.retrieval.allowed_roots:
        if not os.path.isabs(root):
            raise ConfigError(f"retrieval.allowed_roots: {root!r} is not an absolute path")
    check_store(s.retrieval)
    if s.metrics_listen:
        if s.metrics_listen.startswith("unix:"):
            raise ConfigError("metrics_listen: must be a loopback host:port, not a unix socket")
        try:
            check_listen(s.metrics_listen)
        except ConfigError as exc:
            raise ConfigError(f"metrics_{exc}") from None
    state_dir = state_dir_of(s.state_dir, env)
    socket = unix_socket_path(s.listen, state_dir)
    if socket is not None and len(os.fsencode(socket.absolute())) > _MAX_SOCKET_PATH:
        raise ConfigError(f"listen: the unix socket path {socket.absolute()} is longer than "
                          f"{_MAX_SOCKET_PATH} bytes")
    return Config(settings=s, generation=children[Role.GENERATION],
                  embedding=children[Role.EMBEDDING], state_dir=state_dir, sources=origins,
                  models_dir=models_dir, tls=tls, tokens=tokens, catalog=catalog)
