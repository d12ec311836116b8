"""Validation of the configuration beyond one value: a role's mode and endpoint, the
listen addresses, the TLS and token files, the prepared models' defaults, the children's
extra arguments and environment, where endpoint keys may come from."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import models
from models import MANIFEST_NAME, Manifest, ManifestError
from supervisor import (
    ArgumentRefused,
    EndpointError,
    check_child_env,
    check_operator_args,
    normalise_url,
    read_api_key,
)

from ._options import INSTALLED_MODELS_DIR, ConfigError
from ._sections import (
    _BY_KEY,
    OPTIONS,
    AuthSettings,
    EndpointKeySettings,
    RoleSettings,
    TlsSettings,
)
from .access import AccessError, TlsMaterial, TokenTable, load_tls, load_tokens
from .inference_mode import InferenceMode


def _mode(settings: RoleSettings, sources: Mapping[str, str], role: str) -> InferenceMode:
    """The role's mode; ``enabled = false`` is the older spelling of "disabled"."""
    mode = settings.mode
    if not settings.enabled:
        if sources[f"{role}.mode"] != "default" and mode is not InferenceMode.DISABLED:
            raise ConfigError(f"{role}.enabled = false conflicts with {role}.mode = {mode}: "
                              f"set only {role}.mode")
        return InferenceMode.DISABLED
    return mode


def _check_endpoint(settings: RoleSettings, env: Mapping[str, str], role: str,
                    mode: InferenceMode) -> None:
    url, key_file, key_env = settings.endpoint_url, settings.api_key_file, settings.api_key_env
    if key_file and key_env:
        raise ConfigError(f"{role}.api_key_file and {role}.api_key_env: set one, not both")
    if key_env and not _ENV_NAME.fullmatch(key_env):
        raise ConfigError(f"{role}.api_key_env: {key_env!r} is not an environment variable name "
                          "(give the variable's name, never the key itself)")
    if url:
        try:
            normalise_url(url)
        except ValueError as exc:
            raise ConfigError(f"{role}.endpoint_url: {exc}") from None
    if mode is not InferenceMode.ENDPOINT:
        return
    if not url:
        opt = _BY_KEY[f"{role}.endpoint_url"]
        raise ConfigError(f"{role}.endpoint_url: endpoint mode needs a URL (set {opt.flag} or "
                          f"{opt.env})")
    if key_file or key_env:
        try:
            read_api_key(key_file, key_env, env)
        except EndpointError as exc:
            name = "api_key_file" if key_file else "api_key_env"
            raise ConfigError(f"{role}.{name}: {exc}") from None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_child(where: str, extra_args: Sequence[str], env: Iterable[tuple[str, str]],
                models_dir: Path) -> None:
    """A child's extra arguments and environment from an operator's file: nothing llamad
    owns, nothing that reaches the host, files only inside ``models_dir``
    (:func:`supervisor.check_operator_args`, :func:`supervisor.check_child_env`).

    Raises:
        ConfigError: naming ``where``, the argument or variable, and why.
    """
    try:
        check_operator_args(extra_args, models_dir)
    except ArgumentRefused as exc:
        raise ConfigError(f"{where}.extra_args: {exc}") from None
    try:
        check_child_env(env, models_dir)
    except ArgumentRefused as exc:
        raise ConfigError(f"{where}.env: {exc}") from None


def check_endpoint_keys(settings: EndpointKeySettings) -> None:
    """``[endpoint_keys]``: an absolute directory, and a prefix that is a variable name's
    beginning and begins none of llamad's own option variables (SetMode could otherwise
    send, say, LLAMAD_AUTH_TOKEN_FILE's value to any URL as a key).

    Raises:
        ConfigError: naming the option.
    """
    if settings.dir and not Path(settings.dir).is_absolute():
        raise ConfigError(f"endpoint_keys.dir: {settings.dir!r} is not an absolute path")
    prefix = settings.env_prefix
    if not prefix:
        return
    if not _ENV_NAME.fullmatch(prefix) or len(prefix) < 4:
        raise ConfigError(f"endpoint_keys.env_prefix: {prefix!r} is not the beginning of a "
                          "variable name of 4 characters or more")
    clash = next((o.env for o in OPTIONS if o.env.startswith(prefix)), None)
    if clash:
        raise ConfigError(f"endpoint_keys.env_prefix: {prefix!r} begins llamad's own "
                          f"variable {clash}: choose a prefix of key variables only")


def default_models_dir() -> Path:
    """``models/gguf`` of a source checkout (beside the ``models`` package) once
    ``python -m models prepare`` wrote its manifest there, else the installed location."""
    checkout = Path(models.__file__).resolve().parent / "gguf"
    if (checkout / MANIFEST_NAME).is_file():
        return checkout
    return Path(INSTALLED_MODELS_DIR)


def _no_model(role: str, models_dir: Path, why: str) -> ConfigError:
    opt, where = _BY_KEY[f"{role}.model"], _BY_KEY["models_dir"]
    return ConfigError(
        f"{role}.model: no model configured (set {opt.flag} or {opt.env}), and {why}: run "
        f"`python -m models prepare --dest {models_dir}`, or point models_dir ({where.flag} "
        f"or {where.env}) at prepared models; or use an endpoint with --{role}-mode "
        f"endpoint, or disable the child with --no-{role}-enabled")


def _prepared(models_dir: Path, role: str) -> Manifest:
    """The manifest of ``models_dir``."""
    if not (models_dir / MANIFEST_NAME).is_file():
        raise _no_model(role, models_dir, f"models_dir {models_dir} has no prepared models "
                                          f"(no {MANIFEST_NAME})")
    try:
        return Manifest.load(models_dir)
    except ManifestError as exc:
        raise _no_model(role, models_dir, f"the models_dir manifest is unusable: {exc}") \
            from None


def _default_model(manifest: Manifest, models_dir: Path, role: str) -> Path:
    """The file the manifest marks as the default model of ``role``, which must exist."""
    names = sorted(e.file for e in manifest.entries.values() if e.role == role and e.default)
    if not names:
        raise _no_model(role, models_dir,
                        f"the manifest in {models_dir} names no default {role} model")
    path = models_dir / names[0]
    if not path.is_file():
        raise _no_model(role, models_dir,
                        f"{path}, the prepared default {role} model, is missing")
    return path


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _is_loopback_ip(host: str) -> bool:
    # An IP literal only: a DNS name such as "127.example.com" may resolve anywhere.
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def is_loopback(listen: str) -> bool:
    """True for a unix socket or a loopback ``host:port``."""
    if listen.startswith("unix:"):
        return True
    host = listen.rpartition(":")[0]
    return host in _LOOPBACK_HOSTS or _is_loopback_ip(host)


def check_listen(listen: str, *, tls: bool = False, authenticated: bool = False) -> None:
    """Accept a unix socket or a loopback ``host:port``; beyond loopback, only with TLS and
    client authentication (bearer tokens or mutual TLS).

    Raises:
        ConfigError: malformed, or non-loopback without TLS or without authentication.
    """
    if listen.startswith("unix:"):
        if not listen.split(":", 1)[1].lstrip("/"):
            raise ConfigError("listen: unix socket path is empty")
        return
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen: {listen!r} is not host:port or unix:/path")
    if is_loopback(listen):
        return
    if not tls:
        raise ConfigError(
            f"listen: {host or '(all interfaces)'} is not a loopback address; listening "
            "beyond loopback requires TLS (set tls.cert_file and tls.key_file) and client "
            "authentication (auth.token_file or tls.client_ca_file)")
    if not authenticated:
        raise ConfigError(
            f"listen: {host or '(all interfaces)'} is not a loopback address; listening "
            "beyond loopback requires client authentication too: set auth.token_file "
            "(bearer tokens) or tls.client_ca_file (mutual TLS)")


_MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path holds 108 bytes, NUL included


def unix_socket_path(listen: str, state_dir: Path) -> Path | None:
    """The socket file of a ``unix:`` listen address (None for host:port).

    ``unix:/abs/path`` and ``unix:///abs/path`` are absolute; ``unix:name.sock`` is
    relative to the state directory.
    """
    if not listen.startswith("unix:"):
        return None
    rest = listen.removeprefix("unix:")
    if rest.startswith("//"):
        rest = rest[2:]
    path = Path(rest)
    return path if path.is_absolute() else state_dir / path


def _tls(settings: TlsSettings) -> TlsMaterial | None:
    cert, key, ca = settings.cert_file, settings.key_file, settings.client_ca_file
    if not cert and not key:
        if ca:
            raise ConfigError("tls.client_ca_file: mutual TLS needs tls.cert_file and "
                              "tls.key_file too")
        return None
    if not cert or not key:
        missing = "tls.key_file" if cert else "tls.cert_file"
        raise ConfigError(f"{missing}: TLS needs both tls.cert_file and tls.key_file")
    try:
        return load_tls(cert, key, ca)
    except AccessError as exc:
        raise ConfigError(f"tls: {exc}") from None


def _tokens(settings: AuthSettings) -> TokenTable | None:
    path = settings.token_file
    if not path:
        return None
    try:
        return load_tokens(path)
    except AccessError as exc:
        raise ConfigError(f"auth.token_file: {exc}") from None
