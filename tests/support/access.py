"""What the access tests share (tests/integration/test_access_*.py): role tokens and token
files written as operators write them (mode 0600), the environment of a daemon with both
children disabled (fast, and enough for access checks), with or without TLS, and starting
such daemons in-process.
"""

from __future__ import annotations

from pathlib import Path

from daemon import Daemon, load
from tests.support.daemon import config_env
from tests.support.pki import Issued

READ_TOKEN = "read-0123456789abcdef-read"
ADMIN_TOKEN = "admin-fedcba9876543210-admin"


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def token_files(d: Path) -> tuple[Path, Path, Path]:
    """The daemon's token file, and one client token file per role."""
    tokens = private(d / "tokens", f"# role token\nread {READ_TOKEN}\n\nadmin {ADMIN_TOKEN}\n")
    return (tokens, private(d / "read.token", READ_TOKEN + "\n"),
            private(d / "admin.token", f"# deploy pipeline\n{ADMIN_TOKEN}\n"))


def quiet_env(**overrides: str) -> dict[str, str]:
    """A daemon with both children disabled: fast, and enough for access checks."""
    return config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                      LLAMAD_EMBEDDING_ENABLED="false", **overrides)


def tls_env(cert: Issued, **overrides: str) -> dict[str, str]:
    return quiet_env(**{"LLAMAD_TLS_CERT_FILE": str(cert.cert),
                        "LLAMAD_TLS_KEY_FILE": str(cert.key), **overrides})


async def start(started: list[Daemon], env: dict[str, str], *, reload: bool = False) -> Daemon:
    daemon = Daemon(load(None, env=env), reload=(lambda: load(None, env=env)) if reload else None)
    started.append(daemon)
    await daemon.start()
    return daemon


def port_of(daemon: Daemon) -> int:
    return int(daemon.address.rpartition(":")[2])
