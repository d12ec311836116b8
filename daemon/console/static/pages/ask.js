// Ask: a question, the streamed answer, its cited sources, and the dry run of what would be
// sent to the model.
import { call, el, events, short, swap } from "../app.js";

function citations(sources) {
  return el("section", { class: "card", "aria-label": "Sources" }, el("h2", {}, "Sources"),
    (sources.warnings || []).map((w) => el("p", { class: "error" }, w)),
    el("ol", { class: "hits" }, (sources.citations || []).map((c) => el("li", { class: "hit" },
      el("h3", {}, `[${c.label}] ${c.title || c.document_id}`),
      el("div", { class: "meta" }, el("span", {}, `score ${Number(c.score || 0).toFixed(3)}`),
        el("span", {}, `found by ${short(c.search_source, "SEARCH_SOURCE_")}`), el("span", { class: "mono" }, c.document_id), c.path ? el("span", { class: "mono" }, c.path) : ""),
      el("pre", { class: "text" }, c.snippet || "")))));
}

function plan(p) {
  return el("section", { class: "card", "aria-label": "Dry run" }, el("h2", {}, "What would be sent"),
    el("p", { class: "muted" }, `${p.prompt_tokens || 0} prompt tokens of a budget of ${p.budget || 0}; ${(p.hits || []).length} chunks.`),
    (p.sections || []).map((s) => el("div", {}, el("h3", {}, `${short(s.role, "CHAT_ROLE_")} (${s.tokens || 0} tokens)`), el("pre", { class: "text" }, s.content || ""))));
}

function done(d) {
  const facts = [d.model_name && `model ${d.model_name}`, d.finish_reason && `finished: ${short(d.finish_reason, "FINISH_REASON_")}`,
    d.usage && `${d.usage.prompt_tokens || 0} prompt + ${d.usage.completion_tokens || 0} completion tokens`,
    d.cached && "from the cache", d.no_context && "no source found", d.chunks_dropped && `${d.chunks_dropped} chunks dropped`].filter(Boolean);
  return el("p", { class: "muted", id: "ask-done" }, facts.join(" · "));
}

export async function render(main, ctx) {
  const question = el("textarea", { id: "question", required: true, rows: "3", placeholder: "Ask the knowledge base..." });
  const topK = el("input", { id: "ask-top-k", type: "number", min: "1", max: "50", value: "5", size: "4", inputmode: "numeric" });
  const mode = el("select", { id: "ask-mode" }, ["HYBRID", "TEXT", "VECTOR"].map((m) => el("option", { value: `SEARCH_MODE_${m}` }, m.toLowerCase())));
  const maxTokens = el("input", { id: "max-tokens", type: "number", min: "1", value: "256", size: "5", inputmode: "numeric" });
  const dry = el("input", { type: "checkbox", id: "dry-run" });
  const stop = el("button", { type: "button", disabled: true }, "Stop");
  const answer = el("div", { class: "answer card", id: "answer", "aria-live": "polite" });
  const extra = el("div", { id: "ask-extra" });
  let running = null;

  async function ask() {
    running = ctx.abortable();
    stop.disabled = false;
    answer.replaceChildren();
    extra.replaceChildren();
    const text = document.createTextNode("");
    answer.append(text);
    try {
      const response = await call("/v1/llamad/ask", { method: "POST", signal: running.signal, body: {
        question: question.value, top_k: Number(topK.value) || 5, mode: mode.value, dry_run: dry.checked,
        sampling: { max_tokens: Number(maxTokens.value) || 256 }, stream: true } });
      for await (const data of events(response)) {
        if (data.text) text.appendData(data.text);
        if (data.sources) extra.append(citations(data.sources));
        if (data.plan) extra.prepend(plan(data.plan));
        if (data.done) extra.prepend(done(data.done));
      }
      if (dry.checked && !text.data) text.appendData("Dry run: nothing was generated.");
    } catch (error) {
      if (error.name !== "AbortError") answer.append(el("p", { class: "error", role: "alert" }, error.message));
    }
    stop.disabled = true;
    answer.setAttribute("data-finished", "true");
  }

  stop.addEventListener("click", () => running && running.abort());
  main.append(el("form", { class: "card", onsubmit: (event) => { event.preventDefault(); answer.removeAttribute("data-finished"); ask(); } },
    el("label", { for: "question" }, "Question", question),
    el("div", { class: "row" }, el("label", { for: "ask-top-k" }, "Sources", topK), el("label", { for: "ask-mode" }, "Search", mode),
      el("label", { for: "max-tokens" }, "Max tokens", maxTokens), el("label", { class: "check", for: "dry-run" }, dry, "Dry run (show what would be sent)"),
      el("button", { type: "submit", class: "primary" }, "Ask"), stop)),
  el("h2", {}, "Answer"), answer, extra);
  swap(extra);
  question.focus();
}
