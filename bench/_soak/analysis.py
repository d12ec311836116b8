"""The growth rule of ``bench.soak``: medians of quarters and a least-squares slope."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench._soak.common import FD_LIMIT, MIB, RSS_LIMIT_MIB, RSS_LIMIT_SHARE, THREAD_LIMIT, Sample
from bench._support import pct

# -- analysis --------------------------------------------------------------------------------


@dataclass
class Growth:
    metric: str
    unit: str
    q2: float
    q4: float
    slope_per_hour: float  # least squares over the samples after the warm-up
    rule: str
    ok: bool
    judged: bool = True  # False: shown for information only (the children)

    @property
    def delta(self) -> float:
        return self.q4 - self.q2


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    if len(xs) < 2:
        return math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if (
        den) else math.nan


def growth(samples: Sequence[Sample], duration: float, warmup: float) -> list[Growth]:
    load = [s for s in samples if s.phase == "load"]
    q2 = [s for s in load if duration * 0.25 <= s.t < duration * 0.5]
    q4 = [s for s in load if s.t >= duration * 0.75]
    steady = [s for s in load if s.t >= duration * warmup]
    out = []
    metrics: list[tuple[str, str, Callable[[Sample], float]]] = [
        ("daemon RSS", "MiB", lambda s: s.rss / MIB),
        ("daemon open fds", "", lambda s: float(s.fds)),
        ("daemon threads", "", lambda s: float(s.threads)),
        ("children RSS", "MiB", lambda s: s.children_rss / MIB),
        ("children open fds", "", lambda s: float(s.children_fds)),
        ("children threads", "", lambda s: float(s.children_threads)),
    ]
    for name, unit, get in metrics:
        a = statistics.median([get(s) for s in q2]) if q2 else math.nan
        b = statistics.median([get(s) for s in q4]) if q4 else math.nan
        slope = fit_slope([s.t for s in steady], [get(s) for s in steady]) * 3600
        delta = b - a
        if name.startswith("children"):
            out.append(Growth(name, unit, a, b, slope, "not judged: depends on the model "
                              "swapped in (and on a swap running at the time)", True, False))
            continue
        if unit == "MiB":
            rule = (f"fails if it grows by > {RSS_LIMIT_MIB:.0f} MiB and > "
                    f"{RSS_LIMIT_SHARE:.0%}")
            ok = not (delta > RSS_LIMIT_MIB and delta > RSS_LIMIT_SHARE * a)
        else:
            limit = FD_LIMIT if "fds" in name else THREAD_LIMIT
            rule = f"fails if it grows by > {limit}"
            ok = not delta > limit
        out.append(Growth(name, unit, a, b, slope, rule, ok and not math.isnan(delta)))
    return out


def lat(values: Sequence[float], q: float) -> str:
    x = pct(values, q)
    return "n/a" if math.isnan(x) else f"{x:.2f}"
