// The llamad console: the token, calls to the daemon, safe DOM building and the pages'
// routing. Everything the daemon sends (a document, a hit, a log line, an error) goes into
// the page as text (textContent, text nodes): never as HTML.

const TOKEN_KEY = "llamad.console.token";

export const PAGES = [
  { id: "overview", title: "Overview" },
  { id: "metrics", title: "Metrics" },
  { id: "logs", title: "Logs", admin: true },
  { id: "kb", title: "Knowledge base" },
  { id: "search", title: "Search" },
  { id: "review", title: "Review" },
  { id: "ask", title: "Ask" },
];

// -- the DOM, as text ---------------------------------------------------------------------

const SAFE_ATTRIBUTES = new Set([
  "id", "type", "name", "placeholder", "min", "max", "step", "for", "role", "title",
  "aria-label", "aria-live", "aria-current", "aria-describedby", "aria-busy", "scope",
  "autocomplete", "required", "disabled", "tabindex", "colspan", "maxlength", "rows",
  "spellcheck", "data-key", "data-role", "data-doc", "data-model", "data-source", "datetime", "open",
  "inputmode", "size", "lang",
]);

/** An element: props set as properties or whitelisted attributes, children as nodes or
 * text. A link may only go to one of the console's own pages ("#/..."). */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key === "value") node.value = String(value);
    else if (key === "checked") node.checked = Boolean(value);
    else if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "href") {
      if (!String(value).startsWith("#/")) throw new Error(`refused link ${value}`);
      node.setAttribute("href", String(value));
    } else if (SAFE_ATTRIBUTES.has(key)) {
      node.setAttribute(key, value === true ? "" : String(value));
    } else {
      throw new Error(`refused attribute ${key}`);
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
}

/** Replace ``container``'s children, keeping the keyboard focus on the element with the
 * same data-key (a page that refreshes itself must not take the focus away). */
export function swap(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.key : undefined;
  container.replaceChildren();
  append(container, children);
  if (key) {
    const again = [...container.querySelectorAll("[data-key]")]
      .find((n) => n.dataset.key === key);
    if (again) again.focus();
  }
}

/** A table: columns of {head, cell(row) -> node or text, num}. */
export function table(columns, rows, empty = "None.") {
  if (!rows.length) return el("p", { class: "muted" }, empty);
  const head = el("tr", {}, columns.map((c) => el("th", { scope: "col", class: c.num ? "num" : "" }, c.head)));
  const body = rows.map((row) => el("tr", {}, columns.map((c) =>
    el("td", { class: c.num ? "num" : c.wrap ? "wrap" : "" }, c.cell(row)))));
  return el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, body)));
}

/** A definition list of [label, value] pairs. */
export function kv(pairs) {
  return el("dl", { class: "kv" }, pairs.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "")]));
}

export function badge(text, kind = "") {
  return el("span", { class: `badge ${kind}` }, text);
}

/** ``MODEL_STATE_READY`` -> ``ready``. */
export function short(value, prefix) {
  if (value === undefined || value === null || value === "") return "";
  const text = String(value);
  return (prefix && text.startsWith(prefix) ? text.slice(prefix.length) : text).toLowerCase();
}

export function seconds(value) {
  const s = Number(value || 0);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function when(value) {
  if (!value) return "";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
}

// -- calls to the daemon ------------------------------------------------------------------

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

/** A call to the daemon: the token as an Authorization header (never in the URL), no
 * cookie, no cache, no referrer. Throws ApiError with the daemon's message. */
export async function call(path, { method = "GET", query, body, signal } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    for (const one of [value].flat()) {
      if (one !== undefined && one !== null && one !== "") url.searchParams.append(key, one);
    }
  }
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer", redirect: "error",
  });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    let param = null;
    try {
      const error = (await response.json()).error || {};
      message = error.message || message;
      param = error.param || null;
    } catch { /* not JSON: the status says it */ }
    if (response.status === 401) signOut(message);
    throw new ApiError(response.status, message, param);
  }
  return response;
}

/** The events of an event-stream response (each ``data:`` line's JSON) until
 * ``[DONE]``; an error event throws ApiError with its message. */
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        const data = JSON.parse(line.slice(6));
        if (data.error) throw new ApiError(0, data.error.message || "the stream failed", data.error.param);
        yield data;
      }
    }
  }
}

export async function json(path, options) {
  return (await call(path, options)).json();
}

// -- the session --------------------------------------------------------------------------

const session = { admin: false, page: null, timers: [], aborts: [] };

function signOut(reason = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  session.admin = false;
  leave();
  showLogin(reason);
}

let toastTimer = 0;
export function toast(message, bad = false) {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.className = `toast shown${bad ? " bad" : ""}`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { box.className = "toast"; }, bad ? 8000 : 3500);
}

/** What a page is handed: the role, timers and aborts that end when it is left. */
function context() {
  return {
    admin: session.admin,
    every(ms, fn) {
      const id = setInterval(() => { if (!document.hidden) fn(); }, ms);
      session.timers.push(id);
    },
    abortable() {
      const controller = new AbortController();
      session.aborts.push(controller);
      return controller;
    },
    toast,
  };
}

function leave() {
  for (const id of session.timers) clearInterval(id);
  for (const controller of session.aborts) controller.abort();
  session.timers = [];
  session.aborts = [];
}

function showLogin(reason) {
  document.getElementById("nav").replaceChildren();
  document.getElementById("who").replaceChildren();
  const input = el("input", { type: "password", id: "token", autocomplete: "off",
                              "aria-label": "Access token", spellcheck: "false" });
  const problem = el("p", { class: "error", role: "alert" }, reason);
  const form = el("form", { class: "card login", onsubmit: async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = "";
    problem.textContent = "";
    await start();
  } },
  el("h1", {}, "llamad console"),
  el("p", {}, "Enter an access token of this daemon (read or admin). It is kept in this tab only, and sent only to this daemon."),
  el("label", { for: "token" }, "Access token", input),
  el("p", {}, el("button", { type: "submit", class: "primary" }, "Sign in")),
  problem);
  document.getElementById("main").replaceChildren(form);
  input.focus();
}

function renderChrome() {
  const nav = document.getElementById("nav");
  nav.replaceChildren(...PAGES.filter((p) => !p.admin || session.admin)
    .map((p) => el("a", { href: `#/${p.id}`, "data-key": `nav-${p.id}` }, p.title)));
  document.getElementById("who").replaceChildren(
    badge(session.admin ? "admin" : "read", session.admin ? "admin" : ""),
    el("button", { type: "button", onclick: () => signOut("Signed out.") }, "Sign out"));
}

async function route() {
  leave();
  const wanted = (window.location.hash.match(/^#\/([a-z]+)/) || [])[1] || "overview";
  const page = PAGES.find((p) => p.id === wanted && (!p.admin || session.admin)) || PAGES[0];
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.getAttribute("href") === `#/${page.id}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${page.title} · llamad console`;
  const main = document.getElementById("main");
  main.replaceChildren(el("h1", {}, page.title));
  main.setAttribute("data-page", page.id);
  try {
    const module = await import(`./pages/${page.id}.js`);
    await module.render(main, context());
  } catch (error) {
    main.append(el("p", { class: "error", role: "alert" }, error.message || String(error)));
  }
  main.setAttribute("data-ready", page.id);
  // The keyboard's focus moves to the page (unless the page put it on its first field).
  if (session.page !== null && !main.contains(document.activeElement)) main.focus({ preventScroll: true });
  session.page = page.id;
}

async function start() {
  try {
    const overview = await json("/console/api/overview");
    session.admin = Boolean(overview.admin);
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 401)) {
      document.getElementById("main").replaceChildren(
        el("p", { class: "error", role: "alert" }, error.message || String(error)));
    }
    return;
  }
  renderChrome();
  await route();
}

document.getElementById("skip").addEventListener("click", () => document.getElementById("main").focus());
window.addEventListener("hashchange", () => { if (document.getElementById("nav").childElementCount) route(); });
start();
