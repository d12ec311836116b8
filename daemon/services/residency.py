"""Models in and out of residency, free of any wire: what gRPC's ControlService/LoadModel
and UnloadModel do, for the HTTP API's admin routes (:mod:`daemon.httpapi._admin`)."""

from __future__ import annotations

from supervisor import SwapFailedError

from ..errors import FailedPrecondition
from ..models.pool import ModelView, Pool


async def load(pool: Pool, name: str) -> ModelView:
    """Make the model ``name`` (a catalog name or alias) resident; its view once it serves.

    Cancelling the call does not cancel the load (others may share it).

    Raises:
        UnknownModel: no such model (the message names those that exist).
        FailedPrecondition: it could not be loaded (why), or the daemon is shutting down.
        supervisor.SwapInProgressError: a swap, switch or unload of it is running.
    """
    entry = pool.entry(name)
    try:
        await pool.load(entry.name)
    except SwapFailedError as exc:  # no old child keeps serving: nothing was there
        raise FailedPrecondition(f"model {entry.name!r} could not be loaded: "
                                 f"{exc.cause.message}") from None
    return pool.view(entry.name)


async def unload(pool: Pool, name: str) -> ModelView:
    """Take the model ``name`` out of residency (running calls finish first, bounded by
    the drain timeout); its view after.

    Raises:
        UnknownModel: no such model.
        supervisor.SwapInProgressError: a swap, switch, load or unload of it is running.
    """
    entry = pool.entry(name)
    await pool.unload(entry.name)
    return pool.view(entry.name)
