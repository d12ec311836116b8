"""Long fuzz run: the properties of tests/support/fuzz.py, fresh seeds, many examples.

    .venv/bin/python -m bench.fuzz [--minutes 10] [--only NAME ...] [--batch 2000]
        [--out bench/RESULTS.md] [--raw FILE]

The test suite runs each property on a fixed, derandomized set of examples (so CI is
reproducible and fast); this runs the same :data:`tests.support.fuzz.PROPERTIES` with a
new random seed per batch, round-robin, until the time is up: each property gets an equal
share of ``--minutes``. A property that fails is shrunk by Hypothesis, recorded (the seed,
the error, the falsifying example and the ``@reproduce_failure`` blob) and not run again.

What ran is written into ``--out`` (the section ``## Fuzz``) and, with ``--raw``, as
JSON: per property the examples run, batches, seconds, seeds and failures. The exit
status is 1 when any property failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import HealthCheck, settings

from bench._support import ROOT, bench_parser, git_head, write_sections
from tests.support.fuzz import PROPERTIES, Property, run


@dataclass
class Tally:
    name: str
    examples: int = 0
    batches: int = 0
    seconds: float = 0.0
    seeds: list[int] = field(default_factory=list)
    failure: dict[str, Any] | None = None


def _batch(prop: Property, tally: Tally, size: int, seed: int) -> None:
    """Run ``size`` examples of ``prop`` with ``seed``; count them into ``tally``."""

    def counted(value: Any) -> None:
        tally.examples += 1
        prop.check(value)

    config = settings(deadline=None, database=None, derandomize=False, max_examples=size,
                      print_blob=True,
                      suppress_health_check=list(HealthCheck))
    test = run(Property(prop.name, prop.strategy, counted, prop.examples), config)
    began = time.monotonic()
    try:
        hypothesis.seed(seed)(test)()
    except Exception as exc:
        notes = "\n".join(getattr(exc, "__notes__", []))
        tally.failure = {
            "seed": seed,
            "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:],
            "example": notes[-4000:],
        }
    finally:
        tally.seconds += time.monotonic() - began
        tally.batches += 1
        tally.seeds.append(seed)


def fuzz(props: Sequence[Property], minutes: float, batch: int) -> list[Tally]:
    """Round-robin batches until each property used its share of ``minutes``."""
    share = minutes * 60 / len(props)
    tallies = {p.name: Tally(p.name) for p in props}
    sizes = {p.name: min(batch, 200) for p in props}  # first batches small: learn the rate
    rng = int.from_bytes(os.urandom(8), "big")
    while True:
        pending = [p for p in props if tallies[p.name].failure is None
                   and tallies[p.name].seconds < share]
        if not pending:
            break
        for prop in pending:
            tally = tallies[prop.name]
            rng = (rng * 6364136223846793005 + 1442695040888963407) % 2**64
            before, spent = tally.examples, tally.seconds
            _batch(prop, tally, sizes[prop.name], rng)
            rate = (tally.examples - before) / max(tally.seconds - spent, 1e-3)
            # Next, a batch of about 30 s or of what is left of the share, within --batch.
            left = share - tally.seconds
            sizes[prop.name] = max(20, min(batch, int(rate * min(30.0, max(left, 0.5)))))
            status = "FAILED" if tally.failure else "ok"
            print(f"fuzz {prop.name}: {tally.examples} examples, {tally.seconds:.0f} s "
                  f"({status})", flush=True)
    return list(tallies.values())


def section(tallies: Sequence[Tally], minutes: float, command: str, started: datetime
            ) -> list[str]:
    lines = [
        "## Fuzz",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; llamad commit {git_head('%h (%s)')}",
        f"- Machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, Hypothesis {hypothesis.__version__}",
        f"- Command: `{command}` ({minutes:g} minutes shared equally by the properties, "
        "a fresh random seed per batch)",
        "- The properties are those of tests/support/fuzz.py (tests/unit/test_fuzz.py runs "
        "each on a fixed, derandomized sample inside `make test`).",
        "",
        "| property | examples | batches | seconds | result |",
        "|---|---|---|---|---|",
    ]
    for t in tallies:
        result = "ok" if t.failure is None else f"**failed** (seed {t.failure['seed']})"
        lines.append(f"| {t.name} | {t.examples} | {t.batches} | {t.seconds:.0f} | {result} |")
    failed = [t for t in tallies if t.failure is not None]
    for t in failed:
        assert t.failure is not None
        lines += ["", f"{t.name}: {t.failure['error'].splitlines()[-1]}", "",
                  "```", t.failure["example"].strip(), "```"]
    return lines


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.fuzz", __doc__)
    p.add_argument("--minutes", type=float, default=10.0,
                   help="total time, shared equally by the properties (default 10)")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   choices=[prop.name for prop in PROPERTIES], help="run only these properties")
    p.add_argument("--batch", type=int, default=5000,
                   help="most examples per batch (one seed each; default 5000)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md",
                   help="Markdown results file; its '## Fuzz' section is replaced")
    p.add_argument("--raw", type=Path, help="also write the tallies as JSON here")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.batch < 1:
        p.error("--minutes must be positive and --batch at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    props = [p for p in PROPERTIES if not args.only or p.name in args.only]
    started = datetime.now(UTC)
    command = "python -m bench.fuzz " + " ".join(sys.argv[1:] if argv is None else argv)
    tallies = fuzz(props, args.minutes, args.batch)
    write_sections(args.out, [section(tallies, args.minutes, command.strip(), started)])
    if args.raw is not None:
        args.raw.write_text(json.dumps({
            "started": started.isoformat(), "minutes": args.minutes, "command": command,
            "commit": git_head("%h (%s)"), "hypothesis": hypothesis.__version__,
            "properties": [t.__dict__ for t in tallies],
        }, indent=1) + "\n")
    total = sum(t.examples for t in tallies)
    failed = [t.name for t in tallies if t.failure is not None]
    print(f"fuzz: {total} examples over {len(tallies)} properties; "
          + (f"FAILED: {', '.join(failed)}" if failed else "all held"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
