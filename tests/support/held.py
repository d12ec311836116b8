"""Holding a retriever's background work at a gate, so a test sees it pending."""

from __future__ import annotations

import asyncio

import pytest

from retrieval import Retriever
from retrieval.store._indexes import Indexes


def hold_later_upserts(r: Retriever) -> asyncio.Event:
    """Make the upserts ``r`` accepted for later (``upsert_later``, UpsertDocument with
    wait=false) wait before they start until the returned event is set."""
    gate = asyncio.Event()
    upsert = r.upsert

    async def held(*args: object, **kwargs: object) -> object:
        await gate.wait()
        return await upsert(*args, **kwargs)  # type: ignore[arg-type]

    r._later._upsert = held  # type: ignore[assignment]
    return gate


def hold_commits(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make every commit of the embedded store's indexes wait until the returned event is
    set (undone with ``monkeypatch``), so a document shows ``processing``."""
    gate = asyncio.Event()
    commit = Indexes.commit

    async def held(self: Indexes, batch: list[object]) -> object:
        await gate.wait()
        return await commit(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(Indexes, "commit", held)
    return gate
