// Logs: a child's log ring (admin: TailLogs), followed every second.
import { el, json, when } from "../app.js";

const KEEP = 2000;

export async function render(main, ctx) {
  if (!ctx.admin) {
    main.append(el("p", { class: "muted" }, "A child's log needs an admin token (it may hold prompts)."));
    return;
  }
  const select = el("select", { id: "log-model", "aria-label": "Child" });
  const follow = el("input", { type: "checkbox", id: "log-follow", checked: true });
  const box = el("div", { class: "logs", role: "log", "aria-label": "Log lines", tabindex: "0" });
  const status = el("p", { class: "muted" });
  main.append(el("div", { class: "row card" },
    el("label", { for: "log-model" }, "Child", select),
    el("label", { class: "check", for: "log-follow" }, follow, "Follow"),
    status), box);
  let model = "";
  let last = 0;

  function line(l) {
    return el("div", { class: l.stream === "stderr" ? "stderr" : "" },
      el("span", { class: "seq" }, `${l.seq} ${when(l.time)} [${l.pid}] `), l.text);
  }

  async function poll() {
    const got = await json("/console/api/logs", { query: { model, after: last } });
    if (!model) model = got.model;
    if (select.options.length !== got.models.length) {
      select.replaceChildren(...got.models.map((m) => el("option", { value: m }, m)));
    }
    select.value = model;
    box.append(...got.lines.map(line));
    while (box.childElementCount > KEEP) box.firstElementChild.remove();
    if (got.lines.length) last = got.lines[got.lines.length - 1].seq;
    status.textContent = `${box.childElementCount} lines shown, newest #${got.last_seq}`;
    if (follow.checked) box.scrollTop = box.scrollHeight;
    if (got.more) await poll();
  }

  select.addEventListener("change", async () => {
    model = select.value;
    last = 0;
    box.replaceChildren();
    await poll();
  });
  await poll();
  ctx.every(1000, () => { if (follow.checked) poll().catch((error) => ctx.toast(error.message, true)); });
}
