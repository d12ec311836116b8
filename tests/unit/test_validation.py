"""Request validation: defaults filled, every limit enforced with a message naming the
field and the limit, and nothing but InvalidArgument ever raised for bad sampling input."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings

from daemon.checks import validation
from daemon.errors import InvalidArgument
from llamad_protocol.v1 import inference_pb2 as pb
from supervisor import Sampling
from tests.support.requests import LIMITS, sampling_params


def sampling(**fields: Any) -> Sampling:
    return validation.sampling(pb.SamplingParams(**fields), LIMITS)


def user(text: str) -> Any:
    return pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=text)


def chat(*messages: Any) -> list[Any]:
    return validation.chat_messages(pb.ChatRequest(messages=list(messages)), LIMITS)


# --- sampling --------------------------------------------------------------------------


def test_sampling_defaults_filled() -> None:
    """Unset fields become the configured default max_tokens, greedy, and no extras."""
    assert sampling() == Sampling(max_tokens=16, temperature=0.0, top_p=None, top_k=None,
                                  seed=None, stop=())


def test_sampling_values_pass_through() -> None:
    """Valid values set by the caller are kept as given."""
    got = sampling(max_tokens=64, temperature=0.5, top_p=1.0, top_k=40, seed=2**32 - 1,
                   stop=["\n\n", "x" * 256])
    assert got == Sampling(64, 0.5, 1.0, 40, 2**32 - 1, ("\n\n", "x" * 256))


def test_explicit_zero_values_are_not_defaults() -> None:
    """An explicit temperature 0, top_k 0 and seed 0 are kept, not mistaken for unset."""
    got = sampling(temperature=0.0, top_k=0, seed=0)
    assert (got.temperature, got.top_k, got.seed) == (0.0, 0, 0)


@pytest.mark.parametrize("max_tokens", [0, 65, 2**32 - 1])
def test_max_tokens_out_of_range(max_tokens: int) -> None:
    """max_tokens outside 1..limits.max_tokens is refused, naming field and limit."""
    with pytest.raises(InvalidArgument) as exc_info:
        sampling(max_tokens=max_tokens)
    message = str(exc_info.value)
    assert "sampling.max_tokens" in message
    assert "1..64" in message
    assert "(limits.max_tokens)" in message
    assert f"got {max_tokens}" in message


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -math.inf, -0.1, 5.5])
def test_temperature_out_of_range(temperature: float) -> None:
    """NaN, infinite, negative or above-5 temperatures are refused."""
    with pytest.raises(InvalidArgument, match=r"sampling\.temperature must be in 0\.\.5"):
        sampling(temperature=temperature)


def test_temperature_bounds_are_inclusive() -> None:
    """0 and 5 are valid temperatures."""
    assert sampling(temperature=5.0).temperature == 5.0
    assert sampling(temperature=0.0).temperature == 0.0


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01, math.nan, math.inf])
def test_top_p_out_of_range(top_p: float) -> None:
    """top_p must be in (0, 1]: zero, negative, above one, NaN and inf are refused."""
    with pytest.raises(InvalidArgument, match=re.escape("sampling.top_p must be in (0, 1]")):
        sampling(top_p=top_p)


def test_top_p_small_positive_is_valid() -> None:
    """A tiny positive top_p is inside (0, 1]."""
    top_p = sampling(top_p=1e-6).top_p
    assert top_p is not None
    assert 0 < top_p < 1e-5


def test_top_k_and_seed_limits() -> None:
    """top_k above 100000 and seeds that do not fit 32 bits are refused."""
    assert sampling(top_k=100_000).top_k == 100_000
    with pytest.raises(InvalidArgument, match=r"sampling\.top_k must be at most 100000"):
        sampling(top_k=100_001)
    with pytest.raises(InvalidArgument, match=r"sampling\.seed must fit in 32 bits"):
        sampling(seed=2**32)


def test_too_many_stop_strings() -> None:
    """More stop strings than limits.max_stop is refused, naming the field and the limit."""
    with pytest.raises(InvalidArgument) as exc_info:
        sampling(stop=["a", "b", "c"])
    message = str(exc_info.value)
    assert "sampling.stop has 3 strings" in message
    assert "the limit is 2 (limits.max_stop)" in message


@pytest.mark.parametrize("stop", ["", "y" * 257])
def test_stop_string_length(stop: str) -> None:
    """Empty and over-256-character stop strings are refused."""
    with pytest.raises(InvalidArgument, match=r"sampling\.stop strings must be 1\.\.256"):
        sampling(stop=["ok", stop])


@settings(max_examples=300, deadline=None, database=None)
@given(sampling_params())
def test_sampling_property_within_limits_or_invalid_argument(params: Any) -> None:
    """For any field values, sampling() returns in-limit values or raises InvalidArgument."""
    reason = ""
    try:
        got = validation.sampling(params, LIMITS)
    except InvalidArgument as exc:
        reason = str(exc)
    if reason:
        assert reason.startswith("sampling.")
        return
    assert 1 <= got.max_tokens <= LIMITS.max_tokens
    assert math.isfinite(got.temperature)
    assert 0.0 <= got.temperature <= 5.0
    assert got.top_p is None or (math.isfinite(got.top_p) and 0.0 < got.top_p <= 1.0)
    assert got.top_k is None or 0 <= got.top_k <= 100_000
    assert got.seed is None or 0 <= got.seed < 2**32
    assert len(got.stop) <= LIMITS.max_stop
    assert all(1 <= len(s) <= 256 for s in got.stop)
    assert got.stop == tuple(params.stop)
    if params.HasField("max_tokens"):
        assert got.max_tokens == params.max_tokens
    else:
        assert got.max_tokens == LIMITS.default_max_tokens


# --- prompt ----------------------------------------------------------------------------


def test_prompt_valid_is_returned() -> None:
    """A prompt within the limit is returned unchanged (whitespace included)."""
    text = " x" * 50
    assert validation.prompt(pb.GenerateRequest(prompt=text), LIMITS) == text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"^prompt is empty$"),
        ("p" * 101, r"^prompt has 101 characters; the limit is 100 \(limits\.max_prompt_chars\)$"),
        ("a\x00b", r"^prompt contains a NUL character$"),
    ],
)
def test_prompt_refused(text: str, match: str) -> None:
    """Empty, over-long and NUL-bearing prompts are refused with a message naming why."""
    with pytest.raises(InvalidArgument, match=match):
        validation.prompt(pb.GenerateRequest(prompt=text), LIMITS)


# --- chat ------------------------------------------------------------------------------


def test_chat_roles_mapped() -> None:
    """Roles become their names; an empty assistant turn before the last one is allowed."""
    got = chat(
        pb.ChatMessage(role=pb.CHAT_ROLE_SYSTEM, content="be brief"),
        pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, content=""),
        user("hi"),
    )
    assert got == [("system", "be brief"), ("assistant", ""), ("user", "hi")]


def test_chat_empty() -> None:
    """A chat with no messages is refused."""
    with pytest.raises(InvalidArgument, match=r"^messages is empty$"):
        chat()


@pytest.mark.parametrize("role", [pb.CHAT_ROLE_UNSPECIFIED, 99])
def test_chat_role_unspecified_or_unknown(role: int) -> None:
    """A message without a known role is refused, naming its index."""
    with pytest.raises(InvalidArgument, match=r"^messages\[1\]\.role is unspecified or unknown"):
        chat(user("a"), pb.ChatMessage(role=role, content="b"))  # type: ignore[arg-type]


def test_chat_last_message_from_assistant() -> None:
    """A chat ending with the assistant's turn is refused."""
    with pytest.raises(InvalidArgument, match="last message must not be from the assistant"):
        chat(user("hi"), pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, content="hello"))


def test_chat_too_many_messages() -> None:
    """More messages than limits.max_messages is refused, naming the limit."""
    with pytest.raises(InvalidArgument,
                       match=r"^4 messages; the limit is 3 \(limits\.max_messages\)$"):
        chat(user("a"), user("b"), user("c"), user("d"))


def test_chat_empty_user_content() -> None:
    """An empty user message is refused, naming its index."""
    with pytest.raises(InvalidArgument, match=r"^messages\[1\]\.content is empty$"):
        chat(user("a"), user(""))


def test_chat_one_message_too_long() -> None:
    """A single message over the prompt limit is refused, naming it and the limit."""
    with pytest.raises(InvalidArgument, match=r"^messages\[0\]\.content has 101 characters; "
                       r"the limit is 100 \(limits\.max_prompt_chars\)$"):
        chat(user("m" * 101))


def test_chat_total_too_long() -> None:
    """Messages each within the limit but over it together are refused."""
    with pytest.raises(InvalidArgument, match=r"^messages have 120 characters in all; "
                       r"the limit is 100 \(limits\.max_prompt_chars\)$"):
        chat(user("m" * 60), user("n" * 60))
    assert len(chat(user("m" * 50), user("n" * 50))) == 2


def test_chat_nul_character() -> None:
    """A NUL character in a message is refused, naming its index."""
    with pytest.raises(InvalidArgument, match=r"^messages\[0\]\.content contains a NUL"):
        chat(user("a\x00"))


# --- embeddings ------------------------------------------------------------------------


def test_embed_texts_valid() -> None:
    """Valid texts are returned as a list, in order."""
    assert validation.embed_texts(("a", "b b"), LIMITS) == ["a", "b b"]


@pytest.mark.parametrize(
    ("texts", "match"),
    [
        ([], r"^texts is empty$"),
        (["a", "b", "c", "d"], r"^4 texts; the limit is 3 \(limits\.max_embed_batch\)$"),
        (["a", " \n\t"], r"^texts\[1\] is empty$"),
        (["a", ""], r"^texts\[1\] is empty$"),
        (["e" * 51], r"^texts\[0\] has 51 characters; the limit is 50 "
                     r"\(limits\.max_embed_chars\)$"),
        (["ok", "x\x00y"], r"^texts\[1\] contains a NUL character$"),
    ],
)
def test_embed_texts_refused(texts: list[str], match: str) -> None:
    """Empty batches, too many texts, blank, over-long and NUL-bearing texts are refused."""
    with pytest.raises(InvalidArgument, match=match):
        validation.embed_texts(texts, LIMITS)


def test_embed_text_at_limit_is_valid() -> None:
    """A text of exactly limits.max_embed_chars and a full batch are accepted."""
    assert len(validation.embed_texts(["e" * 50, "f", "g"], LIMITS)) == 3
