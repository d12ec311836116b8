"""Holding a retriever's background work at a gate, so a test sees it pending."""

from __future__ import annotations

import asyncio
from typing import Any

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


def hold_commits(monkeypatch: pytest.MonkeyPatch, indexes: type[Any] = Indexes,
                 entered: asyncio.Event | None = None) -> asyncio.Event:
    """Make every commit of a store's indexes (``indexes``: the embedded store's, or
    PostgreSQL's ``PgIndexes``) wait until the returned event is set, undone with
    ``monkeypatch``, so a document shows ``processing``; ``entered`` is set when a commit
    reaches the gate."""
    gate = asyncio.Event()
    commit = indexes.commit

    async def held(self: Any, batch: list[Any]) -> Any:
        if entered is not None:
            entered.set()
        await gate.wait()
        return await commit(self, batch)

    monkeypatch.setattr(indexes, "commit", held)
    return gate
