"""systemd integration: the ``sd_notify`` protocol, spoken directly over a datagram socket.

The protocol (``sd_notify(3)``): when a unit has ``Type=notify`` (or ``WatchdogSec=``),
systemd starts the service with ``NOTIFY_SOCKET`` set to the address of a unix datagram
socket -- a filesystem path, or ``@name`` for the abstract namespace (sent as a leading
NUL byte). The service sends it datagrams of newline-separated ``KEY=VALUE`` assignments:

* ``READY=1`` -- start-up is finished (``Type=notify`` units stay "activating" until then);
  ``MAINPID=`` names the main process.
* ``STATUS=...`` -- one line shown by ``systemctl status``.
* ``STOPPING=1`` -- the service is shutting down; ``TimeoutStopSec=`` runs from here.
* ``RELOADING=1`` -- a reload began; ``READY=1`` ends it. systemd >= 253 also wants
  ``MONOTONIC_USEC=`` (``CLOCK_MONOTONIC``) for ``Type=notify-reload``; older versions
  ignore the extra field.
* ``WATCHDOG=1`` -- a keep-alive. With ``WatchdogSec=``, systemd sets ``WATCHDOG_USEC``
  (and ``WATCHDOG_PID``, the process it is meant for) and kills the service (SIGABRT,
  then ``Restart=`` applies) when no ping arrives within that time. Pinging at half the
  period is the convention.

systemd attaches the sender's credentials itself (``SO_PASSCRED`` on its end), so nothing
else is needed; with ``NotifyAccess=main`` only the main process is listened to. Each
datagram is read into a ``PIPE_BUF`` (4096 bytes) buffer and longer ones are dropped, so
``STATUS=`` is capped well below that. Every send is addressed (``sendto``) rather than
connected, so a ``systemctl daemon-reexec`` that recreates the socket is picked up.

Why watchdog pings come from the event loop: the daemon's failure mode worth a watchdog is
a wedged loop (a blocking call, a runaway callback): gRPC, supervision and health all run
on it. A ping from a thread would keep systemd happy while nothing is served. So
:func:`watchdog_loop` is an ordinary asyncio task: if the loop stops turning, the pings
stop, and systemd restarts the daemon.

Notifications are best-effort: a missing or refusing socket never raises into the daemon.
The first failure is logged as a warning; later ones only at debug level.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import time
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

import structlog

from ..config.inference_mode import InferenceMode

if TYPE_CHECKING:
    from ..models.model import Model

__all__ = ["ENV_VARS", "STATUS_MAX_BYTES", "Notifier", "status_line", "watchdog_loop"]

STATUS_MAX_BYTES = 1024
"""Longest ``STATUS=`` text sent, in UTF-8 bytes (systemd drops datagrams over 4096)."""

ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""The variables systemd sets for the protocol (and ``unset=True`` removes)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _logger() -> structlog.stdlib.BoundLogger:
    # Looked up per instance rather than at import, so a logger configured (or captured,
    # in tests) after import is the one used.
    logger: structlog.stdlib.BoundLogger = structlog.get_logger("llamad.systemd")
    return logger


def _positive_int(raw: str | None) -> int | None:
    try:
        value = int(raw or "")
    except ValueError:
        return None
    return value if value > 0 else None


class Notifier:
    """Sends ``sd_notify`` messages to systemd; does nothing when not run by systemd.

    Every method returns whether the datagram went out. None of them raises or blocks: the
    socket is non-blocking, and a full queue or a vanished socket drops the message (a
    warning is logged the first time). One socket is created on first use and reused.

    Not meant for use from several threads at once (the daemon calls it from its loop).
    """

    def __init__(
        self,
        address: str | None,
        *,
        watchdog_usec: int | None = None,
        watchdog_pid: int | None = None,
    ) -> None:
        """Set up a notifier (no socket is opened until the first message).

        Args:
            address: ``NOTIFY_SOCKET``: an absolute path, or ``@name`` for the abstract
                namespace; None or empty disables the notifier.
            watchdog_usec: ``WATCHDOG_USEC``, the watchdog period in microseconds.
            watchdog_pid: ``WATCHDOG_PID``, the process the watchdog is meant for (None:
                this one).
        """
        self._log = _logger()
        self._address = address or None
        self._target: bytes | None = None
        if address:
            if address.startswith("/"):
                self._target = os.fsencode(address)
            elif address.startswith("@") and len(address) > 1:
                self._target = b"\0" + os.fsencode(address[1:])
            else:
                # e.g. "vsock:..." (systemd >= 254, for VMs): not spoken here.
                self._log.warning("NOTIFY_SOCKET not supported; not notifying systemd",
                                  notify_socket=address)
        self._watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._watchdog_pid = watchdog_pid
        self._sock: socket.socket | None = None
        self._warned = False
        self.failures = 0
        """Messages that could not be sent (for diagnostics and tests)."""

    @classmethod
    def from_env(
        cls, environ: MutableMapping[str, str] | None = None, *, unset: bool = False
    ) -> Notifier:
        """Build from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.

        Args:
            environ: where to read them (default: ``os.environ``).
            unset: remove them from ``environ`` afterwards (like ``sd_notify(3)``'s
                ``unset_environment``), so child processes do not inherit them.
        """
        env = os.environ if environ is None else environ
        notifier = cls(
            env.get("NOTIFY_SOCKET"),
            watchdog_usec=_positive_int(env.get("WATCHDOG_USEC")),
            watchdog_pid=cls._parse_pid(env),
        )
        if unset:
            for name in ENV_VARS:
                env.pop(name, None)
        return notifier

    @staticmethod
    def _parse_pid(env: Mapping[str, str]) -> int | None:
        raw = env.get("WATCHDOG_PID")
        if raw is None:
            return None
        # An unparsable WATCHDOG_PID is treated as meant for someone else (sd_watchdog_enabled
        # refuses it too); -1 never matches a real pid.
        return _positive_int(raw) or -1

    @property
    def enabled(self) -> bool:
        """Whether messages are sent at all (``NOTIFY_SOCKET`` set and supported)."""
        return self._target is not None

    @property
    def address(self) -> str | None:
        """``NOTIFY_SOCKET`` as given."""
        return self._address

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half of ``WATCHDOG_USEC``), or None.

        None when the notifier is disabled, ``WATCHDOG_USEC`` is unset or invalid, or
        ``WATCHDOG_PID`` names another process (the watchdog is not ours to feed).
        """
        if not self.enabled or self._watchdog_usec is None:
            return None
        if self._watchdog_pid is not None and self._watchdog_pid != os.getpid():
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def ready(self) -> bool:
        """``READY=1`` with ``MAINPID``: start-up is complete (also ends a reload)."""
        return self.notify("READY=1", f"MAINPID={os.getpid()}")

    def status(self, text: str) -> bool:
        """``STATUS=text``: control characters become spaces; capped at
        :data:`STATUS_MAX_BYTES` UTF-8 bytes (cut on a character boundary, ``...`` added)."""
        line = _CONTROL.sub(" ", text).strip()
        data = line.encode()
        if len(data) > STATUS_MAX_BYTES:
            line = data[: STATUS_MAX_BYTES - 3].decode(errors="ignore") + "..."
        return self.notify(f"STATUS={line}")

    def stopping(self) -> bool:
        """``STOPPING=1``: shutdown began (systemd's stop timeout runs from here)."""
        return self.notify("STOPPING=1")

    def reloading(self) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC``; send :meth:`ready` when the reload is done."""
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: a keep-alive ping."""
        return self.notify("WATCHDOG=1")

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` assignments in one datagram; never raises.

        Raises:
            ValueError: an assignment contains a newline or NUL (a programming error: it
                would smuggle in another assignment).
        """
        for item in assignments:
            if "\n" in item or "\0" in item or "=" not in item:
                raise ValueError(f"not a single KEY=VALUE assignment: {item!r}")
        if self._target is None:
            return False
        payload = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(payload, self._target)
        except OSError as exc:  # BlockingIOError (queue full) is an OSError too
            self._failed(exc, assignments[0])
            return False
        return True

    def _failed(self, exc: OSError, first: str) -> None:
        self.failures += 1
        level = "debug" if self._warned else "warning"
        self._warned = True
        getattr(self._log, level)(
            "sd_notify failed; systemd may not see this state (further failures at debug)",
            notify_socket=self._address, assignment=first.split("=", 1)[0],
            error=exc.strerror or str(exc),
        )

    def close(self) -> None:
        """Close the socket (a later message opens a new one). Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def watchdog_loop(notifier: Notifier, interval: float) -> None:
    """Send ``WATCHDOG=1`` every ``interval`` seconds, from the event loop, forever.

    Runs until cancelled (cancellation propagates; nothing to clean up). Returns at once
    when the notifier is disabled. Because each ping needs the loop to turn, a loop blocked
    for longer than systemd's ``WatchdogSec`` stops the pings and systemd restarts the
    daemon; a late wake-up (the loop stalled for over 1.5 intervals) is logged as a warning
    first, which is often the only trace of what was blocking.

    Raises:
        ValueError: ``interval`` is not a positive finite number.
    """
    if not (interval > 0 and math.isfinite(interval)):
        raise ValueError(f"watchdog interval must be a positive number of seconds: {interval!r}")
    if not notifier.enabled:
        return
    log = _logger()
    loop = asyncio.get_running_loop()
    while True:
        notifier.watchdog()
        before = loop.time()
        await asyncio.sleep(interval)
        late = loop.time() - before - interval
        if late > interval / 2:
            log.warning("event loop stalled; systemd watchdog pings were late",
                        late_s=round(late, 3), interval_s=interval)


def status_line(models: Mapping[str, Model], *, draining: bool) -> str:
    """The ``STATUS=`` line: each model that may have calls (the registry's
    :meth:`~daemon.models.pool.Pool.every_model`: the roles' by role, then each one loaded
    on demand by name) with its child's state and pid, or its endpoint; "draining" first
    while the daemon drains."""
    parts = ["draining"] if draining else []
    for name, model in models.items():
        sup = model.supervisor
        if model.mode.kind is InferenceMode.DISABLED:
            parts.append(f"{name}: disabled" if model.busy() == 0 else f"{name}: draining")
        elif model.mode.endpoint is not None:
            parts.append(f"{name}: endpoint {model.mode.endpoint.display_url} "
                         f"{sup.state.value}")
        else:
            parts.append(f"{name}: {sup.state.value}"
                         + (f" (pid {sup.pid})" if sup.pid else ""))
    return ", ".join(parts)
