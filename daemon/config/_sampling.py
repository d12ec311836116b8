"""Chat's and Ask's sampling defaults (``limits.chat_*`` and ``answer.*``): the same six
options for two kinds of call, declared from one table (:func:`sampling`) so that their
help and bounds cannot drift apart; only their defaults differ. The defaults were chosen by
bench/bench_answer_quality.py on the default-model candidates (bench/RESULTS.md, "Answer
quality"); docs/generation.md, "Sampling defaults", says why. Generate stays greedy.
"""

from __future__ import annotations

from typing import Any, Literal

from ._options import setting

# option: (Chat's default, Ask's default, its help after "Chat's " or "Ask's ")
_TABLE: dict[str, tuple[float, float, str]] = {
    "temperature": (0.7, 0.3, "sampling temperature when a request sets none (0: greedy)."),
    "top_p": (0.9, 0.9, "top_p when a request sets none (1: off)."),
    "min_p": (0.05, 0.05, "min_p when a request sets none (0: off)."),
    "repeat_penalty": (1.0, 1.0, "repeat_penalty when a request sets none (1: off)."),
    "dry_multiplier": (0.8, 0.8, "DRY repetition penalty multiplier when a request sets none "
                       "(0: off; llama-server only, left out for other runtimes)."),
    "frequency_penalty": (0.5, 0.5, "frequency_penalty when a request sets none (0: off)."),
}


def sampling(call: Literal["Chat", "Ask"], name: str) -> Any:
    """The section field (:func:`~daemon.config._options.setting`) of sampling option
    ``name`` for ``call``: its default from the table, at least 0."""
    chat, ask, text = _TABLE[name]
    return setting(chat if call == "Chat" else ask, minimum=0, help=f"{call}'s {text}")
