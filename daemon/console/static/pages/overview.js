// Overview: the node, each catalog model and each child serving now, every 3 seconds.
import { badge, el, json, kv, seconds, short, swap, table, when, call } from "../app.js";

const STATE_KIND = { ready: "ok", running: "ok", loading: "warn", starting: "warn",
                     draining: "warn", backoff: "warn", failed: "bad", unloaded: "", stopped: "" };

function stateBadge(state) {
  return badge(state || "unknown", STATE_KIND[state] || "");
}

// A start under way (ModelInfo.loading, ChildStatus.loading): its phase, how long so far,
// and how long the model's last start took.
function loadNote(loading) {
  if (!loading || !loading.phase) return "";
  const phase = short(loading.phase, "LOAD_PHASE_").replace("_", " ");
  const so_far = seconds(loading.seconds || 0);
  const expected = loading.expected_seconds ? ` of ~${seconds(loading.expected_seconds)}` : "";
  return el("div", { class: "muted", "data-key": "loading" }, `${phase}: ${so_far}${expected}`);
}

function exitCause(exit) {
  if (!exit) return "";
  const code = exit.exit_code !== undefined ? `code ${exit.exit_code}` : exit.signal ? `signal ${exit.signal}` : "";
  return el("span", {}, [exit.kind || "exit", code && ` (${code})`, exit.permanent ? " permanent" : "",
    exit.message ? el("div", { class: "muted" }, exit.message) : "", exit.at ? el("div", { class: "muted" }, when(exit.at)) : ""]);
}

export async function render(main, ctx) {
  const root = el("div", { "aria-live": "off" });
  main.append(root);

  async function act(action, name) {
    try {
      await call(`/v1/llamad/models/${action}`, { method: "POST", body: { name, ...(action === "unload" ? { reason: "console" } : {}) } });
      ctx.toast(`${name}: ${action}ed`);
    } catch (error) {
      ctx.toast(`${name}: ${error.message}`, true);
    }
    await refresh();
  }

  function models(list) {
    const columns = [
      { head: "Model", cell: (m) => el("span", {}, el("strong", {}, m.name), m.aliases ? el("div", { class: "muted" }, m.aliases.join(", ")) : "") },
      { head: "Role", cell: (m) => short(m.role, "CHILD_ROLE_") },
      { head: "State", cell: (m) => {
        const state = short(m.state, "MODEL_STATE_");
        return el("span", {}, stateBadge(state), loadNote(m.loading));
      } },
      { head: "Resident", cell: (m) => (["MODEL_STATE_READY", "MODEL_STATE_DRAINING"].includes(m.state) ? "yes" : "no") },
      { head: "Pinned", cell: (m) => (m.pinned ? "yes" : "no") },
      { head: "In flight", num: true, cell: (m) => String(m.in_flight || 0) },
      { head: "Breaker", cell: (m) => (m.breaker === "BREAKER_STATE_OPEN" ? badge("open", "bad") : "closed") },
      { head: "Last used", cell: (m) => when(m.last_used) },
      { head: "Last error", wrap: true, cell: (m) => el("span", { class: "error" }, m.last_error || "") },
    ];
    if (ctx.admin) {
      columns.push({ head: "Actions", cell: (m) => el("div", { class: "actions" },
        el("button", { type: "button", "data-key": `load-${m.name}`, "data-model": m.name, onclick: () => act("load", m.name) }, "Load"),
        el("button", { type: "button", "data-key": `unload-${m.name}`, "data-model": m.name, onclick: () => act("unload", m.name) }, "Unload")) });
    }
    return table(columns, list, "No model in the catalog.");
  }

  function children(list) {
    return table([
      { head: "Child", cell: (c) => el("strong", {}, c.name) },
      { head: "Role", cell: (c) => short(c.role, "CHILD_ROLE_") },
      { head: "State", cell: (c) => el("span", {}, stateBadge(short(c.state, "CHILD_STATE_")), loadNote(c.loading)) },
      { head: "PID", num: true, cell: (c) => String(c.pid || "") },
      { head: "Uptime", num: true, cell: (c) => (c.uptime_seconds ? seconds(c.uptime_seconds) : "") },
      { head: "Slots busy", num: true, cell: (c) => `${c.in_flight || 0} / ${c.slots || 0}` },
      { head: "Queue", num: true, cell: (c) => String(c.queued || 0) },
      { head: "Restarts", num: true, cell: (c) => String(c.restarts || 0) },
      { head: "Breaker", cell: (c) => (c.breaker === "BREAKER_STATE_OPEN" ? badge("open", "bad") : `closed (${c.consecutive_failures || 0} failures)`) },
      { head: "Recent exits", wrap: true, cell: (c) => {
        const exits = c.recent_exits && c.recent_exits.length ? c.recent_exits : c.last_exit ? [c.last_exit] : [];
        return el("ul", { class: "exits" }, exits.slice(0, 3).map((e) => el("li", {}, exitCause(e))),
          exits.length > 3 ? el("li", { class: "muted" }, `${exits.length - 3} more`) : "");
      } },
      { head: "Model file", wrap: true, cell: (c) => el("span", { class: "mono" }, c.model_path || c.endpoint_url || "") },
      { head: "Last error", wrap: true, cell: (c) => el("span", { class: "error" }, c.last_error || "") },
    ], list, "No child is running.");
  }

  async function refresh() {
    const o = await json("/console/api/overview");
    const drain = o.drained ? badge("drained by an admin", "warn") : o.draining ? badge("draining", "warn") : badge("serving", "ok");
    swap(root,
      el("section", { class: "card", "aria-label": "Node" }, kv([
        ["Version", o.version || ""], ["Uptime", seconds(o.daemon_uptime_seconds)], ["Drain", drain],
        ["Models", String((o.models || []).length)], ["Children", String((o.children || []).length)],
      ])),
      el("h2", {}, "Models"), models(o.models || []),
      el("h2", {}, "Children"), children(o.children || []));
  }

  await refresh();
  ctx.every(3000, () => refresh().catch((error) => ctx.toast(error.message, true)));
}
