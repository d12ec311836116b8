// Search: a query with its mode, filters and depth; each hit's score, text and vector rank,
// section and provenance.
import { el, json, short, swap, when } from "../app.js";

function list(text) {
  return text.split(",").map((s) => s.trim()).filter(Boolean);
}

function number(value, digits = 3) {
  return value === undefined || value === null ? "-" : Number(value).toFixed(digits);
}

function hit(h, index) {
  const rank = (r, s) => (r === undefined ? "not found" : `#${r} (${number(s)})`);
  return el("li", { class: "hit", "data-doc": h.document_id },
    el("h3", {}, `${index + 1}. ${h.title || h.document_id}`),
    el("div", { class: "meta" },
      el("span", {}, `score ${number(h.score)}`), el("span", {}, `fused ${number(h.fused_score, 4)}`),
      el("span", {}, `text rank ${rank(h.text_rank, h.text_score)}`),
      el("span", {}, `vector rank ${rank(h.vector_rank, h.vector_score)}`),
      el("span", {}, `found by ${short(h.search_source, "SEARCH_SOURCE_")}`)),
    el("div", { class: "meta" },
      el("span", {}, `section: ${h.heading || "(none)"}`), el("span", {}, `source: ${h.source_id}`),
      el("span", { class: "mono" }, `document: ${h.document_id}`), el("span", { class: "mono" }, `chunk: ${h.chunk_id} (#${h.ordinal || 0})`),
      h.path ? el("span", { class: "mono" }, `path: ${h.path}`) : "", h.kind ? el("span", {}, `kind: ${h.kind}`) : "",
      h.indexed_at ? el("span", {}, `indexed ${when(h.indexed_at)}`) : "",
      (h.tags || []).length ? el("span", {}, `tags: ${h.tags.join(", ")}`) : ""),
    el("pre", { class: "text" }, h.text || h.snippet || ""));
}

export async function render(main, ctx) {
  const query = el("input", { id: "q", type: "search", class: "wide", required: true, placeholder: "What are you looking for?", autocomplete: "off" });
  const mode = el("select", { id: "mode" }, ["HYBRID", "TEXT", "VECTOR"].map((m) => el("option", { value: `SEARCH_MODE_${m}` }, m.toLowerCase())));
  const topK = el("input", { id: "top-k", type: "number", min: "1", max: "100", value: "10", inputmode: "numeric", size: "4" });
  const candidates = el("input", { id: "candidates", type: "number", min: "0", value: "0", inputmode: "numeric", size: "5", title: "Candidates each index ranks (0: the default)" });
  const sources = el("input", { id: "f-sources", placeholder: "all", autocomplete: "off" });
  const kinds = el("input", { id: "f-kinds", placeholder: "all", autocomplete: "off" });
  const tags = el("input", { id: "f-tags", placeholder: "any", autocomplete: "off" });
  const group = el("input", { type: "checkbox", id: "group" });
  const results = el("div", { "aria-live": "polite", id: "results" });
  const form = el("form", { class: "card row", role: "search", onsubmit: async (event) => {
    event.preventDefault();
    results.setAttribute("aria-busy", "true");
    try {
      const body = { query: query.value, mode: mode.value, top_k: Number(topK.value) || 10, group_by_document: group.checked,
        filters: { sources: list(sources.value), kinds: list(kinds.value), tags: list(tags.value) } };
      if (Number(candidates.value) > 0) body.candidates = Number(candidates.value);
      const found = await json("/v1/llamad/search", { method: "POST", body });
      const hits = found.hits || [];
      swap(results,
        el("p", { class: "muted" }, `${hits.length} hits, ${short(found.mode, "SEARCH_MODE_")} search${found.vector_model ? `, vectors of ${found.vector_model}` : ""}`),
        (found.warnings || []).map((w) => el("p", { class: "error" }, w)),
        el("ol", { class: "hits" }, hits.map(hit)));
    } catch (error) {
      swap(results, el("p", { class: "error", role: "alert" }, error.message));
    }
    results.removeAttribute("aria-busy");
  } },
  el("label", { for: "q" }, "Query", query), el("label", { for: "mode" }, "Mode", mode),
  el("label", { for: "top-k" }, "Hits", topK), el("label", { for: "candidates" }, "Depth", candidates),
  el("label", { for: "f-sources" }, "Sources", sources), el("label", { for: "f-kinds" }, "Kinds", kinds),
  el("label", { for: "f-tags" }, "Tags", tags), el("label", { class: "check", for: "group" }, group, "One hit per document"),
  el("button", { type: "submit", class: "primary" }, "Search"));
  main.append(form, results);
  query.focus();
}
