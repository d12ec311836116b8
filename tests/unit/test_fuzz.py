"""Property-based fuzzing of what hostile callers and files reach first: request
validation, the undecodable-bytes guard of daemon.grpcapi.wire, the chunkers, the embedding-context
fitting of the retriever, and the redactor.

The properties themselves are in :mod:`tests.support.fuzz` (shared with ``python -m
bench.fuzz``, which runs them with fresh random seeds and many more examples). Here every
one runs a bounded, derandomized number of examples (the whole file takes well under 60 s
on two cores, and CI sees the same examples every time).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import settings

from daemon.grpcapi.wire import Malformed, _guard_deserializer
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2
from tests.support.fuzz import CI, PROPERTIES, Property, run


@pytest.mark.parametrize("prop", PROPERTIES, ids=[p.name for p in PROPERTIES])
def test_property(prop: Property) -> None:
    """Each property holds for its derandomized examples."""
    run(prop, settings(CI, max_examples=prop.examples))()


def test_properties_are_named_uniquely() -> None:
    """bench/fuzz.py reports by name."""
    assert len({p.name for p in PROPERTIES}) == len(PROPERTIES)


def test_wire_guard_examples() -> None:
    """Known bytes get the exact diagnosis (the property checks only its shape)."""
    guard = _guard_deserializer(pb.ChatRequest.FromString)
    bad = pb.ChatRequest(messages=[pb.ChatMessage(content="ok"), pb.ChatMessage(content="@@")])
    got = guard(bad.SerializeToString().replace(b"@@", b"\xc3\x28"))
    assert got == Malformed("request is not a valid llamad.v1.ChatRequest: field "
                            "messages[1].content is not valid UTF-8 (byte 0 of its 2-byte "
                            "value); proto3 string fields must be UTF-8")
    assert guard(b"\x0a\x10abc") == Malformed(
        "request is not a valid llamad.v1.ChatRequest: field messages[0] at byte 0 claims 16 "
        "bytes but only 3 remain")
    nested = b"\x0a\x00" * 3 + b"\x12\x02\x08\x01"  # three empty messages, then sampling
    assert guard(nested) == pb.ChatRequest.FromString(nested)
    deep = b""
    for _ in range(120):  # SearchFilters cannot nest; unknown groups can
        deep = b"\x1b" + deep + b"\x1c"  # field 3, start group ... end group
    result = _guard_deserializer(pb.GenerateRequest.FromString)(deep)
    assert isinstance(result, Malformed) or result == pb.GenerateRequest.FromString(deep)
    random_bytes = random.Random(5).randbytes(200)
    result = _guard_deserializer(retrieval_pb2.SearchRequest.FromString)(random_bytes)
    assert isinstance(result, Malformed)
    assert result.message.startswith("request is not a valid llamad.v1.SearchRequest: ")
