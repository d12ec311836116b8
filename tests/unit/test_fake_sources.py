"""The fake daemon of the client library (clients.testing.FakeLlamad) keeps every setting
AddSource takes, as the daemon does: the fields AddSourceRequest shares with Source are
copied by descriptor, so a new one (exclude, most recently) reaches the fake's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients import Client, errors
from clients.testing import FakeLlamad


def test_the_fake_keeps_what_add_source_sets(tmp_path: Path) -> None:
    with FakeLlamad() as fake, Client(fake.address) as client:
        kb = client.add_source("kb", tmp_path, category="ops", tags=["a", "b"],
                               review_required=True, exclude=["private/", "*.bak"])
        assert (kb.kind, kb.path, kb.category, kb.tags, kb.review_required, kb.exclude) == \
            ("directory", str(tmp_path), "ops", ("a", "b"), True, ("private/", "*.bak"))
        log = client.add_source("log", history=True, max_age_days=3, max_items=9)
        assert (log.kind, log.max_age_days, log.max_items, log.exclude) == \
            ("history", 3, 9, ())
        assert [s.id for s in client.list_sources()] == ["kb", "log"]
        with pytest.raises(errors.InvalidArgument, match="directory sources only"):
            client.add_source("pushed", exclude=["*.md"])
