"""Chat's and Ask's configured sampling defaults (limits.chat_*, answer.*): they fill
what a request leaves unset, a request overrides each, Generate keeps none, and a
runtime without a defaulted control goes without it instead of refusing the call."""

from __future__ import annotations

import dataclasses

import pytest

from daemon.checks import validation
from daemon.config import AnswerConfig, Limits
from llamad_protocol.v1 import inference_pb2 as ipb
from supervisor import BUNDLED, LLAMA_CPP, OPENAI, Sampling, UnsupportedParameterError

GUARDED = Limits(chat_temperature=0.7, chat_top_p=0.9, chat_min_p=0.05,
                 chat_repeat_penalty=1.1, chat_dry_multiplier=0.8, chat_frequency_penalty=0.5)


def test_chat_defaults_fill_what_a_request_leaves_unset() -> None:
    """An empty SamplingParams on Chat takes the configured temperature, top_p, min_p,
    repeat_penalty, DRY multiplier and frequency_penalty; the controls are marked as
    defaults."""
    got = validation.sampling(ipb.SamplingParams(), GUARDED,
                              defaults=validation.chat_defaults(GUARDED))
    assert (got.temperature, got.top_p, got.min_p, got.repeat_penalty, got.dry_multiplier,
            got.frequency_penalty) == pytest.approx((0.7, 0.9, 0.05, 1.1, 0.8, 0.5))
    assert got.defaulted == {"min_p", "repeat_penalty", "dry_multiplier",
                             "frequency_penalty"}


def test_a_request_overrides_each_default() -> None:
    """Values the request sets win, 0 included (greedy, DRY off), and are its own."""
    params = ipb.SamplingParams(temperature=0.0, dry_multiplier=0.0, top_p=0.5,
                                frequency_penalty=0.0)
    got = validation.sampling(params, GUARDED, defaults=validation.chat_defaults(GUARDED))
    assert (got.temperature, got.dry_multiplier, got.top_p, got.frequency_penalty) == (
        0.0, 0.0, 0.5, 0.0)
    assert not {"dry_multiplier", "frequency_penalty"} & got.defaulted
    assert got.repeat_penalty == pytest.approx(1.1)


def test_neutral_option_values_turn_a_control_off() -> None:
    """top_p 1, min_p 0, repeat_penalty 1, dry_multiplier 0 and frequency_penalty 0 send
    nothing."""
    off = Limits(chat_temperature=0.0, chat_top_p=1.0, chat_min_p=0.0,
                 chat_repeat_penalty=1.0, chat_dry_multiplier=0.0, chat_frequency_penalty=0.0)
    got = validation.sampling(ipb.SamplingParams(), off,
                              defaults=validation.chat_defaults(off))
    assert got.requested() == [] and got.top_p is None and got.temperature == 0.0


def test_generate_has_no_defaults_and_stays_greedy() -> None:
    """Without defaults (Generate), an empty request is greedy with no guard."""
    got = validation.sampling(ipb.SamplingParams(), GUARDED)
    assert (got.temperature, got.top_p, got.requested()) == (0.0, None, [])


def test_ask_takes_the_answer_sections_defaults() -> None:
    """Ask's defaults are answer.*, independent of Chat's."""
    answer = AnswerConfig(temperature=0.2, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                          dry_multiplier=1.5, frequency_penalty=0.0)
    got = validation.sampling(ipb.SamplingParams(), Limits(), call="Ask",
                              defaults=validation.answer_defaults(answer))
    assert got.temperature == pytest.approx(0.2)
    assert (got.dry_multiplier, got.repeat_penalty) == (1.5, None)


def test_a_defaulted_control_is_left_out_where_the_runtime_lacks_it() -> None:
    """A default DRY goes to llama-server, is left out (not refused) for the bundled
    runtime and other endpoints; the same control asked for by the caller is refused."""
    defaulted = Sampling(temperature=0.7, dry_multiplier=0.8, repeat_penalty=1.1,
                         defaulted=frozenset({"dry_multiplier", "repeat_penalty"}))
    assert defaulted.to_json(LLAMA_CPP, chat=True)["dry_multiplier"] == 0.8
    bundled = defaulted.to_json(BUNDLED, chat=True)
    assert "dry_multiplier" not in bundled and bundled["repeat_penalty"] == 1.1
    assert not {"dry_multiplier", "repeat_penalty"} & set(defaulted.to_json(OPENAI, chat=True))
    defaulted.check(BUNDLED, chat=True)  # no refusal
    asked = dataclasses.replace(defaulted, defaulted=frozenset())
    with pytest.raises(UnsupportedParameterError, match="dry_multiplier"):
        asked.to_json(BUNDLED, chat=True)
