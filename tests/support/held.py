"""Holding a retriever's background work at a gate, so a test sees it pending."""

from __future__ import annotations

import asyncio

from retrieval import Retriever


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
