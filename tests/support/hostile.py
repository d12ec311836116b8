"""What the hostile-input tests share (tests/integration/test_hostile_*.py): the documents a
module's daemon indexes before the first case, each with a word found nowhere else (its search
key), and the checks every case ends with: the call is refused with a clear status code and a
one-line message, and afterwards nothing already stored is lost or changed (``intact``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from daemon import Daemon
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.conftest import SMALL_MODEL
from tests.support.daemon import Clients

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def deep_schema(levels: int) -> dict[str, object]:
    """A JSON schema of strings nested ``levels`` arrays deep (a grammar too deep to build)."""
    schema: dict[str, object] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


# Each stored document carries a word found nowhere else: its search key.
PUSHED = {
    "seed/web01-disk": ("web01 disk full", "When web01 reports No space left on device, the "
                        "nginx access logs have grown: rotate them. Keyword zephyrquartz."),
    "seed/db02-lag": ("db02 replication lag", "If db02 falls behind the primary, look for "
                      "long-running queries on the replica. Keyword mauvelantern."),
    "seed/vpn-flap": ("VPN tunnel flapping", "The IPsec tunnel flaps when dead peer detection "
                      "is too aggressive; set dpd 30. Keyword copperheron."),
}
FILES = {
    "runbooks/backup.md": "# Backup\n\nThe nightly backup job writes to the NAS; check its "
                          "log when it fails. Keyword saffronotter.\n",
    "configs/sw1.cfg": "hostname sw1\n!\ninterface GigabitEthernet0/1\n description uplink "
                       "obsidianmoth\n!\n",
}
KEYS = {"zephyrquartz": "seed/web01-disk", "mauvelantern": "seed/db02-lag",
        "copperheron": "seed/vpn-flap", "saffronotter": "files/runbooks/backup.md",
        "obsidianmoth": "files/configs/sw1.cfg"}


@dataclass
class Hostile:
    daemon: Daemon
    c: Clients
    r: Any            # RetrievalServiceStub
    ask: Any          # AnswerServiceStub
    drop: Path        # the hostile directory source's root
    models: Path      # scratch space for model paths
    status: rpb.RetrievalStatusResponse
    listed: dict[str, tuple[int, str]]


async def listed(h: Hostile) -> dict[str, tuple[int, str]]:
    docs = (await h.r.ListDocuments(rpb.ListDocumentsRequest())).documents
    return {d.id: (d.state, d.title) for d in docs}


async def intact(h: Hostile) -> None:
    """Nothing stored was lost or changed, search is still hybrid, and Generate answers."""
    status = await h.r.Status(rpb.RetrievalStatusRequest())
    assert (status.sources, status.chunks, status.vectors, status.embedded_chunks) == (
        h.status.sources, h.status.chunks, h.status.vectors, h.status.embedded_chunks)
    assert dict(status.documents_by_state) == dict(h.status.documents_by_state)
    assert await listed(h) == h.listed
    for word, doc_id in KEYS.items():
        found = await h.r.Search(rpb.SearchRequest(query=word, top_k=1))
        assert found.mode == rpb.SEARCH_MODE_HYBRID, found.warnings
        assert [hit.document_id for hit in found.hits] == [doc_id]
        assert word in found.hits[0].text
    out = [m async for m in h.c.inference.Generate(pb.GenerateRequest(
        prompt="The capital of France is", sampling=pb.SamplingParams(max_tokens=2)))]
    assert out[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert out[-1].usage.completion_tokens >= 1
    assert out[-1].model == SMALL_MODEL


async def refused(call: Awaitable[Any] | AsyncIterable[Any], code: grpc.StatusCode,
                  *needles: str) -> str:
    """Await a unary call or drain a stream; it must fail with ``code`` and a message
    holding every needle (and no raw control character: one printable line)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if isinstance(call, AsyncIterable):
            _ = [m async for m in call]
        else:
            await call
    details = err.value.details() or ""
    assert err.value.code() == code, details
    for needle in needles:
        assert needle in details, (needle, details)
    assert details.isprintable(), details
    return details
