"""``llamad models ps|load|unload``: the daemon's model catalog, beside ``llamad models
prepare|list|verify`` (``python -m models``: the default model files on this machine),
as ``ollama ps`` is beside ``ollama list``.

    llamad models ps                  every model of the daemon's catalog: state, role,
                                      memory estimate, last use, calls, pin, ttl, error
    llamad models load NAME           make it resident; returns once it serves (admin)
    llamad models unload NAME         take it out of residency; its calls finish (admin)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._client import Client
from .._models import ModelInfo
from . import _format as fmt
from ._progress import Elapsed

VERBS = ("ps", "load", "unload")

HELP = """\
usage: llamad models COMMAND ...

The daemon's models (these ask a running daemon; connection options as every verb's):
  ps        every model of the daemon's catalog: state, role, memory, last use, calls
  load      make a model resident; returns once it serves (admin)
  unload    take a model out of residency; its running calls finish first (admin)

The default model files on this machine (python -m models, run in this process):
  prepare   fetch, assemble, convert and verify the models
  list      show the catalog and what is prepared
  verify    rehash every prepared file against the manifest

`llamad models COMMAND --help` shows a command's options. The names `ps` lists are what
--model (generate, chat, embed, ask) and model= (the Python clients) take.
"""


def parser(parents: Sequence[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The parser of ``llamad models ps|load|unload`` (with the connection options)."""
    p = argparse.ArgumentParser(prog="llamad models", description="The daemon's models.")
    sub = p.add_subparsers(dest="verb", required=True)
    ps = sub.add_parser("ps", parents=list(parents), help="every model of the daemon")
    ps.add_argument("--json", action="store_true", help="one JSON document")
    for verb, what in (("load", "make a model resident (admin)"),
                       ("unload", "take a model out of residency (admin)")):
        v = sub.add_parser(verb, parents=list(parents), help=what)
        v.add_argument("name", metavar="NAME", help="its catalog name or an alias")
        v.add_argument("--json", action="store_true", help="one JSON document")
        if verb == "unload":
            v.add_argument("--reason", default="", help="why, in words (logged)")
    return p


def run(client: Client, args: argparse.Namespace) -> int:
    """Run ``args.verb``; print the result."""
    if args.verb == "ps":
        models = client.list_models()
        if args.json:
            print(fmt.to_json({"models": models}, indent=2))
            return 0
        print(models_table(models))
        return 0
    if args.verb == "load":
        with Elapsed(sys.stderr, f"loading {args.name}",
                     shown=sys.stderr.isatty() and not args.json):
            model = client.load_model(args.name, timeout=None)
    else:
        model = client.unload_model(args.name, reason=args.reason, timeout=None)
    if args.json:
        print(fmt.to_json(model, indent=2))
    else:
        print(f"{model.name}: {model.state}")
    return 0


def models_table(models: Sequence[ModelInfo]) -> str:
    """The models as ``llamad models ps`` and ``llamad status`` show them."""
    header = ("NAME", "ROLE", "STATE", "MEMORY", "LAST USED", "CALLS", "PIN", "TTL",
              "ALIASES", "LAST ERROR")
    return fmt.table([_row(m) for m in models], header)


def _row(m: ModelInfo) -> list[str]:
    name = m.name + (" *" if m.is_default else "")
    return [name, m.role, m.state + (" (breaker open)" if m.breaker == "open" else ""),
            fmt.size(m.memory_estimate_bytes) if m.memory_estimate_bytes else "-",
            fmt.when(m.last_used) if m.last_used else "-", str(m.in_flight),
            "yes" if m.pinned else "", f"{m.ttl_seconds:g}s" if m.ttl_seconds else "",
            ",".join(m.aliases), fmt.clip(m.last_error, 60)]
