"""The reserved slot inside the child: a batch or background call's embedding request is
sent ``slots - 1`` texts at a time, so that llama-server (which serves each text of a
request as a task of its own, on any free slot, in arrival order) keeps a slot free for
an interactive query embedding, as admission does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from daemon.models import lanes
from daemon.models.admission import Admission
from daemon.models.backend import _ClientBackend
from daemon.models.lanes import Lane, LanePolicy
from supervisor import EmbedResult, InferenceClient

INT, B, G = Lane.INTERACTIVE, Lane.BATCH, Lane.BACKGROUND


class Embeds:
    """An embedding client that records the texts of each request; row i of a request's
    matrix is the text's number (its last word), so order can be checked."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []

    async def embed(self, texts: Sequence[str | Sequence[int]]) -> EmbedResult:
        batch = [str(t) for t in texts]
        self.requests.append(batch)
        rows = np.array([[float(t.split()[-1]), 1.0] for t in batch], dtype=np.float32)
        return EmbedResult(rows, 3 * len(batch))


def test_only_lower_lanes_of_a_multi_slot_child_share_with_lanes_and_the_reserve_on() -> None:
    on = LanePolicy()
    assert [on.texts_per_request(lane, 2) for lane in (INT, B, G)] == [0, 1, 1]
    assert on.texts_per_request(G, 4) == 3
    assert on.texts_per_request(G, 1) == 0  # nothing kept back on a one-slot child
    assert LanePolicy(reserve_interactive=False).texts_per_request(G, 4) == 0
    assert LanePolicy(enabled=False).texts_per_request(G, 4) == 0


async def test_a_slot_sets_the_share_of_its_lane_for_the_call_and_resets_it() -> None:
    adm = Admission("embedding", limit=2, queue_size=4, ahead=2)
    seen = {}
    for lane in (INT, B, G):
        async with adm.slot(lane=lane):
            seen[lane] = lanes.texts_per_request()
    assert seen == {INT: 0, B: 1, G: 1}
    assert lanes.texts_per_request() == 0
    off = Admission("embedding", limit=2, queue_size=4, lanes=LanePolicy(enabled=False))
    async with off.slot(lane=G):  # lanes off: a background call is interactive
        assert lanes.texts_per_request() == 0


async def embed_in(lane: Lane, slots: int, count: int
                   ) -> tuple[list[list[str]], EmbedResult, list[str]]:
    """``count`` texts embedded by a call of ``lane`` holding a slot of a ``slots``-slot
    child: (the requests the child got, the result, the texts)."""
    fake = Embeds()
    texts = [f"text {i}" for i in range(count)]
    async with Admission("embedding", limit=slots, queue_size=4).slot(lane=lane):
        result = await _ClientBackend(cast(InferenceClient, fake)).embed(texts)
    return fake.requests, result, texts


async def test_a_background_batch_goes_to_the_child_in_shares_and_comes_back_whole() -> None:
    requests, result, texts = await embed_in(G, 3, 7)
    assert requests == [texts[0:2], texts[2:4], texts[4:6], texts[6:7]]
    assert result.matrix[:, 0].tolist() == list(range(7))
    assert result.matrix.dtype == np.float32
    assert result.prompt_tokens == 21


async def test_an_interactive_batch_goes_whole() -> None:
    requests, result, texts = await embed_in(INT, 2, 5)
    assert requests == [texts]
    assert result.matrix.shape == (5, 2)
