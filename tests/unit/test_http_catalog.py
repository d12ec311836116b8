"""The HTTP API's model catalog over the model pool (issue 14 with issue 15): every
catalog model listed by its pool name, found by its name, aliases, GGUF file name or (a
role's default only) its role, and routed by name — except a role's default, routed as
the role's own model."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from daemon.httpapi import ApiError, Catalog
from daemon.models.pool import ModelView


def _view(name: str, role: str, *, state: str = "ready", default: bool = False,
          aliases: tuple[str, ...] = (), path: str = "") -> ModelView:
    return ModelView(name=name, role=role, aliases=aliases, state=state, memory_estimate=0,
                     last_used=None, in_flight=0, pinned=False, ttl=0.0, breaker_open=False,
                     last_error="", path=path, is_default=default, preload=False,
                     origin="test")


class Pool:
    def __init__(self, views: Sequence[ModelView]) -> None:
        self.views = list(views)

    def models(self) -> Sequence[ModelView]:
        return self.views


POOL = Pool([
    _view("smol", "generation", default=True, aliases=("generation",),
          path="/m/SmolLM2.Q4_1.gguf"),
    _view("gemma", "generation", state="unloaded", aliases=("g3",),
          path="/m/gemma-3-270m.gguf"),
    _view("minilm", "embedding", default=True, aliases=("embedding",),
          path="/m/minilm.gguf"),
])


def test_every_pool_model_is_listed_by_its_name_with_whether_it_is_loaded() -> None:
    catalog = Catalog({}, 0, POOL)
    listed = {m.name: (m.role, m.loaded) for m in catalog.models()}
    assert listed == {"smol": ("generation", True), "gemma": ("generation", False),
                      "minilm": ("embedding", True)}


@pytest.mark.parametrize(("asked", "name", "route"), [
    ("smol", "smol", ""),                       # the role's default: the role's own model
    ("generation", "smol", ""),
    ("SmolLM2.Q4_1.gguf", "smol", ""),          # its GGUF file name
    ("gemma", "gemma", "gemma"),                # another model: routed by its name
    ("g3", "gemma", "gemma"),                   # by an alias
    ("gemma-3-270m.gguf", "gemma", "gemma"),
    ("gemma-3-270m", "gemma", "gemma"),
])
def test_a_request_names_a_model_many_ways_and_is_routed_to_it(
        asked: str, name: str, route: str) -> None:
    found = Catalog({}, 0, POOL).resolve(asked, "generation", "/v1/chat/completions")
    assert (found.name, found.route) == (name, route)


def test_unknown_and_wrong_role_names_are_refused_as_openai_does() -> None:
    catalog = Catalog({}, 0, POOL)
    with pytest.raises(ApiError) as unknown:
        catalog.resolve("nope", "generation", "/v1/chat/completions")
    assert unknown.value.status == 404
    assert "smol, gemma, minilm" in str(unknown.value)
    with pytest.raises(ApiError) as wrong:
        catalog.resolve("minilm", "generation", "/v1/chat/completions")
    assert wrong.value.status == 400 and "smol, gemma" in str(wrong.value)
    # A model of another role is not reachable by the role name of another.
    with pytest.raises(ApiError):
        catalog.resolve("embedding", "generation", "/v1/completions")
