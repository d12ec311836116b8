"""Request limits small enough to reach in a test, and a hypothesis strategy for sampling
parameters of any value, shared by the validation tests and the fuzzing."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from daemon.config import Limits
from llamad_protocol.v1 import inference_pb2 as pb

LIMITS = Limits(
    max_prompt_chars=100,
    max_messages=3,
    default_max_tokens=16,
    max_tokens=64,
    max_stop=2,
    max_embed_batch=3,
    max_embed_chars=50,
    queue_size=4,
    max_message_bytes=1024,
)


_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)


def _mixed(anything: st.SearchStrategy[Any], near: st.SearchStrategy[Any]) -> Any:
    """Any value of the field's type, or one near its valid range to reach the edges."""
    return st.one_of(anything, near)


@st.composite
def sampling_params(draw: st.DrawFn) -> Any:
    """SamplingParams with each optional field set or not, to any value its type allows."""
    fields: dict[str, Any] = {}
    if draw(st.booleans()):
        fields["max_tokens"] = draw(_mixed(st.integers(0, 2**32 - 1), st.integers(0, 70)))
    if draw(st.booleans()):
        fields["temperature"] = draw(_mixed(st.floats(width=32), st.floats(-0.5, 5.5, width=32)))
    if draw(st.booleans()):
        fields["top_p"] = draw(_mixed(st.floats(width=32), st.floats(-0.125, 1.125, width=32)))
    if draw(st.booleans()):
        fields["top_k"] = draw(_mixed(st.integers(0, 2**32 - 1), st.integers(99_990, 100_010)))
    if draw(st.booleans()):
        fields["seed"] = draw(_mixed(st.integers(0, 2**64 - 1),
                                     st.integers(2**32 - 5, 2**32 + 5)))
    fields["stop"] = draw(st.lists(st.one_of(_TEXT, st.sampled_from(["", "z" * 256])),
                                   max_size=3))
    return pb.SamplingParams(**fields)
