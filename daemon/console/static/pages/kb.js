// Knowledge base: its status, its sources (state, documents, last scan and error) and its
// documents (ingest state, failure reason); for admins: add a source, reindex, disable or
// enable, reprocess a document.
import { badge, call, el, events, json, kv, short, swap, table, when } from "../app.js";

const STATES = ["", "pending", "processing", "indexed", "failed", "review_required", "rejected"];
const KIND = { indexed: "ok", failed: "bad", rejected: "bad", review_required: "warn", processing: "warn", pending: "warn" };

function list(text) {
  return text.split(",").map((s) => s.trim()).filter(Boolean);
}

export async function render(main, ctx) {
  const statusBox = el("div");
  const sourcesBox = el("div");
  const documentsBox = el("div");
  const sourceFilter = el("select", { id: "doc-source", "aria-label": "Source" });
  const stateFilter = el("select", { id: "doc-state", "aria-label": "State" },
    STATES.map((s) => el("option", { value: s ? `DOCUMENT_STATE_${s.toUpperCase()}` : "" }, s || "any state")));

  const progress = el("div", { id: "reindex-progress", "aria-live": "polite" });

  function report(r, done) {
    const failed = (r.failed || []).length;
    return el("p", { class: done ? "" : "muted", "data-source": r.source_id },
      `${done ? "Reindexed" : "Reindexing"} ${r.source_id || "every source"}: ${r.seen || 0} seen, ${r.added || 0} added, ${r.changed || 0} changed, ${r.unchanged || 0} unchanged, ${r.deleted || 0} deleted`,
      failed ? el("span", { class: "error" }, `, ${failed} failed: ${(r.failed || []).slice(0, 5).map((f) => `${f.path}: ${f.reason}`).join("; ")}`) : "");
  }

  async function reindex(sourceId) {
    const shown = new Map();
    try {
      const response = await call("/v1/llamad/reindex", { method: "POST", body: { source_id: sourceId, stream: true }, signal: ctx.abortable().signal });
      for await (const event of events(response)) {
        shown.set(event.source_id || "", report(event, Boolean(event.done)));
        swap(progress, [...shown.values()]);
      }
      ctx.toast(`reindexed ${sourceId}`);
    } catch (error) {
      if (error.name !== "AbortError") ctx.toast(`${sourceId}: ${error.message}`, true);
    }
    await refresh();
  }

  async function act(what, path, body) {
    let done = false;
    try {
      await call(path, { method: "POST", body });
      ctx.toast(what);
      done = true;
    } catch (error) {
      ctx.toast(`${what}: ${error.message}`, true);
    }
    await refresh();
    return done;
  }

  function sources(list) {
    const columns = [
      { head: "Source", cell: (s) => el("span", {}, el("strong", {}, s.id),
        s.category || (s.tags || []).length ? el("div", { class: "muted" }, [s.category, ...(s.tags || [])].filter(Boolean).join(", ")) : "") },
      { head: "Kind", cell: (s) => s.kind || "" },
      { head: "Path", wrap: true, cell: (s) => el("span", { class: "mono" }, s.path || "") },
      { head: "State", cell: (s) => (s.disabled ? badge("disabled", "warn") : badge("enabled", "ok")) },
      { head: "Review", cell: (s) => (s.review_required ? "required" : "") },
      { head: "Documents", num: true, cell: (s) => String(s.documents || 0) },
      { head: "Last scan", cell: (s) => when(s.last_scan) },
      { head: "Last error", wrap: true, cell: (s) => el("span", { class: "error" }, s.last_error || "") },
    ];
    if (ctx.admin) {
      columns.push({ head: "Actions", cell: (s) => el("div", { class: "actions" },
        el("button", { type: "button", "data-key": `reindex-${s.id}`, onclick: () => reindex(s.id) }, "Reindex"),
        el("button", { type: "button", "data-key": `disable-${s.id}`, onclick: () => act(`${s.disabled ? "enabled" : "disabled"} ${s.id}`, "/v1/llamad/sources/disabled", { id: s.id, disabled: !s.disabled }) }, s.disabled ? "Enable" : "Disable")) });
    }
    return table(columns, list, "No source yet.");
  }

  function documents(list) {
    const columns = [
      { head: "Document", wrap: true, cell: (d) => el("span", {}, el("strong", {}, d.title || d.id), el("div", { class: "muted mono" }, d.id)) },
      { head: "Source", cell: (d) => d.source_id || "" },
      { head: "Kind", cell: (d) => d.kind || "" },
      { head: "State", cell: (d) => { const s = short(d.state, "DOCUMENT_STATE_"); return badge(s, KIND[s] || ""); } },
      { head: "Failure", wrap: true, cell: (d) => el("span", { class: "error" }, d.error || "") },
      { head: "Indexed", cell: (d) => when(d.indexed_at) },
      { head: "Redactions", num: true, cell: (d) => String(d.redactions || 0) },
      { head: "Review note", wrap: true, cell: (d) => d.review_note || "" },
    ];
    if (ctx.admin) {
      columns.push({ head: "Actions", cell: (d) => el("button", { type: "button", "data-key": `reprocess-${d.id}`, onclick: () => act(`reprocessed ${d.id}`, "/v1/llamad/reprocess", { document_id: d.id }) }, "Reprocess") });
    }
    return table(columns, list, "No document.");
  }

  async function refresh() {
    const [status, listed, docs] = await Promise.all([
      json("/v1/llamad/status"), json("/v1/llamad/sources"),
      json("/v1/llamad/documents", { query: { source_id: sourceFilter.value, states: stateFilter.value } }),
    ]);
    const byState = Object.entries(status.documents_by_state || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
    const rebuild = status.rebuild && status.rebuild.running ? `rebuilding for ${status.rebuild.model}: ${status.rebuild.done || 0} done, ${status.rebuild.pending || 0} pending` : "";
    swap(statusBox, kv([
      ["Store", `${status.store || ""} ${status.lexical_ranking ? `(${status.lexical_ranking})` : ""}`],
      ["Sources", String(status.sources || 0)], ["Chunks", String(status.chunks || 0)],
      ["Documents", byState || "none"], ["Embedding model", status.embedding_model || ""],
      ["Vectors", `${status.vectors || 0} (${status.embedded_chunks || 0} chunks embedded)`],
      ["Vector rebuild", rebuild || "none running"],
    ]));
    const current = sourceFilter.value;
    const ids = (listed.sources || []).map((s) => s.id);
    if (sourceFilter.options.length !== ids.length + 1) {
      sourceFilter.replaceChildren(el("option", { value: "" }, "every source"), ids.map((id) => el("option", { value: id }, id)));
      sourceFilter.value = current;
    }
    swap(sourcesBox, sources(listed.sources || []));
    swap(documentsBox, documents(docs.documents || []));
  }

  main.append(el("section", { class: "card", "aria-label": "Status" }, statusBox));
  if (ctx.admin) {
    const id = el("input", { id: "src-id", required: true, placeholder: "runbooks", autocomplete: "off" });
    const path = el("input", { id: "src-path", placeholder: "/srv/docs (empty: pushed documents)", class: "wide", autocomplete: "off" });
    const category = el("input", { id: "src-category", autocomplete: "off" });
    const tags = el("input", { id: "src-tags", placeholder: "a, b", autocomplete: "off" });
    const review = el("input", { type: "checkbox", id: "src-review" });
    main.append(el("form", { class: "card row", "aria-label": "Add a source", onsubmit: async (event) => {
      event.preventDefault();
      const added = await act(`added source ${id.value}`, "/v1/llamad/sources", {
        id: id.value.trim(), path: path.value.trim(), category: category.value.trim(),
        tags: list(tags.value), review_required: review.checked });
      if (added) for (const input of [id, path, category, tags]) input.value = "";
    } },
    el("label", { for: "src-id" }, "Source id", id), el("label", { for: "src-path" }, "Directory", path),
    el("label", { for: "src-category" }, "Category", category), el("label", { for: "src-tags" }, "Tags", tags),
    el("label", { class: "check", for: "src-review" }, review, "Review required"),
    el("button", { type: "submit", class: "primary" }, "Add source")));
  }
  main.append(el("h2", {}, "Sources"), progress, sourcesBox, el("h2", {}, "Documents"),
    el("div", { class: "row" }, el("label", { for: "doc-source" }, "Source", sourceFilter), el("label", { for: "doc-state" }, "State", stateFilter)),
    documentsBox);
  sourceFilter.append(el("option", { value: "" }, "every source"));
  sourceFilter.addEventListener("change", () => refresh());
  stateFilter.addEventListener("change", () => refresh());
  await refresh();
  ctx.every(5000, () => refresh().catch((error) => ctx.toast(error.message, true)));
}
