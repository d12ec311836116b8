"""Binding the gRPC server: loopback or remote ``host:port`` (TLS when configured), or a
unix socket created with mode 0660.

A unix socket (``listen = "unix:llamad.sock"``, relative to the state directory, or
``unix:/run/llamad/llamad.sock``) is created under a umask of 0117 and then set to 0660
explicitly, so it is never connectable by others, not even for an instant: only the
daemon's user and group may connect (with systemd, ``Group=`` of the unit). A socket file
left by a daemon that died is replaced; one a live process still listens on is not (gRPC
itself would silently take the path over). The file is removed at shutdown.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from ..config import Config, unix_socket_path

_log = structlog.get_logger("llamad.listen")

SOCKET_MODE = 0o660


@dataclass(frozen=True)
class Bound:
    """Where the server listens: the address clients use, and the socket file (if any)."""

    address: str
    port: int
    socket_path: Path | None = None
    socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we created


def _clear_stale_socket(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"cannot listen on unix:{path}: something that is not a socket is in "
                      "the way")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        _log.info("removing a stale unix socket", path=str(path))
        path.unlink(missing_ok=True)
        return
    except OSError as exc:
        if exc.errno in (errno.ENOENT,):
            return
        raise OSError(f"cannot listen on unix:{path}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise OSError(f"cannot listen on unix:{path}: another process is listening on it")


def bind(server: grpc.aio.Server, config: Config, credentials: Any | None) -> Bound:
    """Add the configured listening port to ``server`` (TLS when ``credentials``).

    Raises:
        OSError: the address cannot be bound (one line naming it).
    """
    listen = config.settings.listen
    path = unix_socket_path(listen, config.state_dir)
    target = listen
    if path is not None:
        path = path.absolute()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        _clear_stale_socket(path)
        target = f"unix:{path}"
    old_umask = os.umask(0o117) if path is not None else None
    try:
        if credentials is not None:
            port = server.add_secure_port(target, credentials)
        else:
            port = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {listen}: {exc}") from None
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if path is None:
        host = listen.rpartition(":")[0]
        return Bound(f"{host}:{port}", port)
    try:
        os.chmod(path, SOCKET_MODE)
        st = path.lstat()
    except OSError as exc:
        raise OSError(f"cannot listen on {target}: {exc.strerror or exc}") from None
    return Bound(target, port, path, (st.st_dev, st.st_ino))


def unbind(bound: Bound | None) -> None:
    """Remove the socket file this daemon created (not one that replaced it since)."""
    if bound is None or bound.socket_path is None:
        return
    try:
        st = bound.socket_path.lstat()
        if (st.st_dev, st.st_ino) == bound.socket_id:
            bound.socket_path.unlink()
    except OSError:
        pass
