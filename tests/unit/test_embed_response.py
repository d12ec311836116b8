"""Embed answers: rows scaled to unit length, and Embedding messages filled straight from
float32 bytes (the packed wire form of ``repeated float``)."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.grpcapi.inference import _embedding
from daemon.services.inference import l2_rows as _l2_rows
from llamad_protocol.v1 import inference_pb2


@pytest.mark.parametrize("dim", [0, 1, 31, 32, 384, 4096, 40000])
def test_an_embedding_message_carries_exactly_the_float32_values(dim: int) -> None:
    rng = np.random.default_rng(dim)
    row = rng.normal(size=dim).astype(np.float32)
    row[: min(dim, 3)] = [np.inf, -0.0, 1e-45][: min(dim, 3)]
    msg = _embedding(row)
    assert np.array_equal(np.array(msg.values, dtype=np.float32), row)
    # The same bytes as protobuf's own encoding of the field, so any client decodes it.
    assert msg.SerializeToString() == inference_pb2.Embedding(
        values=row.tolist()).SerializeToString()


def test_a_float64_row_is_sent_as_float32() -> None:
    row = np.array([0.1, 1 / 3], dtype=np.float64)
    sent = _embedding(row)  # type: ignore[arg-type]
    assert list(sent.values) == [float(np.float32(0.1)), float(np.float32(1 / 3))]


def test_rows_are_scaled_to_unit_length_and_a_zero_row_is_kept() -> None:
    matrix = np.array([[3, 4, 0], [0, 0, 0], [1e-30, 0, 0]], dtype=np.float32)
    unit = _l2_rows(matrix)
    assert unit.dtype == np.float32
    expected = np.array([[0.6, 0.8, 0], [0, 0, 0], [1, 0, 0]], dtype=np.float32)
    assert np.allclose(unit, expected, rtol=1e-7, atol=0)
    assert not np.isnan(unit).any()
    assert _l2_rows(np.zeros((0, 384), dtype=np.float32)).shape == (0, 384)
