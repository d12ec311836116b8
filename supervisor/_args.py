"""Which runtime arguments and child environment variables may reach a child, and from whom.

llamad starts its children itself: it owns their address, port, API key, model, alias,
threads, context and slots, and nothing it starts may reach the host around it
(ARCHITECTURE invariant 9). Extra arguments come from two kinds of source, checked with
two rules:

* **The API** (Swap's ``extra_args``): an *allow-list* (:func:`check_api_args`). Only
  performance and model-behaviour knobs pass: GPU offload and split, flash attention, the
  KV cache's types and offload, RoPE/YaRN scaling, NUMA, load mode, continuous batching,
  sampling defaults, reasoning and template kwargs. No option that takes a path, a host,
  a URL or a port, and none llamad sets itself. An admin token is an API role, not a shell.
* **Operator files** (``[generation]``/``[embedding]`` ``extra_args``, ``[models.NAME]``
  tables and their ``env``, the imported preset): a *deny-list*
  (:func:`check_operator_args`, :func:`check_child_env`). Refused: what llamad owns,
  what reaches the host (listening, TLS, logs and prompt dumps written to a path, slot
  save paths, static files and the web UI, built-in tools and MCP, RPC back ends, media
  paths, ffmpeg), what downloads, what prints and exits; an option that reads a file
  takes only an absolute path inside the models directory. An option this table does not
  know is refused too: llama-server and llama_cpp.server reject it anyway, and
  llama_cpp.server's argparse would take an abbreviation (``--hos``) for the option it
  begins.

The tables of options are :mod:`supervisor._options`. ``--opt=value`` is read as ``--opt value``
(argparse's form). A value that looks like an option (``-x``, but a negative number) is
refused: llama.cpp would take it as the value and argparse as an option, so it is never
left unchecked.

This module never imports gRPC; the daemon maps :class:`ArgumentRefused` to
INVALID_ARGUMENT (the API) or a configuration error (files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from ._options import (
    API,
    BUNDLED_LITERAL,
    BY_NAME,
    DOWNLOAD,
    EXITS,
    FILE,
    HOST,
    LLAMA_SERVER_OPTIONS,
    MANY,
    OWNED,
    STRICTNESS,
    ChildOption,
    normalise,
)

_WHY = {
    OWNED: "llamad sets it itself",
    HOST: "it reaches the host beyond the child (a listening address, a file written or "
          "served, tools, a remote back end)",
    DOWNLOAD: "it downloads from the network; llamad serves local files",
    EXITS: "it makes the child print and exit instead of serving",
}

# Why, in a few words, for the options a tester reaches for first (the rest: their kind's).
_REASONS = {
    "--host": "the child listens only where llamad puts it (its private socket or loopback)",
    "--port": "the child listens only where llamad puts it",
    "--api-key": "llamad gives each child its own key",
    "--api-key-file": "llamad gives each child its own key",
    "--log-file": "it writes a file on the host as the daemon's user",
    "--log-prompts-dir": "it writes every prompt to files on the host",
    "--slot-save-path": "it writes slot files on the host",
    "--path": "it serves a directory of the host over HTTP",
    "--media-path": "it lets requests read files of the host",
    "--ssl-key-file": "the child is private to llamad; TLS is llamad's",
    "--ssl-cert-file": "the child is private to llamad; TLS is llamad's",
    "--rpc": "it sends the model's work to other hosts",
    "--tools": "built-in tools read and write files and run commands on the host",
    "--tools-runtime": "built-in tools run commands on the host or elsewhere",
    "--webui": "the child serves no web UI",
    "--video-ffmpeg-dir": "it runs programs from a directory of the host",
}

class ArgumentRefused(ValueError):
    """A runtime argument or child variable that may not be passed (the message says which
    and why).

    Attributes:
        argument: the argument (or variable) as given.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


_NUMBER = re.compile(r"-[0-9.]")


def _looks_like_option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NUMBER.match(word)


def _option(word: str) -> tuple[ChildOption, str, str | None]:
    """The option ``word`` spells (``--opt=value`` too), its spelling, its inline value.

    Raises:
        ArgumentRefused: no runtime has such an option, or it abbreviates one of
            llama_cpp.server's (argparse would take ``--hos`` for ``--host``).
    """
    name, eq, inline = word.partition("=")
    spelled = normalise(name)
    opt = BY_NAME.get(spelled)
    if opt is None:
        raise ArgumentRefused(word, f"{name!r} is not an option of llama-server or "
                                    "llama_cpp.server that llamad knows")
    if name.startswith("--") and name not in BUNDLED_LITERAL:
        # argparse takes an unambiguous prefix for the option it begins: judge it as both.
        begun = [b for b in BUNDLED_LITERAL if b.startswith(name)]
        if len(begun) == 1:
            other = BY_NAME[normalise(begun[0])]
            if STRICTNESS.index(other.kind) > STRICTNESS.index(opt.kind):
                opt = ChildOption(opt.names, other.kind, max(opt.arity, other.arity), opt.env)
    return opt, name, inline if eq else None


def _walk(args: Sequence[str], judge: Callable[[ChildOption, str], None]
          ) -> Iterable[tuple[ChildOption, str, list[str]]]:
    """Each option of ``args`` with its spelling and its values, once ``judge`` (called
    before its values are read) let it pass.

    Raises:
        ArgumentRefused: a word that is neither an option nor one's value, an unknown
            option, one ``judge`` refuses, a missing value, or a value that looks like an
            option.
    """
    i = 0
    while i < len(args):
        word = args[i]
        if not _looks_like_option(word):
            raise ArgumentRefused(word, f"{word!r} is not an option (a value follows the "
                                        "option it belongs to)")
        opt, name, inline = _option(word)
        judge(opt, name)
        i += 1
        values: list[str] = []
        if inline is not None:
            if opt.arity == 0:
                raise ArgumentRefused(word, f"{name} takes no value")
            values.append(inline)
        wanted = opt.arity - len(values) if opt.arity != MANY else 0
        for _ in range(max(0, wanted)):
            if i >= len(args):
                raise ArgumentRefused(word, f"{name} needs a value")
            if _looks_like_option(args[i]):
                raise ArgumentRefused(args[i], f"the value of {name}, {args[i]!r}, looks like "
                                               "an option")
            values.append(args[i])
            i += 1
        if opt.arity == MANY:
            while i < len(args) and not _looks_like_option(args[i]):
                values.append(args[i])
                i += 1
        yield opt, name, values


def check_api_args(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` if every option is on the API's allow-list (:data:`API_ALLOWED`).

    Raises:
        ArgumentRefused: the first argument that is not, naming it and why.
    """
    def judge(opt: ChildOption, name: str) -> None:
        if opt.kind == API:
            return
        why = _why(opt) if opt.kind in _WHY else (
            "the API passes performance and model-behaviour options only (this one is for "
            "the operator's configuration)")
        raise ArgumentRefused(name, f"{name} is not allowed from the API: {why}")

    for _ in _walk(args, judge):
        pass
    return tuple(args)


def check_operator_args(args: Sequence[str], models_dir: str | os.PathLike[str]
                        ) -> tuple[str, ...]:
    """``args`` if none is owned by llamad, reaches the host, downloads or exits, and every
    file named is an absolute path inside ``models_dir``.

    Raises:
        ArgumentRefused: the first argument that is refused, naming it and why.
    """
    for opt, name, values in _walk(args, _judge_operator):
        _check_operator(opt, name, values, models_dir)
    return tuple(args)


def _judge_operator(opt: ChildOption, name: str) -> None:
    if opt.kind in _WHY:
        raise ArgumentRefused(name, f"{name} is refused: {_why(opt)}")


def _check_operator(opt: ChildOption, name: str, values: Sequence[str],
                    models_dir: str | os.PathLike[str]) -> None:
    _judge_operator(opt, name)
    if opt.kind == FILE:
        for value in values:
            for path in _paths(opt, value):
                _inside(name, path, models_dir)


def _why(opt: ChildOption) -> str:
    for name in opt.names:
        if name in _REASONS:
            return _REASONS[name]
    return _WHY[opt.kind]


def _paths(opt: ChildOption, value: str) -> list[str]:
    """The files an option's value names: ``--lora`` and ``--control-vector`` take a
    comma-separated list, their ``-scaled`` forms ``FILE:SCALE`` items."""
    if not {"--lora", "--lora-scaled", "--control-vector",
            "--control-vector-scaled"} & set(opt.names):
        return [value]
    items = value.split(",")
    if "--lora-scaled" in opt.names or "--control-vector-scaled" in opt.names:
        return [item.split(":")[0] for item in items]
    return items


def _inside(name: str, path: str, models_dir: str | os.PathLike[str]) -> None:
    root = os.path.realpath(models_dir)
    if not os.path.isabs(path) or '"' in path:
        raise ArgumentRefused(name, f"{name} {path!r}: give an absolute path inside the "
                                    f"models directory {root}")
    real = os.path.realpath(path)
    if os.path.commonpath([real, root]) != root:
        raise ArgumentRefused(name, f"{name} {path!r} is outside the models directory "
                                    f"{root}: a file option reads only files there")


# Variables a child reads that act as options or reach the host: llama.cpp's LLAMA_*
# (LLAMA_ARG_* are options, checked as such; the rest debug dumps and caches),
# llama-server's Vertex AI mode (AIP_*: its own port), Hugging Face downloads (HF_*),
# the loader and Python (LD_*, PYTHON*), llama_cpp.server's HOST, PORT, CONFIG_FILE and
# settings (pydantic reads each field from the environment, any case), and where
# llama.cpp looks for its user config.ini (HOME, XDG_CONFIG_HOME).
_ENV_PREFIXES = ("LLAMA_", "AIP_", "HF_", "LD_", "PYTHON")
_ENV_NAMES = frozenset({"HOST", "PORT", "CONFIG_FILE", "HOME", "XDG_CONFIG_HOME"}
                       | {w.lstrip("-").upper() for w in BUNDLED_LITERAL})
_ENV_OPTIONS: dict[str, ChildOption] = {}
for _opt in LLAMA_SERVER_OPTIONS:
    if _opt.env:
        _ENV_OPTIONS[_opt.env] = _opt
        if _opt.env.startswith("LLAMA_ARG_") and any(n.startswith("--no-") for n in _opt.names):
            _ENV_OPTIONS[_opt.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)] = _opt


def check_child_env(env: Iterable[tuple[str, str]] | Mapping[str, str],
                    models_dir: str | os.PathLike[str]) -> None:
    """Refuse a child variable (a catalog model's ``env``) that sets a refused option
    (``LLAMA_ARG_HOST``, ``LLAMA_API_KEY``: llama-server reads every option from its
    variable) or otherwise reaches what the child listens on or the host.

    Raises:
        ArgumentRefused: the first such variable, naming it and why.
    """
    pairs = env.items() if isinstance(env, Mapping) else env
    for name, value in pairs:
        opt = _ENV_OPTIONS.get(name)
        if opt is not None:
            try:
                _check_operator(opt, opt.name, [value], models_dir)
            except ArgumentRefused as exc:
                raise ArgumentRefused(name, f"{name} sets {opt.name}: {exc}") from None
            continue
        if name.startswith(_ENV_PREFIXES) or name.upper() in _ENV_NAMES:
            raise ArgumentRefused(name, f"{name} is refused: the child reads it as a setting "
                                        "llamad owns or one that reaches the host (set "
                                        "runtime options in extra_args)")
