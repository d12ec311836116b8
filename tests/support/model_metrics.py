"""What the per-model metrics tests (issue 28) share: a scrape parsed into its samples,
the model labels of a series; and, for tests/support/scripted_pool.py's Rig, its catalog
by role and a router over it counting into the rig's metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from daemon.models.router import InferenceRouter
from daemon.telemetry.metrics import Metrics
from tests.support.scripted_pool import Rig

RIG_MODELS = {"gen-a": "generation", "gen-b": "generation", "gen-c": "generation",
              "emb": "embedding"}
"""The Rig's catalog: each model's role."""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""A scrape's samples: (series name, its labels) -> value."""


def parse(text: str) -> Samples:
    """The samples of a scrape (the text exposition format)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def models_of(samples: Samples, name: str) -> set[str]:
    """The model label values of ``name``'s samples."""
    return {dict(labels)["model"] for n, labels in samples if n == name}


def get(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of ``name`` with exactly ``labels``; None where there is no such series."""
    return samples.get((name, frozenset(labels.items())))


async def routed(rig: Rig, metrics: Metrics) -> InferenceRouter:
    """A router over ``rig`` (its generation default started and running, its pool
    attached) counting into ``metrics``."""
    await rig.started()
    router = InferenceRouter({"generation": rig.default})
    router.attach(rig.pool)
    router.metrics = metrics
    return router
