"""The console's static files: read once from the package (``static/``), answered from
memory with the headers that keep a page from running anything but its own scripts.

Only the files shipped are served, by exact name (no path is ever joined to the file
system at request time); ``/console`` and ``/console/`` are ``index.html``. Every answer
carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that allows scripts, styles
and requests of this origin only, no inline script or style, no frame, no form, no base
URL; ``nosniff``; no referrer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib import resources

from aiohttp import web

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; font-src 'self'; manifest-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
"""The Content-Security-Policy of every console answer."""

SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}

_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml",
          ".png": "image/png", ".ico": "image/x-icon"}


def load(package: str = "daemon.console", folder: str = "static") -> dict[str, bytes]:
    """Every shipped file of ``package``'s ``folder`` by its name under it (``app.js``,
    ``pages/search.js``), of a type in :data:`_TYPES`."""
    files: dict[str, bytes] = {}

    def walk(node: resources.abc.Traversable, prefix: str) -> None:
        for child in node.iterdir():
            name = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, f"{name}/")
            elif any(name.endswith(ext) for ext in _TYPES):
                files[name] = child.read_bytes()

    walk(resources.files(package).joinpath(folder), "")
    return files


class Pages:
    """The files, answered by path under ``prefix``."""

    def __init__(self, prefix: str, files: Mapping[str, bytes]) -> None:
        self._prefix = prefix
        self._files = dict(files)
        self._etags = {name: '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                       for name, body in self._files.items()}

    def answer(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """The file ``request`` asks for (GET or HEAD), a 304 when its ETag matches;
        None when the path is no file."""
        if request.method not in ("GET", "HEAD"):
            return None
        path = request.path
        name = ("index.html" if path in (self._prefix, self._prefix + "/")
                else path.removeprefix(self._prefix + "/"))
        body = self._files.get(name)
        if body is None:
            return None
        etag = self._etags[name]
        # no-cache: a browser asks again each time (cheap: a 304), so an upgraded daemon's
        # files are never mixed with an old page's.
        headers = {**SECURITY_HEADERS, "ETag": etag, "Cache-Control": "no-cache"}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        content_type = _TYPES[name[name.rfind("."):]]
        return web.Response(body=body,  # aiohttp sends no body to a HEAD
                            headers={**headers, "Content-Type": content_type})
