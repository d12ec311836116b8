"""Per-model series read when scraped, and the series one stream counts in.

:class:`ModelGauges` is a Prometheus collector over the pool's view of each catalog
model (:class:`ModelLife`, made by the server from
:meth:`daemon.models.pool.Pool.views`): its lifecycle state, when it was last given a
call, and how long a load under way is expected to take yet. It only reads: a scrape
never builds, loads, touches or wakes a model (a model never needed has no Model at all
and is shown ``unloaded``), and a name outside the catalog is left out, never a series.

:class:`StreamSeries` holds the three series a generation stream of one model counts in,
resolved once per call so that each streamed token costs two plain updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

MODEL_STATES: tuple[str, ...] = ("unloaded", "loading", "ready", "draining", "failed")
"""A model's lifecycle states as ListModels shows them (``ModelView.state``)."""


class StreamSeries(NamedTuple):
    """One model's token counter, time-to-first-token and inter-token histograms."""

    tokens: Any
    ttft: Any
    inter_token: Any


@dataclass(frozen=True)
class ModelLife:
    """What a scrape shows of one catalog model.

    Attributes:
        name: the catalog name (the id ``/v1/models`` lists).
        role: its role.
        state: one of :data:`MODEL_STATES` (anything else is exported as ``other``).
        last_used: wall-clock time of the last call it was given (None: never).
        load_expected: seconds its load under way is expected to take yet, from how long
            its last load took (None: not loading, or never loaded before).
    """

    name: str
    role: str
    state: str
    last_used: float | None = None
    load_expected: float | None = None


class _Views(Protocol):
    """What :func:`model_lives` reads of the pool (:class:`daemon.models.pool.Pool`)."""

    def views(self) -> Sequence[_View]: ...

    def expected_load(self, name: str) -> float | None: ...


class _View(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def last_used(self) -> float | None: ...


def model_lives(pool: _Views) -> list[ModelLife]:
    """Each catalog model's lifecycle, read from ``pool``'s views (ListModels' own, which
    never build, load or touch a model)."""
    return [ModelLife(v.name, v.role, v.state, v.last_used,
                      pool.expected_load(v.name) if v.state == "loading" else None)
            for v in pool.views()]


class ModelGauges(Collector):
    """The lifecycle gauges of every catalog model, read from ``source`` at each scrape.

    Args:
        source: each catalog model's :class:`ModelLife` (it must only read).
        catalog: the model names that may label a series (read at each scrape: a
            reload's new models appear).
        role: folds a role to its bounded label value.
    """

    def __init__(self, source: Callable[[], Iterable[ModelLife]],
                 catalog: Callable[[], frozenset[str]], role: Callable[[str], str]) -> None:
        self._source = source
        self._catalog = catalog
        self._role = role

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "llamad_model_state", "1 for the model's lifecycle state now (unloaded, "
                "loading, ready, draining, failed), 0 for the others; read when scraped.",
                labels=["role", "model", "state"]),
            GaugeMetricFamily(
                "llamad_model_last_used_timestamp_seconds", "Unix time of the last call "
                "given to the model (absent: none since llamad started).",
                labels=["role", "model"]),
            GaugeMetricFamily(
                "llamad_model_load_expected_seconds", "While the model loads: the seconds "
                "it is expected to take yet, from its previous load (absent: not loading, "
                "or its first load).", labels=["role", "model"]),
        )

    def describe(self) -> Iterable[Metric]:
        """The families without samples: registering never calls ``source``."""
        return self._families()

    def collect(self) -> Iterable[Metric]:
        state, last_used, expected = self._families()
        known = self._catalog()
        for life in self._source():
            if life.name not in known:
                continue
            role = self._role(life.role)
            now = life.state if life.state in MODEL_STATES else "other"
            names = MODEL_STATES if now != "other" else (*MODEL_STATES, "other")
            for name in names:
                state.add_metric([role, life.name, name], 1.0 if name == now else 0.0)
            if life.last_used is not None:
                last_used.add_metric([role, life.name], life.last_used)
            if life.load_expected is not None:
                expected.add_metric([role, life.name], max(0.0, life.load_expected))
        return (state, last_used, expected)
