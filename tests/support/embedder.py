"""A deterministic embedder and a small corpus, for the retriever's unit tests; the
fixed model id and context every test or bench embedder has (:class:`FixedEmbedder`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from retrieval import Embedder, RetrievalLimits, Retriever, scan_source
from supervisor import ManualClock


class FixedEmbedder:
    """The ``model_id`` and ``context`` of a ``retrieval.Embedder``, fixed when it is made
    (read-only, as the protocol has them); subclasses add ``embed`` and ``count_tokens``."""

    def __init__(self, model_id: str, context: int) -> None:
        self.model_id: Final = model_id
        self.context: Final = context


class HashEmbedder(FixedEmbedder):
    """Deterministic vectors from word hashes: similar texts share words, hence direction."""

    def __init__(self, model_id: str, dim: int = 32) -> None:
        super().__init__(model_id, 512)
        self._dim = dim
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        out = []
        for text in texts:
            v = np.zeros(self._dim, dtype=np.float32)
            for word in text.lower().split():
                h = hashlib.sha256((self.model_id + word).encode()).digest()
                v[h[0] % self._dim] += 1.0
            v /= max(float(np.linalg.norm(v)), 1e-6)
            out.append([float(x) for x in v])
        return out

    async def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2


DOCS = {
    "disk": "web01 disk full: rotate nginx logs and check df",
    "db": "db02 replication lag: check replay timestamp",
    "vpn": "vpn tunnel flapping: tune dead peer detection",
}


async def fill(r: Retriever) -> None:
    await r.add_source("docs")
    for key, text in DOCS.items():
        await r.upsert("docs", key, text, doc_id=f"docs/{key}")


async def filled(root: Path, embedder: Embedder | None, limits: RetrievalLimits | None = None,
                 **kwargs: Any) -> Retriever:
    """A Retriever at ``root``, opened, with ``embedder`` (or none) and the :data:`DOCS`
    filled in; ``kwargs`` go to the Retriever."""
    r = Retriever(root, lambda: embedder, limits, **kwargs)
    await r.open()
    await fill(r)
    return r


async def scanned(root: Path, files: dict[str, str]) -> tuple[Retriever, Path]:
    """A Retriever at ``root``/index embedding with ``HashEmbedder("m")``, opened, with a
    directory source ``kb`` (``root``/kb, holding ``files``: name to text) scanned once;
    returns it and the source's directory."""
    kb = root / "kb"
    kb.mkdir()
    for name, text in files.items():
        (kb / name).write_text(text)
    r = Retriever(root / "index", lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("kb", root=kb)
    await scan_source(r, "kb")
    return r, kb


async def history_retriever(root: Path) -> tuple[Retriever, ManualClock]:
    """A Retriever at ``root``/index on a manual clock, opened, embedding with
    ``HashEmbedder("m")``, its retention run every 60 s: for history sources' tests."""
    clock = ManualClock()
    r = Retriever(root / "index", lambda: HashEmbedder("m"),
                  RetrievalLimits(retention_interval=60), clock=clock)
    await r.open()
    return r, clock
