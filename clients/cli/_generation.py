"""The generation controls of ``llamad generate`` and ``llamad chat``: their flags, the
keyword arguments they become, and the logprobs table printed after the text."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, TextIO

from .._types import TokenLogprob, TokenLogprobs
from . import _format as fmt


class ControlError(Exception):
    """A control flag that cannot be used as given (a file that cannot be read, a bias
    that is not TOKEN=BIAS): a usage error."""


def add_controls(g: argparse._ArgumentGroup) -> None:
    """The control flags, in the ``sampling`` group of generate and chat."""
    g.add_argument("--min-p", type=float, metavar="P",
                   help="drop tokens less likely than P times the likeliest (0..1)")
    g.add_argument("--repeat-penalty", type=float, metavar="X",
                   help="penalise recently seen tokens (> 0; 1 is off)")
    g.add_argument("--repeat-last-n", type=int, metavar="N",
                   help="how many recent tokens the penalties look at (0 is off)")
    g.add_argument("--presence-penalty", type=float, metavar="X", help="-2..2 (OpenAI's)")
    g.add_argument("--frequency-penalty", type=float, metavar="X", help="-2..2 (OpenAI's)")
    g.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN=BIAS",
                   help="add BIAS (-100..100; -100 bans) to a token id, or to every token "
                        "of a text (repeatable)")
    g.add_argument("--logprobs", type=int, metavar="N",
                   help="show each token's log-probability and its N likeliest "
                        "alternatives")
    form = g.add_mutually_exclusive_group()
    form.add_argument("--json-object", action="store_true",
                      help="constrain the output to a JSON object")
    form.add_argument("--json-schema", metavar="FILE",
                      help="constrain the output to JSON matching the schema in FILE")
    form.add_argument("--grammar", metavar="FILE",
                      help="constrain the output to the GBNF grammar in FILE")
    g.add_argument("--dry-multiplier", type=float, metavar="X",
                   help="DRY repetition penalty (0 is off; 0.8 is usual)")
    g.add_argument("--dry-base", type=float, metavar="X", help="DRY base (>= 1)")
    g.add_argument("--dry-allowed-length", type=int, metavar="N",
                   help="repeats up to N tokens long go unpenalised by DRY")
    g.add_argument("--dry-penalty-last-n", type=int, metavar="N",
                   help="how many recent tokens DRY scans (0 is off)")


def controls(args: argparse.Namespace) -> dict[str, Any]:
    """The client keyword arguments of the control flags.

    Raises:
        ControlError: an unreadable file, a malformed --logit-bias.
    """
    out: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
                     "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
                     "dry_penalty_last_n")}
    if args.logit_bias:
        out["logit_bias"] = dict(_bias(item) for item in args.logit_bias)
    if args.logprobs is not None:
        out["logprobs"], out["top_logprobs"] = True, args.logprobs
    if args.json_object:
        out["response_format"] = "json_object"
    if args.json_schema:
        out["json_schema"] = _read(args.json_schema, "--json-schema")
    if args.grammar:
        out["grammar"] = _read(args.grammar, "--grammar")
    return out


def _bias(item: str) -> tuple[int | str, float]:
    token, sep, value = item.rpartition("=")
    try:
        bias = float(value)
    except ValueError:
        bias = math.nan
    if not sep or not token or not math.isfinite(bias):
        raise ControlError(f"--logit-bias {item!r}: give TOKEN=BIAS, e.g. 15=-100 or "
                           "' no'=-5")
    return (int(token) if token.isdigit() else token), bias


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ControlError(f"{flag} {path}: {why}") from None


def print_logprobs(out: TextIO, entries: tuple[TokenLogprobs, ...]) -> None:
    """A table: each generated token, its log-probability, and the alternatives."""
    def shown(t: TokenLogprob) -> str:
        return f"{t.token!r} {t.logprob:.3f}"

    rows = [[repr(e.chosen.token), f"{e.chosen.logprob:.3f}",
             "  ".join(shown(t) for t in e.top)] for e in entries]
    out.write(fmt.table(rows, ["token", "logprob", "alternatives"]) + "\n")
    out.flush()
