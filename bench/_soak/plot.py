"""The plot of ``bench.soak``: three line charts as hand-written SVG."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

from bench._soak.analysis import Growth
from bench._soak.common import MIB, Sample, SwapRecord

# -- the plot --------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if not hi > lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = [round(first, 6)]
    while ticks[-1] < hi - 1e-9:
        ticks.append(round(ticks[-1] + step, 6))
    return ticks


def svg_plot(samples: Sequence[Sample], swaps: Sequence[SwapRecord], *, duration: float,
             warmup: float, verdicts: Sequence[Growth], title: str) -> str:
    load = [s for s in samples if s.phase == "load"]
    width, chart_h, left, right, top, bottom = 760, 170, 64, 20, 26, 30
    head = 34
    height = head + 3 * chart_h + 22
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14" font-weight="bold">'
           f'{html.escape(title)}</text>']
    series: list[tuple[str, Callable[[Sample], float]]] = [
        ("daemon RSS, MiB", lambda s: s.rss / MIB),
        ("daemon open file descriptors", lambda s: float(s.fds)),
        ("daemon threads", lambda s: float(s.threads)),
    ]
    xmax = max(duration, max((s.t for s in load), default=1.0))
    pw = width - left - right
    for i, ((label, get), g) in enumerate(zip(series, verdicts[:3], strict=True)):
        y0 = head + i * chart_h
        ph = chart_h - top - bottom
        values = [get(s) for s in load] or [0.0]
        lo, hi = min(values), max(values)
        pad = max((hi - lo) * 0.15, 1.0 if i else 2.0)
        ticks = nice_ticks(max(0.0, lo - pad), hi + pad)
        ylo, yhi = ticks[0], ticks[-1]

        def px(t: float) -> float:
            return left + pw * t / xmax

        def py(v: float, y0: float = y0, ph: int = ph, ylo: float = ylo,
               yhi: float = yhi) -> float:
            return y0 + top + ph * (1 - (v - ylo) / (yhi - ylo))

        verdict = "ok" if g.ok else "MISS"
        out.append(f'<text x="{left}" y="{y0 + top - 8}" font-weight="bold">'
                   f'{html.escape(label)}</text>'
                   f'<text x="{width - right}" y="{y0 + top - 8}" text-anchor="end" '
                   f'fill="{"#2a7d2a" if g.ok else "#c62828"}">second vs last quarter median: '
                   f'{g.q2:.1f} -&gt; {g.q4:.1f} ({g.delta:+.1f}) {verdict}</text>')
        out.append(f'<rect x="{left}" y="{y0 + top}" width="{px(duration * warmup) - left:.1f}" '
                   f'height="{ph}" fill="#f0f0f0"/>')
        for t in ticks:
            y = py(t)
            out.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                       'stroke="#ddd"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        minutes = nice_ticks(0, xmax / 60, 6)
        for m in minutes:
            if m * 60 > xmax + 1e-6:
                continue
            x = px(m * 60)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + top + ph}" '
                       f'y2="{y0 + top + ph + 4}" stroke="#444"/>'
                       f'<text x="{x:.1f}" y="{y0 + top + ph + 15}" '
                       f'text-anchor="middle">{m:g}</text>')
        out.append(f'<text x="{width - right}" y="{y0 + top + ph + 26}" text-anchor="end" '
                   'fill="#666">minutes</text>')
        for sw in swaps:
            x = px(sw.at)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + top}" y2="{y0 + top + ph}" '
                       f'stroke="{"#bbb" if sw.code == "OK" else "#c62828"}" '
                       'stroke-dasharray="3,3"/>')
        for a, b, v in ((0.25, 0.5, g.q2), (0.75, 1.0, g.q4)):
            if not math.isnan(v):
                out.append(f'<line x1="{px(duration * a):.1f}" x2="{px(duration * b):.1f}" '
                           f'y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#e07b00" '
                           'stroke-width="2" stroke-dasharray="6,3"/>')
        points = " ".join(f"{px(s.t):.1f},{py(get(s)):.1f}" for s in load)
        out.append(f'<polyline points="{points}" fill="none" stroke="#1f5fa8" '
                   'stroke-width="1.5"/>')
        out.append(f'<rect x="{left}" y="{y0 + top}" width="{pw}" height="{ph}" fill="none" '
                   'stroke="#444"/>')
    out.append(f'<text x="{left}" y="{height - 6}" fill="#666">grey band: warm-up (not '
               'judged); dashed grey lines: swaps (red: failed); orange: medians of the '
               'second and last quarters</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
