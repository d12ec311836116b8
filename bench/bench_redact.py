"""Redaction benchmark: llamad's redactor against Yelp's detect-secrets (issue 18).

    .venv/bin/python -m bench.bench_redact [--baseline REV] [--doc-mb 10] [--ds-mb 1]
        [--out bench/RESULTS.md] [--raw FILE]

On the labelled corpus of tests/data/redaction (``secrets.jsonl``: a text and the secret
in it; ``lookalikes.jsonl``: texts that hold none; values fake, shapes real; built by
``make_corpus.py`` there):

* **recall**: the share of secrets removed, overall and on the shapes the README promises
  (rows without ``"promised": false``). llamad: ``redact(text)`` no longer contains
  the secret. detect-secrets (1.5, all default plugins and filters, ``default_settings``):
  the text is written to a file and scanned with ``scan_file`` as ``document.txt`` and as
  ``document.yaml`` (its keyword plugin reads quoted values in the first, config-style
  ``key: value`` in the second); a secret is caught when a plugin reports a secret on a
  line the secret is on, in either scan.
* **false positives**: the share of look-alikes changed (llamad) or with any secret
  reported (detect-secrets).
* per kind, printed (and with ``--raw``, written as JSON).

Then **throughput** on a realistic mixed document of ``--doc-mb`` MB (built here,
deterministic): prose from this repository's Markdown, daemon source code, generated
configuration files (nginx, Cisco, Kubernetes YAML, .env), generated logs (timestamps,
UUIDs, addresses, digests), some non-English prose, and about 1% corpus lines. llamad's
``redact`` on the whole document (CPU time, best of three rounds, interleaved with the
baseline's); detect-secrets ``scan_file`` on its first ``--ds-mb`` MB (it is two orders
of magnitude slower), as .txt and as .yaml like above.

With ``--baseline REV`` the redactor of revision REV (its ``retrieval/_redact*.py``,
imported from a temporary directory as a package of their own) is measured the same way,
for before/after; its throughput is timed interleaved with the current one's.

Results are printed and written into ``--out`` (the section ``## Redaction (issue 18)``
is created or replaced, others kept). Needs detect-secrets (in the ``dev`` extras).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from bench._support import ROOT, bench_parser, git_head, write_sections
from retrieval.redaction._redactor import redact

try:
    from detect_secrets.core.scan import scan_file
    from detect_secrets.settings import default_settings
except ImportError:  # pragma: no cover - the message says what to do
    sys.exit("bench_redact: detect-secrets is not installed: .venv/bin/pip install "
             "detect-secrets (or make install, which installs the dev extras)")

CORPUS = ROOT / "tests" / "data" / "redaction"
HEADING = "## Redaction (issue 18)"
MB = 1_000_000

Redactor = Callable[[str], str]


# -- corpus -----------------------------------------------------------------------------


def load(name: str) -> list[dict[str, str]]:
    with (CORPUS / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def secret_lines(text: str, secret: str) -> set[int]:
    """1-based numbers of the lines ``secret`` is on in ``text``."""
    at = text.index(secret)
    first = text.count("\n", 0, at) + 1
    return set(range(first, text.count("\n", 0, at + len(secret)) + 2))


class DetectSecrets:
    """detect-secrets' file scan, as used on a repository (see the module docstring)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-redact-"))

    def flagged_lines(self, text: str) -> set[int]:
        lines: set[int] = set()
        with default_settings():
            for name in ("document.txt", "document.yaml"):
                path = self.dir / name
                path.write_text(text, encoding="utf-8")
                lines |= {secret.line_number for secret in scan_file(str(path))}
        return lines


@dataclass
class Score:
    """Per detector: secrets caught and look-alikes flagged, by kind."""

    caught: Counter[str] = field(default_factory=Counter)
    secrets: Counter[str] = field(default_factory=Counter)
    caught_promised: int = 0
    promised: int = 0
    flagged: Counter[str] = field(default_factory=Counter)
    lookalikes: Counter[str] = field(default_factory=Counter)

    @property
    def recall(self) -> float:
        return sum(self.caught.values()) / max(1, sum(self.secrets.values()))

    @property
    def recall_promised(self) -> float:
        return self.caught_promised / max(1, self.promised)

    @property
    def false_positives(self) -> float:
        return sum(self.flagged.values()) / max(1, sum(self.lookalikes.values()))


def count_promised(score: Score, row: dict[str, Any], caught: bool) -> None:
    """Count ``row`` among the shapes the README promises, unless it says otherwise."""
    if row.get("promised", True):
        score.promised += 1
        score.caught_promised += caught


def score_redactor(redactor: Redactor, secrets: list[dict[str, str]],
                   lookalikes: list[dict[str, str]]) -> Score:
    score = Score()
    for row in secrets:
        score.secrets[row["kind"]] += 1
        caught = row["secret"] not in redactor(row["text"])
        score.caught[row["kind"]] += caught
        count_promised(score, row, caught)
    for row in lookalikes:
        score.lookalikes[row["kind"]] += 1
        score.flagged[row["kind"]] += redactor(row["text"]) != row["text"]
    return score


def score_detect_secrets(ds: DetectSecrets, secrets: list[dict[str, str]],
                         lookalikes: list[dict[str, str]]) -> Score:
    score = Score()
    for row in secrets:
        score.secrets[row["kind"]] += 1
        hit = ds.flagged_lines(row["text"]) & secret_lines(row["text"], row["secret"])
        score.caught[row["kind"]] += bool(hit)
        count_promised(score, row, bool(hit))
    for row in lookalikes:
        score.lookalikes[row["kind"]] += 1
        score.flagged[row["kind"]] += bool(ds.flagged_lines(row["text"]))
    return score


# -- the realistic document ---------------------------------------------------------------

NON_ENGLISH = [
    "Bitte das Passwort im Portal zur\u00fccksetzen und den Dienst neu starten.",
    "\u041f\u0435\u0440\u0435\u0437\u0430\u043f\u0443\u0441\u0442\u0438\u0442\u0435 "
    "\u0441\u0435\u0440\u0432\u0435\u0440 \u043f\u043e\u0441\u043b\u0435 "
    "\u043e\u0431\u043d\u043e\u0432\u043b\u0435\u043d\u0438\u044f.",
    "\u91cd\u542f\u670d\u52a1\u4e4b\u524d\u8bf7\u5148\u5907\u4efd\u914d\u7f6e\u6587\u4ef6"
    "\u3002",
    "La contrase\u00f1a se cambia en el portal; no la compartas.",
    "Caf\u00e9 \u2014 r\u00e9sum\u00e9 na\u00efve \u00fcber \u2013 \u201cquoted\u201d.",
]


def _config(rng: random.Random) -> str:
    host = f"web{rng.randint(1, 99):02d}.example.net"
    return rng.choice([
        f"server {{\n    listen 443 ssl;\n    server_name {host};\n"
        f"    ssl_certificate /etc/ssl/{host}.crt;\n    location / {{ proxy_pass "
        f"http://127.0.0.1:{rng.randint(8000, 9000)}; }}\n}}",
        f"interface GigabitEthernet0/{rng.randint(0, 48)}\n description uplink to {host}\n"
        f" ip address 10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.1 255.255.255.0\n"
        " no shutdown\n!",
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api-{rng.randint(1, 9)}\n"
        f"spec:\n  replicas: {rng.randint(1, 5)}\n  template:\n    spec:\n      containers:\n"
        f"        - name: api\n          image: registry.example.net/api@sha256:"
        f"{rng.randbytes(32).hex()}\n          env:\n            - name: DB_PASSWORD\n"
        "              valueFrom: {secretKeyRef: {name: db-creds, key: password}}",
        f"DB_HOST={host}\nDB_PORT=5432\nDB_USER=app\nDB_PASSWORD=${{DB_PASSWORD}}\n"
        f"LOG_LEVEL=info\nRELEASE={rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
    ])


def _log(rng: random.Random) -> str:
    ts = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC) + datetime.timedelta(
        seconds=rng.randint(0, 86400 * 30))
    return (f"{ts:%Y-%m-%dT%H:%M:%S}Z {rng.choice(['INFO', 'WARN', 'ERROR'])} "
            f"req={uuid.UUID(int=rng.getrandbits(128))} ip=10.{rng.randint(0, 255)}."
            f"{rng.randint(0, 255)}.{rng.randint(1, 254)} path=/api/v1/items/{rng.randint(1, 9999)}"
            f" status={rng.choice([200, 201, 404, 500])} ms={rng.randint(1, 900)} "
            f"commit={rng.randbytes(20).hex()[:12]}")


def realistic_document(size: int, corpus: list[str]) -> str:
    rng = random.Random(18)
    prose = [p for path in sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])
             for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    code = [p for path in sorted(ROOT.glob("daemon/*.py"))
            for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    parts: list[str] = []
    total = 0
    while total < size:
        roll = rng.random()
        if roll < 0.45:
            part = rng.choice(prose)
        elif roll < 0.60:
            part = rng.choice(code)
        elif roll < 0.75:
            part = _config(rng)
        elif roll < 0.95:
            part = "\n".join(_log(rng) for _ in range(rng.randint(3, 12)))
        elif roll < 0.985:
            part = rng.choice(NON_ENGLISH)
        else:
            part = rng.choice(corpus)
        parts.append(part)
        total += len(part) + 2
    return "\n\n".join(parts)[:size]


def best_seconds(runs: dict[str, Callable[[], object]], rounds: int = 3) -> dict[str, float]:
    """Best CPU time of each run (``time.process_time``: other processes on this shared
    machine barely count), the runs interleaved round by round."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            started = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - started)
    return best


# -- baseline -------------------------------------------------------------------------------


def load_baseline(rev: str) -> tuple[ModuleType, str]:
    """The redactor of revision ``rev`` (``retrieval/_redact*.py``, as a package of their
    own), and the commit that last changed it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    names = [n for n in git("ls-tree", "--name-only", rev, "retrieval/").split()
             if Path(n).name.startswith("_redact") and n.endswith(".py")]
    short = git("log", "-1", "--format=%h", rev, "--", *names).strip()
    folder = Path(tempfile.mkdtemp(prefix="bench-redact-baseline-")) / "baseline_redaction"
    folder.mkdir()
    (folder / "__init__.py").write_text("", encoding="utf-8")
    for name in names:
        (folder / Path(name).name).write_text(git("show", f"{rev}:{name}"), encoding="utf-8")
    sys.path.insert(0, str(folder.parent))
    try:
        module = importlib.import_module("baseline_redaction._redact")
    except ImportError as exc:
        raise SystemExit(f"bench_redact: the redactor of {rev} does not import on its own "
                         f"({exc})") from None
    finally:
        sys.path.remove(str(folder.parent))
    return module, short


# -- report ---------------------------------------------------------------------------------


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def per_kind(scores: dict[str, Score]) -> list[str]:
    names = list(scores)
    first = scores[names[0]]
    lines = ["secrets, caught per kind (n): " + " / ".join(names)]
    for kind in sorted(first.secrets):
        counts = " / ".join(str(s.caught[kind]) for s in scores.values())
        lines.append(f"  {kind:24s} ({first.secrets[kind]:3d}): {counts}")
    lines.append("look-alikes, flagged per kind (n): " + " / ".join(names))
    for kind in sorted(first.lookalikes):
        counts = " / ".join(str(s.flagged[kind]) for s in scores.values())
        lines.append(f"  {kind:24s} ({first.lookalikes[kind]:3d}): {counts}")
    return lines


def section(scores: dict[str, Score], speeds: dict[str, float], doc: dict[str, Any], *,
            command: str, started: datetime.datetime, ds_version: str,
            ds_misses: list[str]) -> list[str]:
    n_secrets = sum(next(iter(scores.values())).secrets.values())
    n_look = sum(next(iter(scores.values())).lookalikes.values())
    n_kinds = len(next(iter(scores.values())).secrets)
    lines = [
        HEADING,
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; uncommitted working tree (on {git_head()})",
        f"- Machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, detect-secrets {ds_version}",
        f"- Command: `{command}`",
        f"- Corpus: tests/data/redaction, {n_secrets} secrets of {n_kinds} kinds "
        f"({next(iter(scores.values())).promised} of shapes the README promises, the rest "
        f"prose, another script, a split key, base64 of a config) and {n_look} "
        "look-alikes (fake values, real shapes). It was written with llamad's rules in mind, "
        "so llamad's recall on it is a regression check, not an unbiased estimate; "
        "detect-secrets' is what a well-kept generic scanner makes of the same shapes.",
        "- detect-secrets: all default plugins and filters, each text scanned as a file "
        "(`document.txt` and `document.yaml`); caught = a secret reported on the secret's "
        "line. Look-alike flagged = anything reported.",
        f"- Throughput: a {doc['mb']:.0f} MB mixed document (prose, code, configs, logs, "
        f"{doc['non_ascii']:.2%} non-ASCII characters, ~1% corpus lines): CPU time "
        "(`time.process_time`), llamad's best of 3 rounds on the whole document (before and "
        f"after interleaved), detect-secrets' `scan_file` on its first {doc['ds_mb']:g} MB "
        "(both as .txt and .yaml, as above).",
        "",
        "| detector | recall (secrets removed) | recall, shapes the README promises "
        "| false positives (look-alikes changed) | throughput MB/s |",
        "|---|---|---|---|---|",
    ]
    for name, score in scores.items():
        caught, flagged = sum(score.caught.values()), sum(score.flagged.values())
        lines.append(f"| {name} | **{pct(score.recall)}** ({caught}/{n_secrets}) | "
                     f"**{pct(score.recall_promised)}** ({score.caught_promised}/"
                     f"{score.promised}) | "
                     f"**{pct(score.false_positives)}** ({flagged}/{n_look}) | "
                     f"{speeds[name]:.2f} |")
    ours, theirs = scores["llamad"], scores["detect-secrets"]
    better = sorted(k for k in theirs.secrets if theirs.caught[k] > ours.caught[k])
    lines += ["", "Kinds where detect-secrets catches more than llamad: "
              + (", ".join(better) if better else "none") + "."]
    if ds_misses:
        lines += ["", "Kinds detect-secrets misses entirely: " + ", ".join(ds_misses) + "."]
    return lines


# -- main -----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser("bench.bench_redact", __doc__)
    p.add_argument("--baseline", metavar="REV",
                   help="also measure the redactor of this git revision")
    p.add_argument("--doc-mb", type=float, default=10.0,
                   help="size of the mixed document for throughput (default 10)")
    p.add_argument("--ds-mb", type=float, default=1.0,
                   help="MB of it scanned by detect-secrets (default 1)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md",
                   help=f"Markdown results file; its '{HEADING}' section is replaced")
    p.add_argument("--raw", type=Path, help="also write per-kind counts as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = datetime.datetime.now(datetime.UTC)
    command = "python -m bench.bench_redact " + " ".join(
        sys.argv[1:] if argv is None else argv)
    secrets, lookalikes = load("secrets.jsonl"), load("lookalikes.jsonl")
    ds_version = metadata.version("detect-secrets")

    redactors: dict[str, Redactor] = {"llamad": lambda t: redact(t).text}
    if args.baseline:
        module, short = load_baseline(args.baseline)
        redactors[f"llamad before ({short})"] = lambda t: module.redact(t).text
    scores = {name: score_redactor(f, secrets, lookalikes) for name, f in redactors.items()}
    ds = DetectSecrets()
    scores["detect-secrets"] = score_detect_secrets(ds, secrets, lookalikes)

    corpus_lines = [row["text"] for row in secrets + lookalikes]
    document = realistic_document(int(args.doc_mb * MB), corpus_lines)
    seconds = best_seconds({name: partial(f, document) for name, f in redactors.items()})
    speeds = {name: len(document) / MB / s for name, s in seconds.items()}
    part = document[: int(args.ds_mb * MB)]
    ds_seconds = best_seconds({"ds": partial(ds.flagged_lines, part)}, 1)["ds"]
    speeds["detect-secrets"] = len(part) / MB / ds_seconds
    doc = {"mb": len(document) / MB, "ds_mb": args.ds_mb,
           "non_ascii": sum(not c.isascii() for c in document) / len(document)}

    first = scores["detect-secrets"]
    ds_misses = sorted(k for k in first.secrets if first.caught[k] == 0)
    for line in per_kind(scores):
        print(line)
    lines = section(scores, speeds, doc, command=command.strip(), started=started,
                    ds_version=ds_version, ds_misses=ds_misses)
    print("\n".join(lines))
    write_sections(args.out, [lines])
    if args.raw is not None:
        args.raw.write_text(json.dumps({
            name: {"caught": dict(s.caught), "secrets": dict(s.secrets),
                   "caught_promised": s.caught_promised, "promised": s.promised,
                   "flagged": dict(s.flagged), "lookalikes": dict(s.lookalikes),
                   "mb_per_s": speeds[name]} for name, s in scores.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
