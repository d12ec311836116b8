"""The retrieval core's limits (:class:`retrieval.RetrievalLimits`, which cannot import the
daemon) and the ``[retrieval]`` options that set them (:mod:`daemon.config._retrieval`)
declare their defaults in two places: these tests tie them. A default changed on one side
only, or a limit no option sets, fails here, naming the field."""

from __future__ import annotations

import dataclasses
from typing import Any

from daemon import config
from daemon.config import OPTIONS
from daemon.services.retrieval_bridge import limits_from
from retrieval import ExtractLimits, RetrievalLimits

MODELS = {"LLAMAD_GENERATION_MODEL": "/m/gen.gguf", "LLAMAD_EMBEDDING_MODEL": "/m/emb.gguf"}


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every field of a limits dataclass, nested ones by their dotted path."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        inner = getattr(value, f.name)
        if dataclasses.is_dataclass(inner):
            out.update(_leaves(inner, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = inner
    return out


def _changed(default: Any) -> str:
    """An environment value other than ``default`` (and above any minimum)."""
    if isinstance(default, bool):
        return "false" if default else "true"
    return str(default + 1)


def test_the_options_defaults_are_the_limits_defaults() -> None:
    """A daemon left at its defaults runs retrieval with RetrievalLimits' own defaults
    (and ExtractLimits' within them), field for field."""
    limits = limits_from(config.load(None, env=MODELS))
    assert _leaves(limits) == _leaves(RetrievalLimits())
    assert limits.extract == ExtractLimits()


def test_every_limit_is_set_by_an_option() -> None:
    """Each [retrieval] number or switch changed at once changes every limit: none keeps
    its default because no option reaches it."""
    env = {o.env: _changed(o.default) for o in OPTIONS
           if o.key.startswith("retrieval.") and o.kind in (int, float, bool)}
    for chosen in (o for o in OPTIONS if o.key in ("retrieval.fusion", "retrieval.chunk_unit")):
        env[chosen.env] = next(c for c in chosen.choices if c != chosen.default)
    limits = limits_from(config.load(None, env={**MODELS, **env}))
    unchanged = {name for name, value in _leaves(limits).items()
                 if value == _leaves(RetrievalLimits())[name]}
    assert unchanged == set()
