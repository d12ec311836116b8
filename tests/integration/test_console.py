"""The operator console (issue 32) in a real browser against a real daemon: Debian's
chromium driven by Playwright through its executable path (no browser is downloaded), the
daemon with real llama-server children, bearer tokens required.

Each page is opened with real data (documents pushed and searched, a streamed chat, the
children's own log lines), clicked and typed into as a person would, at 1280x800 and
390x844. Screenshots of each page go to ``$LLAMAD_SCREENSHOTS`` when set (``docs/console``
for the README), else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, Request, async_playwright, expect

from daemon import Daemon
from tests.conftest import DEFAULT_MODEL, models_dir
from tests.support.http_daemon import ADMIN, GEN_ID, READ, auth, http_daemon

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

CHROMIUM = "/usr/bin/chromium"
PAGES = ("overview", "metrics", "logs", "kb", "search", "review", "ask")
HOSTILE = ("# Hostile wombat page\n\n<script>window.__pwned = 'script'; alert(1)</script>\n\n"
           "[click me](javascript:window.__pwned='link')\n\n"
           "<svg xmlns='http://www.w3.org/2000/svg' onload=\"window.__pwned='svg'\">"
           "<script>window.__pwned='svg-script'</script></svg>\n\n"
           "<img src=x onerror=\"window.__pwned='img'\">\n\nThe quetzal hostile marker.\n")
LONG_LINE = "x" * (2 * 1024 * 1024)


class Running(NamedTuple):
    daemon: Daemon
    base: str
    handbook: Path
    """A directory the daemon may index (retrieval.allowed_roots)."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Running]:
    """A daemon sampling its metrics every second, with a push source of documents, one
    hostile document indexed and one held for review."""
    handbook = tmp_path_factory.mktemp("handbook")
    (handbook / "restore.md").write_text("# Restores\n\nRestore the okapi database from "
                                         "the nightly dump with pg_restore.\n")
    (handbook / "oncall.md").write_text("# On call\n\nThe on-call rota changes on Monday.\n")
    async with http_daemon(tmp_path_factory.mktemp("state"),
                           LLAMAD_CONSOLE_SAMPLE_INTERVAL="1",
                           LLAMAD_MODELS_DIR=str(models_dir()),  # the catalog: gemma too
                           LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(handbook)) as daemon:
        base = f"http://127.0.0.1:{daemon.http_port}"
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=120) as http:
            for source in ("runbooks", "hostile"):
                r = await http.post("/v1/llamad/sources", headers=auth(ADMIN),
                                    json={"id": source})
                assert r.status_code == 200, r.text
            await _push(http, "runbooks", "runbooks/backup.md", "Backups",
                        "# Backups\n\nThe wombat backups run nightly at 02:00 on web01.\n")
            await _push(http, "hostile", "hostile/page.md", "<script>alert('title')</script>",
                        HOSTILE)
            await _push(http, "hostile", "hostile/long.txt", "A very long line",
                        f"A line of two mebibytes follows.\n{LONG_LINE}\n<script>alert(2)"
                        "</script>\n", review=True)
            await _embedded(http)
            await _chat(http)
        yield Running(daemon, base, handbook)


async def _chat(http: httpx.AsyncClient) -> None:
    """A streamed chat: tokens and a time to first token in the metric history, lines in
    the generation child's log."""
    async with http.stream("POST", "/v1/chat/completions", headers=auth(READ), json={
            "model": GEN_ID, "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]}) as stream:
        assert stream.status_code == 200
        async for _ in stream.aiter_lines():
            pass


async def _embedded(http: httpx.AsyncClient) -> None:
    """Wait until every chunk has its vector (an ingest whose embedding fails, the child
    unavailable a moment, leaves the document text-only until the background backfill
    embeds it): the Search page then shows both ranks."""
    deadline = time.monotonic() + 120
    while True:
        status = (await http.get("/v1/llamad/status", headers=auth(READ))).json()
        if int(status.get("embedded_chunks", 0)) >= int(status.get("chunks", 0)):
            return
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.2)


async def _push(http: httpx.AsyncClient, source: str, doc_id: str, title: str, text: str,
                *, review: bool = False) -> dict[str, Any]:
    r = await http.post("/v1/llamad/documents", headers=auth(ADMIN), json={
        "source_id": source, "id": doc_id, "title": title, "text": text, "kind": "text",
        "review": review})
    assert r.status_code == 200, r.text[:500]
    return dict(r.json()["document"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    assert os.access(CHROMIUM, os.X_OK), ("Debian's chromium is missing: `make test-tools` "
                                          "installs it (apt-get install chromium)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        await launched.close()


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("LLAMAD_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Watched:
    """A page whose requests, console messages and dialogs are recorded."""

    def __init__(self, page: Page, base: str) -> None:
        self.page = page
        self.base = base
        self.urls: list[str] = []
        self.request_headers: list[dict[str, str]] = []
        self.console: list[str] = []
        self.dialogs: list[str] = []
        page.on("request", self._request)
        page.on("console", lambda m: self.console.append(m.text))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        page.on("dialog", self._dialog)

    def _request(self, request: Request) -> None:
        self.urls.append(request.url)
        self.request_headers.append(request.headers)

    async def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        await dialog.dismiss()

    async def sign_in(self, token: str) -> None:
        await self.page.goto(f"{self.base}/console/")
        await self.page.locator("#token").fill(token)
        await self.page.keyboard.press("Enter")
        await self.ready("overview")

    async def ready(self, page_id: str) -> None:
        await expect(self.page.locator("main")).to_have_attribute("data-ready", page_id,
                                                                  timeout=30_000)

    async def open(self, page_id: str) -> None:
        await self.page.locator(f"#nav a[href='#/{page_id}']").click()
        await self.ready(page_id)

    async def search(self, query: str, mode: str = "") -> None:
        """Search from the Search page, by the keyboard's Enter."""
        await self.open("search")
        await self.page.locator("#q").fill(query)
        if mode:
            await self.page.locator("#mode").select_option(mode)
        await self.page.keyboard.press("Enter")

    def check_clean(self, token: str) -> None:
        """Nothing ran that the page did not: no dialog, no CSP violation, no script
        error; every request to this daemon, none with the token in its URL, none with a
        cookie; the token sent as an Authorization header."""
        assert self.dialogs == []
        assert not [m for m in self.console if "Content Security Policy" in m
                    or m.startswith("pageerror")], self.console
        assert self.urls and all(u.startswith(self.base) for u in self.urls), self.urls
        assert not [u for u in self.urls if token in u]
        assert not [h for h in self.request_headers if "cookie" in h]
        assert f"Bearer {token}" in [h.get("authorization") for h in self.request_headers]


@pytest_asyncio.fixture(loop_scope="module")
async def admin_page(running: Running, browser: Browser
                     ) -> AsyncIterator[Watched]:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    watched = Watched(await context.new_page(), running.base)
    await watched.sign_in(ADMIN)
    yield watched
    assert await context.cookies() == []  # the console sets none
    watched.check_clean(ADMIN)
    await context.close()


async def test_pages_render_real_data(admin_page: Watched, running: Running,
                                      tmp_path: Path) -> None:
    """Every page shows the daemon's own data: models and children with their pids, the
    metric charts with the chat's tokens, a child's log lines, the sources and documents
    (a directory source added and reindexed from the page), search hits with both ranks,
    the held document's change, a streamed answer with its sources; each page is
    photographed."""
    page, shots = admin_page.page, _shots(tmp_path)
    handbook = running.handbook
    main = page.locator("main")
    await expect(main).to_contain_text(GEN_ID)
    await expect(page.locator("td", has_text=re.compile(r"^\d+$")).first).to_be_visible()
    await expect(page.locator("button", has_text="Unload").first).to_be_visible()
    await page.screenshot(path=shots / "overview.png")

    await admin_page.open("metrics")
    await expect(page.locator("#chart-tokens polyline").first).to_be_attached(timeout=15_000)
    await expect(page.locator("#chart-tokens .legend")).to_contain_text(GEN_ID)
    ttft = page.locator("#chart-ttft polyline, #chart-ttft circle")
    await expect(ttft.first).to_be_attached()
    await page.screenshot(path=shots / "metrics.png")

    await admin_page.open("logs")
    await expect(page.locator(".logs div").first).to_be_visible()
    before = await page.locator(".logs div").count()
    async with httpx.AsyncClient(base_url=running.base, trust_env=False, timeout=120) as http:
        await _chat(http)  # the child logs its timings: the page follows them
    await expect(page.locator(".logs div").nth(before)).to_be_attached(timeout=15_000)
    await page.screenshot(path=shots / "logs.png")

    await admin_page.open("kb")
    await expect(main).to_contain_text("runbooks/backup.md")
    await expect(main).to_contain_text("review_required")
    # A directory source added with the page's form, reindexed with its progress shown.
    await page.locator("#src-id").fill("handbook")
    await page.locator("#src-path").fill(str(handbook))
    await page.locator("#src-tags").fill("ops, restore")
    await page.locator("button", has_text="Add source").click()
    await expect(page.locator("tr", has_text="handbook")).to_contain_text(str(handbook))
    await page.locator("button[data-key='reindex-handbook']").click()
    await expect(page.locator("#reindex-progress")).to_contain_text(
        "Reindexed handbook: 2 seen", timeout=60_000)
    await expect(main).to_contain_text("restore.md")
    await page.screenshot(path=shots / "kb.png")

    await admin_page.search("wombat backups nightly")
    hit = page.locator(".hit[data-doc='runbooks/backup.md']")
    await expect(hit).to_contain_text("text rank #")
    await expect(hit).to_contain_text("vector rank #")
    await expect(hit).to_contain_text("section:")
    await page.screenshot(path=shots / "search.png")

    await admin_page.open("review")
    held = page.locator("article[data-doc='hostile/long.txt']")
    await expect(held.locator(".diff .add").first).to_be_visible()
    await page.screenshot(path=shots / "review.png")

    await admin_page.open("ask")
    await page.locator("#question").fill("When do the wombat backups run?")
    await page.locator("#max-tokens").fill("16")
    await page.locator("button[type=submit]").click()
    await expect(page.locator("#answer")).to_have_attribute("data-finished", "true",
                                                             timeout=120_000)
    assert (await page.locator("#answer").inner_text()).strip()
    await expect(page.locator("#ask-extra")).to_contain_text("runbooks/backup.md")
    await page.screenshot(path=shots / "ask.png")

    await page.locator("#dry-run").check()
    await page.locator("button[type=submit]").click()
    await expect(page.locator("#ask-extra")).to_contain_text("What would be sent",
                                                             timeout=60_000)
    await page.screenshot(path=shots / "ask-dry-run.png")


async def test_hostile_document_renders_as_text(admin_page: Watched) -> None:
    """A document with a script, a javascript: link, an SVG with script and an onerror
    image shows them as text on the Search, Knowledge base and Review pages, and none
    runs; its 2 MB line is shown cut, the page still usable."""
    page = admin_page.page
    await admin_page.search("quetzal hostile marker")
    hit = page.locator(".hit[data-doc='hostile/page.md']")
    await expect(hit).to_contain_text("<script>window.__pwned = 'script'")
    await expect(hit).to_contain_text("javascript:window.__pwned='link'")
    await expect(hit).to_contain_text("<svg xmlns=")
    await expect(hit.locator("h3")).to_contain_text("<script>alert('title')</script>")
    await admin_page.open("kb")
    await expect(page.locator("main")).to_contain_text("<script>alert('title')</script>")
    await admin_page.open("review")
    held = page.locator("article[data-doc='hostile/long.txt']")
    await expect(held).to_contain_text("more characters]")
    await expect(held).to_contain_text("<script>alert(2)</script>")
    assert await page.evaluate("window.__pwned") is None
    # Only the console's own scripts, no element from a document, no link out.
    sources = await page.evaluate("[...document.scripts].map(s => s.src)")
    assert sources == [f"{admin_page.base}/console/app.js"]
    assert await page.locator("main svg, main img, main iframe, main a").count() == 0
    width = await page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= 1280


async def test_review_approval_makes_the_document_searchable(
        admin_page: Watched, running: Running) -> None:
    """A runbook held for review is not found; approved on the Review page with a note, the
    Search page finds it by a word only it has. A changed version of an indexed document
    is shown as its change (the indexed line removed, the held one added), and rejected
    with a note."""
    base = running.base
    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=120) as http:
        await _push(http, "runbooks", "runbooks/disk.md", "Disk full",
                    "# Disk full\n\nWhen the zanzibar partition fills, rotate the logs.\n",
                    review=True)
        await _push(http, "runbooks", "runbooks/backup.md", "Backups",
                    "# Backups\n\nThe wombat backups run hourly on web01.\n", review=True)
    page = admin_page.page
    await admin_page.search("zanzibar", "SEARCH_MODE_TEXT")
    await expect(page.locator("#results")).to_contain_text("0 hits")

    await admin_page.open("review")
    changed = page.locator("article[data-doc='runbooks/backup.md'] .diff")
    await expect(changed.locator(".del")).to_contain_text(["nightly at 02:00"])
    await expect(changed.locator(".add")).to_contain_text(["hourly"])
    held = page.locator("article[data-doc='runbooks/disk.md']")
    await expect(held.locator(".diff")).to_contain_text("+When the zanzibar partition")
    await held.locator("textarea").fill("checked by the console test")
    await held.locator("button", has_text="Approve").click()
    await expect(page.locator("article[data-doc='runbooks/disk.md']")).to_have_count(0)

    await admin_page.search("zanzibar", "SEARCH_MODE_TEXT")
    await expect(page.locator(".hit[data-doc='runbooks/disk.md']")).to_be_visible()

    await admin_page.open("review")
    backup = page.locator("article[data-doc='runbooks/backup.md']")
    await backup.locator("textarea").fill("hourly is wrong")
    await backup.locator("button", has_text="Reject").click()
    await expect(backup).to_have_count(0)
    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=120) as http:
        doc = (await http.get("/v1/llamad/document", params={"id": "runbooks/backup.md"},
                              headers=auth(READ))).json()
    assert (doc["state"], doc["review_note"]) == ("DOCUMENT_STATE_REJECTED", "hourly is wrong")


async def test_read_token_sees_no_admin_control(running: Running, browser: Browser,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A read token's pages have no Logs page, no load, unload, source, reindex,
    reprocess, approve or reject control; the same admin call made through the console's
    own code is refused by the daemon (403), logged as denied without the token, and
    changes nothing."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    watched = Watched(await context.new_page(), running.base)
    page = watched.page
    await watched.sign_in(READ)
    await expect(page.locator("#who")).to_contain_text("read")
    await expect(page.locator("#nav a[href='#/logs']")).to_have_count(0)
    await expect(page.locator("main")).to_contain_text(GEN_ID)
    assert await page.locator("main button").count() == 0
    for page_id in ("kb", "review"):
        await watched.open(page_id)
        assert await page.locator("main button, main form").count() == 0, page_id
    forged = await page.evaluate("""async (model) => {
        const app = await import('/console/app.js');
        const answers = [];
        for (const [path, body] of [['/v1/llamad/models/unload', {name: model}],
                                    ['/v1/llamad/review/approve', {id: 'hostile/long.txt'}],
                                    ['/v1/llamad/sources', {id: 'forged'}]]) {
            try { await app.call(path, {method: 'POST', body}); answers.push('accepted'); }
            catch (e) { answers.push(e.status + ' ' + e.message); }
        }
        try { await app.json('/console/api/logs'); answers.push('accepted'); }
        catch (e) { answers.push(e.status + ' ' + e.message); }
        return answers;
    }""", GEN_ID)
    assert all(a.startswith("403 ") for a in forged), forged
    async with httpx.AsyncClient(base_url=running.base, trust_env=False) as http:
        held = (await http.get("/v1/llamad/review", headers=auth(READ))).json()
        assert "hostile/long.txt" in [d["id"] for d in held["documents"]]
        listed = (await http.get("/v1/llamad/sources", headers=auth(READ))).json()
        assert "forged" not in [s["id"] for s in listed["sources"]]
    watched.check_clean(READ)
    await context.close()
    logged = capsys.readouterr()
    assert "access denied" in logged.out and "route=/console/api/overview" in logged.out
    assert READ not in logged.out + logged.err


async def test_phone_size_and_keyboard(running: Running, browser: Browser,
                                       tmp_path: Path) -> None:
    """At 390x844 every page fits the width (tables scroll inside their box); the whole
    console works from the keyboard: sign in, reach Search by Tab, search with Enter; the
    token survives a reload of the tab and is gone after Sign out."""
    context = await browser.new_context(viewport={"width": 390, "height": 844},
                                        is_mobile=True, has_touch=True)
    watched = Watched(await context.new_page(), running.base)
    page, shots = watched.page, _shots(tmp_path)
    await page.goto(f"{watched.base}/console/")
    await expect(page.locator("#token")).to_be_focused()
    await page.keyboard.type(ADMIN)
    await page.keyboard.press("Enter")
    await watched.ready("overview")
    await page.reload()  # the token is kept: a fresh page, the keyboard at its start
    await watched.ready("overview")
    await page.keyboard.press("Tab")  # the first stop: past the navigation, to the page
    await expect(page.locator("#skip")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("#main")).to_be_focused()
    for page_id in PAGES:
        await page.evaluate(f"window.location.hash = '#/{page_id}'")
        await watched.ready(page_id)
        width = await page.evaluate("document.scrollingElement.scrollWidth")
        assert width <= 390, (page_id, width)
        await page.screenshot(path=shots / f"phone-{page_id}.png", full_page=False)
    await page.evaluate("window.location.hash = '#/overview'")
    await watched.ready("overview")
    await page.locator("#main").focus()
    for _ in range(40):  # Shift+Tab back into the navigation until Search has the focus
        await page.keyboard.press("Shift+Tab")
        if await page.evaluate("document.activeElement.getAttribute('href')") == "#/search":
            break
    else:
        pytest.fail("the Search link was never reached by the keyboard")
    await page.keyboard.press("Enter")
    await watched.ready("search")
    await expect(page.locator("#q")).to_be_focused()
    await page.keyboard.type("wombat backups")
    await page.keyboard.press("Enter")
    await expect(page.locator(".hit").first).to_be_visible()
    # Sign out forgets the token.
    await page.locator("#who button", has_text="Sign out").click()
    await expect(page.locator("#token")).to_be_visible()
    assert await page.evaluate("window.sessionStorage.length") == 0
    watched.check_clean(ADMIN)
    await context.close()


async def test_served_files_and_headers(running: Running) -> None:
    """The pages are served without a token with the CSP and the other headers; the
    console's data needs one; nothing outside the shipped files is served."""
    async with httpx.AsyncClient(base_url=running.base, trust_env=False) as http:
        for path in ("/console", "/console/", "/console/app.js", "/console/console.css"):
            r = await http.get(path)
            assert r.status_code == 200, path
            csp = r.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp
            assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer"
            assert "set-cookie" not in r.headers
        assert (await http.get("/console/app.js")).headers["content-type"].startswith(
            "text/javascript")
        for path in ("/console/../pyproject.toml", "/console/%2e%2e/daemon/server.py",
                     "/console/_pages.py", "/console/static/app.js", "/console/api/x"):
            assert (await http.get(path)).status_code == 404, path
        assert (await http.get("/console/api/overview")).status_code == 401
        r = await http.get("/console/api/overview", headers=auth(READ))
        assert r.status_code == 200 and r.json()["admin"] is False
        assert (await http.get("/console/api/overview",
                               headers=auth(ADMIN))).json()["admin"] is True
        assert (await http.post("/console/api/overview", headers=auth(READ))).status_code \
            == 405


async def test_overview_shows_a_childs_exit(admin_page: Watched,
                                            running: Running) -> None:
    """The embedding child killed by SIGKILL: the Overview shows the exit with its cause
    and a restart, and the new child's pid, without a reload of the page."""
    daemon = running.daemon
    page = admin_page.page
    child = daemon.pool.of_role("embedding").supervisor
    old = child.pid
    assert old
    os.kill(old, signal.SIGKILL)
    await admin_page.open("overview")
    row = page.locator("tr", has=page.locator("strong", has_text=re.compile("^embedding$")))
    await expect(row).to_contain_text("SIGKILL", timeout=30_000)
    await expect(row.locator("td").nth(7)).not_to_have_text("0")  # restarts
    await expect(row).to_contain_text("running", timeout=60_000)
    assert child.pid and child.pid != old


async def test_admin_loads_and_unloads_a_model_from_the_overview(admin_page: Watched) -> None:
    """Load on a catalog model no role serves makes it resident (its state ready, a child
    of its own listed), Unload takes it out again, both from the Overview's buttons."""
    page = admin_page.page
    name = DEFAULT_MODEL.removesuffix(".gguf")
    await admin_page.open("overview")
    models = page.locator("table").first
    row = models.locator("tr", has=page.locator("strong", has_text=re.compile(f"^{name}$")))
    await expect(row).to_contain_text("unloaded")
    await row.locator(f"button[data-key='load-{name}']").click()
    await expect(row).to_contain_text("ready", timeout=120_000)
    await expect(row.locator("td").nth(3)).to_have_text("yes")
    children = page.locator("table").nth(1)
    await expect(children).to_contain_text(name)
    await row.locator(f"button[data-key='unload-{name}']").focus()
    await page.keyboard.press("Enter")
    await expect(row).to_contain_text("unloaded", timeout=60_000)
    await expect(children).not_to_contain_text(name, timeout=30_000)
