"""The operator console in the browser (issue 32): the daemon's models, children, metrics,
logs and knowledge base on pages served under ``/console`` of the HTTP listener.

The pages are static files shipped in this package (``static/``: HTML, CSS and plain
JavaScript modules; nothing fetched from another origin, no build step). The token is
typed into the page once, kept in the tab's ``sessionStorage`` and sent by ``fetch`` as
``Authorization: Bearer``: never in a URL, a cookie or the page, so no request changes
state on a cookie alone. Every value from the daemon (a document, a hit, a log line, an
error) is put in the page as text, never as HTML, and the Content-Security-Policy allows
no inline script or style and no other origin (:data:`._pages.CSP`).

The pages call the HTTP API's own routes (search, documents, sources, review, Ask, model
load and unload: the same roles, the same checks); the console adds read-only routes for
what the API has no route for (:mod:`._api`: the node's overview, the metric history,
a child's log lines, a held document's change).

Modules: :mod:`._console` (the mount: pages, routes, the metric sampler), :mod:`._pages`
(the static files and their security headers), :mod:`._api` (the console's routes),
:mod:`._exits` (each child's recent exits).
"""

from ._api import Node
from ._console import PREFIX, Console, console

__all__ = ["PREFIX", "Console", "Node", "console"]
