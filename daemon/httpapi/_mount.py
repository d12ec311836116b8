"""What the HTTP listener serves beside its API under a path of its own (a
:class:`Mount`): the operator console (:mod:`daemon.console`) is one, made by the server
above this package and handed to :class:`~._server.HttpApi`, so that this package never
imports it.

A mount answers two kinds of request. Its pages (:meth:`Mount.page`) are answered
before any token is asked for: they are the same static files for everyone and carry no
data. Its routes (:meth:`Mount.route`) go through the same frame as every API route: the
token and the role of the gRPC method they stand for, the summary line, the metrics.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from ._routes import Route


class Mount(Protocol):
    """Pages and routes served under :attr:`prefix` (module docstring)."""

    prefix: str
    """The mount's path (``/console``): it owns that path and every path under it."""

    def page(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """The answer to a request for one of its pages (no token asked); None: not a
        page (one of its routes, or nothing: a 404 from the frame)."""

    def route(self, path: str, method: str) -> Route | None:
        """As :func:`~._routes.route_of`, for the mount's routes."""

    def methods(self, path: str) -> tuple[str, ...]:
        """As :func:`~._routes.methods_of`, for the mount's routes."""

    async def start(self) -> None:
        """Called when the listener starts (its background work begins)."""

    async def stop(self) -> None:
        """Called when the listener stops."""


def owns(mount: Mount | None, path: str) -> bool:
    """Whether ``path`` is ``mount``'s."""
    return mount is not None and (path == mount.prefix
                                  or path.startswith(mount.prefix + "/"))
