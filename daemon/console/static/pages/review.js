// Review: the documents held for review, each with its change against the indexed version;
// approve or reject (admins).
import { el, json, swap } from "../app.js";

function diff(change) {
  const lines = change.lines.map((line) => {
    const kind = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
    return el("div", { class: kind }, line);
  });
  return el("div", {},
    el("p", { class: "muted" }, change.indexed ? "Change against the version searchable now:" : "A new document (no version is searchable yet):"),
    el("div", { class: "diff", role: "region", "aria-label": `Change of ${change.id}`, tabindex: "0" }, lines),
    change.truncated ? el("p", { class: "muted" }, `${change.truncated} more lines not shown.`) : "");
}

export async function render(main, ctx) {
  const box = el("div", { id: "held" });
  main.append(box);

  async function decide(id, approve, note) {
    try {
      const doc = await json(`/v1/llamad/review/${approve ? "approve" : "reject"}`, { method: "POST", body: { id, note } });
      ctx.toast(`${id}: ${(doc.state || "").replace("DOCUMENT_STATE_", "").toLowerCase()}`);
    } catch (error) {
      ctx.toast(`${id}: ${error.message}`, true);
    }
    await refresh();
  }

  async function card(doc) {
    let change;
    try {
      change = diff(await json("/console/api/review/change", { query: { id: doc.id } }));
    } catch (error) {
      change = el("p", { class: "error" }, error.message);
    }
    const note = el("textarea", { id: `note-${doc.id}`, "data-key": `note-${doc.id}`, rows: "2", "aria-label": `Note on ${doc.id}`, maxlength: "2000" });
    return el("article", { class: "card", "data-doc": doc.id },
      el("h2", {}, doc.title || doc.id),
      el("p", { class: "muted mono" }, `${doc.id} · source ${doc.source_id} · ${doc.kind || "text"}`),
      change,
      ctx.admin ? el("div", {}, el("label", { for: `note-${doc.id}` }, "Reviewer's note", note),
        el("div", { class: "actions" },
          el("button", { type: "button", class: "primary", "data-key": `approve-${doc.id}`, onclick: () => decide(doc.id, true, note.value) }, "Approve"),
          el("button", { type: "button", class: "danger", "data-key": `reject-${doc.id}`, onclick: () => decide(doc.id, false, note.value) }, "Reject"))) : "");
  }

  async function refresh() {
    const held = (await json("/v1/llamad/review")).documents || [];
    const cards = await Promise.all(held.map(card));
    swap(box, el("p", { class: "muted" }, held.length ? `${held.length} held for review.` : "Nothing is held for review."), cards);
  }

  await refresh();
}
