// Metrics: tokens/s, time to first token (p50, p95), queue depth and errors per model over
// the daemon's metric history (console.history), live.
import { el, json, swap } from "../app.js";
import { lineChart } from "../chart.js";

const CHARTS = [
  { id: "tokens", title: "Tokens per second", unit: "tok/s", fields: [["tokens_per_s", ""]], generation: true },
  { id: "ttft", title: "Time to first token", unit: "s", fields: [["ttft_p50", " p50"], ["ttft_p95", " p95"]], generation: true },
  { id: "queue", title: "Queue depth", unit: "calls", fields: [["queue", ""]] },
  { id: "errors", title: "Errors per interval", unit: "calls", fields: [["errors", ""]] },
];

export async function render(main, ctx) {
  const note = el("p", { class: "muted" });
  const grid = el("div", { class: "charts" });
  main.append(note, grid);
  let samples = [];
  let interval = 5;
  let windowSeconds = 900;
  const overview = await json("/console/api/overview");
  const generation = new Set((overview.models || []).filter((m) => m.role === "CHILD_ROLE_GENERATION").map((m) => m.name));

  function draw() {
    const to = Date.now() / 1000;
    const from = to - windowSeconds;
    samples = samples.filter((s) => s.at >= from);
    const names = [...new Set(samples.flatMap((s) => Object.keys(s.models)))].sort();
    note.textContent = `One sample every ${interval} s, the last ${Math.round(windowSeconds / 60)} minutes (${samples.length} samples).`;
    swap(grid, CHARTS.map((chart) => {
      const models = names.filter((n) => !chart.generation || generation.has(n) || !generation.size);
      const series = models.flatMap((name) => chart.fields.map(([field, suffix]) => ({
        name: `${name}${suffix}`,
        points: samples.map((s) => [s.at, s.models[name] ? s.models[name][field] ?? null : null]),
      })));
      return el("figure", { class: "card chart", "data-key": `chart-${chart.id}`, id: `chart-${chart.id}` },
        el("h2", {}, `${chart.title} (${chart.unit})`),
        lineChart({ title: chart.title, unit: chart.unit, series, from, to }),
        el("ul", { class: "legend" }, series.map((s, i) => el("li", { class: `s${i % 6}` }, s.name))));
    }));
  }

  async function refresh() {
    const since = samples.length ? samples[samples.length - 1].at : 0;
    const got = await json("/console/api/metrics", { query: { since } });
    interval = got.interval;
    windowSeconds = got.window;
    samples.push(...got.samples);
    draw();
  }

  await refresh();
  ctx.every(Math.max(1000, interval * 1000), () => refresh().catch((error) => ctx.toast(error.message, true)));
}
