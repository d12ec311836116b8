"""The console's server side without a browser: its static files and their headers
(:mod:`daemon.console._pages`), the metric history its Metrics page draws
(:mod:`daemon.telemetry.history`), the bounded diff its Review page shows
(:mod:`daemon.services.review`), and a mount in the HTTP listener's frame. The pages in
a browser: tests/integration/test_console.py.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from daemon.config.access import load_tokens
from daemon.console import _pages
from daemon.grpcapi.rpc import Call
from daemon.httpapi import Api, Route, json_response
from daemon.httpapi._parse import Body
from daemon.services import review
from daemon.telemetry.history import WANTED, MetricHistory, quantile
from daemon.telemetry.metrics import Metrics
from tests.support.httpapi import client, serving

# -- the static files ---------------------------------------------------------------------


def test_shipped_files_are_the_pages_and_nothing_else() -> None:
    """The package ships the page, its stylesheet, its scripts and icon: each page
    module the app routes to, and no Python source."""
    files = _pages.load()
    assert {"index.html", "app.js", "chart.js", "console.css", "icon.svg"} <= set(files)
    routed = re.findall(r'id: "([a-z]+)", title:', files["app.js"].decode())
    assert {f"pages/{p}.js" for p in routed} <= set(files)
    assert len(routed) == 7
    assert not [n for n in files if n.endswith(".py")]


def test_no_page_builds_html_from_text() -> None:
    """No script of the console writes HTML from a string (innerHTML, outerHTML,
    insertAdjacentHTML, document.write, eval) and the page has no inline script or
    style: what the daemon sends can only ever become text."""
    for name, body in _pages.load().items():
        text = body.decode()
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                       "eval(", "new Function", "setAttribute(\"style", "javascript:"):
            assert banned not in text, (name, banned)
        if name.endswith(".html"):
            assert "<style" not in text and " style=" not in text
            assert re.findall(r"<script[^>]*>", text) == [
                '<script type="module" src="/console/app.js">']


def _get(pages: _pages.Pages, path: str, method: str = "GET",
         headers: dict[str, str] | None = None) -> web.StreamResponse | None:
    return pages.answer(make_mocked_request(method, path, headers=headers or {}))


@pytest.fixture
def pages() -> _pages.Pages:
    return _pages.Pages("/console", {"index.html": b"<!doctype html>", "app.js": b"1;",
                                    "pages/a.js": b"2;"})


def test_pages_by_exact_name_with_security_headers(pages: _pages.Pages) -> None:
    """/console and /console/ are the index; a file by its name with its type, the CSP,
    nosniff and no referrer; any other path (traversal, the folder's name, another
    method) is no page."""
    for path in ("/console", "/console/"):
        index = _get(pages, path)
        assert isinstance(index, web.Response) and index.body == b"<!doctype html>"
        assert index.content_type == "text/html"
    script = _get(pages, "/console/pages/a.js")
    assert isinstance(script, web.Response)
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    for name, value in _pages.SECURITY_HEADERS.items():
        assert script.headers[name] == value
    csp = script.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "'unsafe-inline'" not in csp
    assert "frame-ancestors 'none'" in csp and "form-action 'none'" in csp
    for path in ("/console/../app.js", "/console/static/app.js", "/console//app.js",
                 "/console/pages", "/console/missing.js", "/console/api/overview"):
        assert _get(pages, path) is None, path
    assert _get(pages, "/console/app.js", method="POST") is None


def test_etag_answers_not_modified(pages: _pages.Pages) -> None:
    """A file asked again with its ETag is a 304 without a body, still with the CSP."""
    first = _get(pages, "/console/app.js")
    assert first is not None
    again = _get(pages, "/console/app.js", headers={"If-None-Match": first.headers["ETag"]})
    assert again is not None and again.status == 304
    assert "Content-Security-Policy" in again.headers


# -- the metric history -------------------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket() -> None:
    """As Prometheus's histogram_quantile: linear inside the bucket holding the rank; the
    +Inf bucket answers the last finite bound; no observation: None."""
    buckets = {0.1: 0.0, 0.5: 10.0, 1.0: 20.0, float("inf"): 20.0}
    assert quantile(0.5, buckets) == pytest.approx(0.5)
    assert quantile(0.25, buckets) == pytest.approx(0.3)
    assert quantile(0.95, buckets) == pytest.approx(0.95)
    assert quantile(0.99, {1.0: 0.0, float("inf"): 4.0}) == 1.0
    assert quantile(0.5, {1.0: 0.0, float("inf"): 0.0}) is None


@pytest.mark.parametrize("restricted", [False, True], ids=["registry", "wanted-only"])
def test_history_samples_each_interval_from_the_metrics(restricted: bool) -> None:
    """Each sample holds what happened since the one before: tokens per second, the
    interval's TTFT quantiles (None when no call streamed), the queue at the sample,
    errors and refusals; the catalog's models only; the ring keeps window/interval.
    The same from the whole registry and from its WANTED families only (the daemon's)."""
    metrics = Metrics(models={"gen": "generation", "emb": "embedding"})
    now = [1000.0]
    collect = (metrics.registry.restricted_registry(WANTED).collect if restricted
               else metrics.registry.collect)
    history = MetricHistory(collect, interval=5, window=15,
                            models=lambda: ["gen", "emb"], clock=lambda: now[0])
    assert history.sample() is None  # the baseline
    metrics.tokens("generation", 50, "gen")
    for seconds in (0.2, 0.2, 0.2, 3.0):
        metrics.time_to_first_token("generation", seconds, "gen")
    metrics.queue_depth("generation", 3, "gen")
    metrics.call("generation", "gen", "error")
    metrics.rejected("generation", "queue_full", "gen")
    now[0] += 5
    first = history.sample()
    assert first is not None and set(first.models) == {"gen", "emb"}
    gen = first.models["gen"]
    assert gen.tokens_per_s == pytest.approx(10.0)
    assert gen.ttft_p50 is not None and 0.1 < gen.ttft_p50 <= 0.25
    assert gen.ttft_p95 is not None and 2.5 < gen.ttft_p95 <= 5.0
    assert (gen.queue, gen.errors) == (3, 2)
    now[0] += 5
    quiet = history.sample()
    assert quiet is not None
    assert quiet.models["gen"].tokens_per_s == 0.0
    assert quiet.models["gen"].ttft_p50 is None and quiet.models["gen"].errors == 0
    for _ in range(5):
        now[0] += 5
        history.sample()
    kept = history.samples()
    assert len(kept) == 3 and kept[-1].at == now[0]
    assert history.samples(since=now[0] - 5) == [kept[-1]]
    assert kept[-1].to_json()["models"]["gen"]["queue"] == 3


# -- the review diff ----------------------------------------------------------------------


def test_review_diff_marks_changes_and_stays_bounded() -> None:
    """The held text against the indexed one as +/- lines; a 2 MB line is cut and says
    how much is left out; past the line limit the rest is counted."""
    lines, left = review.diff("a\nb\nc\n", "a\nB\nc\n")
    assert "-b" in lines and "+B" in lines and left == 0
    long = "x" * 2_000_000
    lines, left = review.diff("", f"{long}\n")
    assert lines[-1].startswith("+xxx") and lines[-1].endswith(
        f"[... {2_000_001 - review.MAX_LINE_CHARS} more characters]")
    many = "\n".join(str(i) for i in range(review.MAX_DIFF_LINES + 50))
    lines, left = review.diff("", many)
    assert len(lines) == review.MAX_DIFF_LINES and left == 51


def test_every_static_file_is_package_data() -> None:
    """Each file under daemon/console/static matches a package-data glob of pyproject.toml,
    so the wheel (and so an installed daemon) serves the same pages as the source tree."""
    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["daemon.console"]
    package = root / "daemon" / "console"
    for path in (package / "static").rglob("*"):
        if path.is_file():
            name = path.relative_to(package).as_posix()
            assert any(fnmatch.fnmatch(name, g) and name.count("/") == g.count("/")
                       for g in globs), name


# -- the mount in the HTTP listener's frame -----------------------------------------------


class _Mount:
    """A mount of one page and one admin route (TailLogs'), counting its starts."""

    prefix = "/console"

    def __init__(self) -> None:
        self.pages = _pages.Pages(self.prefix, {"index.html": b"<!doctype html>"})
        self.running = 0

        async def handler(api: Api, request: web.BaseRequest, call: Call,
                          body: Body) -> web.StreamResponse:
            return json_response(request, {"ok": True})

        self.admin = Route("GET", "/llamad.v1.ControlService/TailLogs", "TailLogs", handler,
                           reads_body=False)

    def page(self, request: web.BaseRequest) -> web.StreamResponse | None:
        return self.pages.answer(request)

    def route(self, path: str, method: str) -> Route | None:
        return self.admin if path == "/console/api/logs" else None

    def methods(self, path: str) -> tuple[str, ...]:
        return ("GET",) if path == "/console/api/logs" else ()

    async def start(self) -> None:
        self.running += 1

    async def stop(self) -> None:
        self.running -= 1


async def test_the_frame_serves_a_mount_beside_the_api(tmp_path: Path) -> None:
    """Its pages need no token; its routes need the role of the RPC they stand for (a
    read token is refused 403, admin passes), a wrong method is 405 naming the right one,
    an unknown path under it 404; it runs while the listener does."""
    path = tmp_path / "tokens"
    path.write_text(f"read {'r' * 20}\nadmin {'a' * 20}\n")
    path.chmod(0o600)
    mount = _Mount()
    async with serving(tokens=load_tokens(path), mount=mount) as h, client() as http:
        assert mount.running == 1
        page = await http.get(h.url + "/console/")
        none = await http.get(h.url + "/console/api/logs")
        read = await http.get(h.url + "/console/api/logs", headers={
            "Authorization": f"Bearer {'r' * 20}"})
        admin = await http.get(h.url + "/console/api/logs", headers={
            "Authorization": f"Bearer {'a' * 20}"})
        post = await http.post(h.url + "/console/api/logs", headers={
            "Authorization": f"Bearer {'a' * 20}"})
        other = await http.get(h.url + "/console/api/other", headers={
            "Authorization": f"Bearer {'a' * 20}"})
        api = await http.get(h.url + "/v1/models", headers={
            "Authorization": f"Bearer {'r' * 20}"})
    assert mount.running == 0
    assert page.status_code == 200 and page.headers["content-security-policy"] == _pages.CSP
    assert (none.status_code, read.status_code, admin.status_code) == (401, 403, 200)
    assert post.status_code == 405 and "GET" in post.json()["error"]["message"]
    assert other.status_code == 404 and api.status_code == 200


async def test_without_a_mount_there_is_no_console() -> None:
    """A listener without the console (console.enabled off) answers /console 404."""
    async with serving() as h, client() as http:
        assert (await http.get(h.url + "/console/")).status_code == 404
