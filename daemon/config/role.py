"""What a model serves: :class:`Role`.

A :class:`enum.StrEnum`, as :class:`~daemon.config.inference_mode.InferenceMode` is: its
values are the strings the configuration's sections (``[generation]``, ``[embedding]``), a
catalog model's ``role``, the logs and the metrics' ``role`` label carry, so parsing is
``Role(text)`` and a member still equals its string where the code meets the outside.
"""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """What a model serves, and the section of the configuration that sets its default."""

    GENERATION = "generation"
    """Text: Generate, Chat, Ask and the HTTP API's completions."""
    EMBEDDING = "embedding"
    """Vectors: Embed, and the knowledge base's ingest and search."""


def background_instance_wanted(background_instance: str, role: str) -> bool:
    """Whether a model of ``role`` with ``[ROLE] background_instance`` set so gets a
    background instance (when lanes are on): ``auto`` is on for embedding models (small),
    off for generation models (it would double their memory)."""
    if background_instance == "auto":
        return role == Role.EMBEDDING
    return background_instance == "true"
