"""The Ask response cache's key: model, prompt and a canonical form of the sampling."""

from __future__ import annotations

import dataclasses
from typing import Any

from daemon.services.ask import CachedAnswer, ResponseCache
from daemon.services.ask._cache import sampling_key
from supervisor import LogitBias, Sampling

ANSWER = CachedAnswer("Rotate the logs [S1].", 6, 100, "stop")


def test_equal_sampling_has_equal_keys_and_any_field_changes_it() -> None:
    """Two equal Sampling values share a key; changing any one field (an unset one too)
    gives another key."""
    base = Sampling(max_tokens=128, temperature=0.0)
    assert sampling_key(base) == sampling_key(Sampling(max_tokens=128, temperature=0.0))
    changes: dict[str, Any] = {
        "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7,
        "stop": ("\n",), "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 64,
        "presence_penalty": 0.5, "frequency_penalty": 0.5,
        "logit_bias": (LogitBias(5, -1.0),), "dry_multiplier": 0.8, "dry_base": 1.75,
        "dry_allowed_length": 2, "dry_penalty_last_n": -1,
        "defaulted": frozenset({"repeat_penalty"}),
    }
    keys = {sampling_key(base)}
    for name, value in changes.items():
        keys.add(sampling_key(dataclasses.replace(base, **{name: value})))
    assert len(keys) == len(changes) + 1


def test_an_answer_is_served_only_for_the_sampling_that_produced_it() -> None:
    """get finds a stored answer under the same model, prompt and sampling, and nothing
    under another temperature or seed."""
    cache = ResponseCache(ttl=60, max_entries=8)
    greedy = Sampling(max_tokens=128)
    cache.put("m@1", "abc", greedy, ANSWER)
    assert cache.get("m@1", "abc", Sampling(max_tokens=128)) == ANSWER
    assert cache.get("m@1", "abc", Sampling(max_tokens=128, temperature=0.7)) is None
    assert cache.get("m@1", "abc", Sampling(max_tokens=128, seed=3)) is None
    assert cache.get("m@2", "abc", greedy) is None
    assert cache.get("m@1", "abd", greedy) is None
