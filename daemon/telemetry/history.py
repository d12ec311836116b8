"""A short history of the per-model metrics, for the operator console's Metrics page
(issue 32): one sample every ``console.sample_interval`` seconds, kept for
``console.history`` seconds in a bounded ring.

Each sample is read from the daemon's own Prometheus registry (:class:`~.metrics.Metrics`),
as a scrape reads it: nothing is counted twice and reading never builds, loads or wakes a
model. A sample holds, per model, what happened since the sample before it:

* ``tokens_per_s``: tokens streamed to clients, per second;
* ``ttft_p50`` and ``ttft_p95``: time-to-first-token quantiles of the calls that began
  streaming in the interval (from the histogram's bucket counts, interpolated inside a
  bucket as Prometheus's ``histogram_quantile`` does; None when no call did);
* ``queue`` and ``in_flight``: calls waiting for a slot and holding one, at the sample;
* ``errors``: calls that ended in error, plus calls refused by admission control.

The first reading only sets the baseline: the ring starts with the second.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_TOKENS = "llamad_tokens_generated_total"
_TTFT = "llamad_time_to_first_token_seconds_bucket"
_QUEUE = "llamad_queue_depth"
_IN_FLIGHT = "llamad_requests_in_flight"
_CALLS = "llamad_model_calls_total"
_REJECTED = "llamad_rejections_total"
WANTED = frozenset({_TOKENS, _TTFT, _QUEUE, _IN_FLIGHT, _CALLS, _REJECTED})
"""The sample names a history reads: collecting only their families
(``registry.restricted_registry(WANTED).collect``) leaves out the rest of the registry
(the inter-token histograms, the lifecycle gauges), which every sample of an otherwise
idle daemon paid for (issue 27)."""


@dataclass
class _Reading:
    """Cumulative values of one model at one moment."""

    tokens: float = 0.0
    errors: float = 0.0
    queue: float = 0.0
    in_flight: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> count


@dataclass(frozen=True)
class ModelPoint:
    """What one model did over one interval (module docstring)."""

    tokens_per_s: float
    ttft_p50: float | None
    ttft_p95: float | None
    queue: int
    in_flight: int
    errors: int


@dataclass(frozen=True)
class Sample:
    """One interval: its end (wall-clock seconds) and each model's point."""

    at: float
    models: Mapping[str, ModelPoint]

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "models": {
            name: {"tokens_per_s": round(p.tokens_per_s, 3), "ttft_p50": p.ttft_p50,
                   "ttft_p95": p.ttft_p95, "queue": p.queue, "in_flight": p.in_flight,
                   "errors": p.errors}
            for name, p in self.models.items()}}


def read(families: Iterable[Any]) -> dict[str, _Reading]:
    """Each model's cumulative values in ``families`` (a registry's :meth:`collect`)."""
    readings: dict[str, _Reading] = {}
    for family in families:
        for sample in family.samples:
            if sample.name not in WANTED:
                continue
            model = sample.labels.get("model", "")
            r = readings.setdefault(model, _Reading())
            value = float(sample.value)
            if sample.name == _TOKENS:
                r.tokens += value
            elif sample.name == _QUEUE:
                r.queue += value
            elif sample.name == _IN_FLIGHT:
                r.in_flight += value
            elif sample.name == _REJECTED or (sample.name == _CALLS
                                              and sample.labels.get("outcome") == "error"):
                r.errors += value
            elif sample.name == _TTFT:
                bound = float(sample.labels.get("le", "+Inf"))
                r.buckets[bound] = r.buckets.get(bound, 0.0) + value
    return readings


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of cumulative histogram ``buckets`` (upper bound -> count of
    observations at or below it); None when it holds none. An observation past the last
    finite bound counts as that bound."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _point(now: _Reading, before: _Reading | None, seconds: float) -> ModelPoint:
    base = before or _Reading()
    delta = {b: max(0.0, c - base.buckets.get(b, 0.0)) for b, c in now.buckets.items()}
    p50, p95 = quantile(0.5, delta), quantile(0.95, delta)
    return ModelPoint(
        tokens_per_s=max(0.0, now.tokens - base.tokens) / seconds if seconds > 0 else 0.0,
        ttft_p50=None if p50 is None else round(p50, 4),
        ttft_p95=None if p95 is None else round(p95, 4),
        queue=int(now.queue), in_flight=int(now.in_flight),
        errors=int(max(0.0, now.errors - base.errors)))


class MetricHistory:
    """The ring of samples (module docstring).

    Args:
        collect: the registry's families, read at each sample
            (``metrics.registry.restricted_registry(WANTED).collect``).
        interval: seconds between samples.
        window: seconds of samples kept (at least one sample).
        models: the model names kept (others, such as ``other``, are left out; None: all).
        clock: wall-clock seconds (injected in tests).
    """

    def __init__(self, collect: Callable[[], Iterable[Any]], *, interval: float,
                 window: float, models: Callable[[], Iterable[str]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.interval = interval
        self.window = window
        self._collect = collect
        self._models = models
        self._clock = clock
        self._ring: deque[Sample] = deque(maxlen=max(1, int(window / interval)))
        self._last: tuple[float, dict[str, _Reading]] | None = None

    def sample(self) -> Sample | None:
        """Read the metrics now; the sample since the previous reading (None on the
        first)."""
        at = self._clock()
        readings = read(self._collect())
        if self._models is not None:
            kept = set(self._models())
            readings = {m: r for m, r in readings.items() if m in kept}
        last, self._last = self._last, (at, readings)
        if last is None:
            return None
        seconds = at - last[0]
        sample = Sample(at, {m: _point(r, last[1].get(m), seconds)
                             for m, r in sorted(readings.items())})
        self._ring.append(sample)
        return sample

    def samples(self, since: float = 0.0) -> list[Sample]:
        """The samples kept that ended after ``since``, oldest first."""
        return [s for s in self._ring if s.at > since]

    async def run(self) -> None:
        """Sample every :attr:`interval` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval)
