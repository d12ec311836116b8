// Line charts drawn as SVG by hand (no library): one polyline per series, gaps where a
// value is missing, a y axis from 0 to a round maximum, an x axis over the time window.
const SVG = "http://www.w3.org/2000/svg";
const W = 640, H = 220, LEFT = 52, RIGHT = 12, TOP = 10, BOTTOM = 26;

function node(tag, attrs = {}, text) {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (text !== undefined) n.textContent = text;
  return n;
}

function roundUp(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function label(value) {
  if (value === 0) return "0";
  if (Math.abs(value) >= 100) return value.toFixed(0);
  if (Math.abs(value) >= 1) return value.toFixed(1);
  return value.toPrecision(2);
}

/** A chart of ``series`` ([{name, points: [[t, v|null]...]}]) from ``from`` to ``to``
 * (seconds), values in ``unit``; the SVG element. */
export function lineChart({ title, unit, series, from, to }) {
  const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  svg.append(node("title", {}, title));
  const values = series.flatMap((s) => s.points.map((p) => p[1])).filter((v) => v !== null && v !== undefined);
  const max = roundUp(Math.max(0, ...values));
  const x = (t) => LEFT + ((t - from) / Math.max(1, to - from)) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / max) * (H - TOP - BOTTOM);
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    svg.append(node("line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
    svg.append(node("text", { class: "tick", x: LEFT - 6, y: y(v) + 4, "text-anchor": "end" }, label(v)));
  }
  const span = to - from;
  for (let i = 0; i <= 3; i++) {
    const t = from + (span * i) / 3;
    const ago = Math.round((to - t) / 60);
    svg.append(node("text", { class: "tick", x: x(t), y: H - 8, "text-anchor": i === 0 ? "start" : i === 3 ? "end" : "middle" }, ago ? `-${ago} min` : "now"));
  }
  svg.append(node("line", { class: "axis", x1: LEFT, x2: LEFT, y1: TOP, y2: H - BOTTOM }));
  svg.append(node("line", { class: "axis", x1: LEFT, x2: W - RIGHT, y1: H - BOTTOM, y2: H - BOTTOM }));
  series.forEach((s, index) => {
    let run = [];
    const flush = () => {
      if (run.length === 1) {  // a lone value between gaps: a dot
        const [cx, cy] = run[0].split(",");
        svg.append(node("circle", { class: `dot s${index % 6}`, cx, cy, r: 3 }));
      } else if (run.length) {
        svg.append(node("polyline", { class: `s${index % 6}`, points: run.join(" ") }));
      }
      run = [];
    };
    for (const [t, v] of s.points) {
      if (v === null || v === undefined) flush();
      else run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    }
    flush();
  });
  if (!values.length) {
    svg.append(node("text", { class: "tick", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
  }
  return svg;
}
