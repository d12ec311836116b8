"""llama-server's router preset INI (``--models-preset``), read into catalog tables.

The format, as llama.cpp's ``common/preset.cpp`` reads it: ``;`` or ``#`` start a
comment (a whole line, or the rest of one); ``[NAME]`` starts a model's section and
``[*]`` the section of settings every model shares (a model's own win); ``key = value``
sets a llama-server argument by its long name, its short name or its environment
variable, without leading dashes (``ctx-size``, ``c``, ``LLAMA_ARG_CTX_SIZE``);
``version`` is reserved; ``load-on-startup`` and ``stop-timeout`` are preset-only. A
section naming a model llama-server already knows (here: a GGUF of ``models_dir``,
by its file stem) needs no ``model``: it sets that model's settings.

Each section becomes the same table a ``[models.NAME]`` of the TOML file is
(:mod:`daemon.config._catalog_load` validates both the same way): the arguments llamad has a
setting for map to it (model, ctx_size, threads, parallel, batch, cache_ram, aliases, the role of
``embedding``, preload); the arguments the daemon owns (host, port, API key) are left out
as llama-server's router leaves them out; every other argument is passed to the child as
it is written (``n-gpu-layers = 99`` -> ``--n-gpu-layers 99``; ``jinja = true`` ->
``--jinja``, ``false`` -> ``--no-jinja``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ._options import ConfigError
from .role import Role

_HEADER = re.compile(r"\[\s*([^\]]+?)\s*\]")
_KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)")

# Argument (any of its spellings) -> the catalog table's key.
_MAPPED: dict[str, str] = {}
for _key, _names in {
    "model": ("model", "m", "LLAMA_ARG_MODEL"),
    "ctx_size": ("ctx-size", "c", "LLAMA_ARG_CTX_SIZE"),
    "threads": ("threads", "t", "LLAMA_ARG_THREADS"),
    "parallel": ("parallel", "np", "LLAMA_ARG_N_PARALLEL"),
    "batch": ("batch-size", "b", "LLAMA_ARG_BATCH"),
    "cache_ram": ("cache-ram", "cram", "LLAMA_ARG_CACHE_RAM"),
    "aliases": ("alias", "a", "LLAMA_ARG_ALIAS"),
    "embedding": ("embedding", "embeddings", "LLAMA_ARG_EMBEDDINGS"),
    "preload": ("load-on-startup",),
}.items():
    for _name in _names:
        _MAPPED[_name] = _key

# Owned by the daemon (as by llama-server's router): left out.
_DROPPED = frozenset({"host", "port", "api-key", "api-key-file", "LLAMA_ARG_HOST",
                      "LLAMA_ARG_PORT", "LLAMA_API_KEY", "stop-timeout",
                      "dedup-cache-models", "version"})
# Downloads: llamad serves files it has; refused with the way out.
_DOWNLOADS = frozenset({"hf", "hf-repo", "hfr", "hf-file", "hff", "hf-token", "hft",
                        "model-url", "mu", "docker-repo", "dr", "LLAMA_ARG_HF_REPO",
                        "LLAMA_ARG_HF_FILE", "LLAMA_ARG_MODEL_URL"})
# Short spellings of common llama-server arguments: passed with one dash.
_SHORT = frozenset({"ngl", "fa", "ub", "ctk", "ctv", "sm", "mg", "ts", "dev", "ot",
                    "cb", "tb", "kvu", "np", "n", "s", "e", "j", "v", "C", "Cb", "md",
                    "ncmoe", "cmoe", "mmp", "nkvo", "dt", "ps", "lv", "rea", "ctxcp"})
_TRUE = ("true", "on", "yes", "1", "enabled")


def read_preset(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Read a preset file into catalog tables.

    Returns:
        (sections with a ``model`` path, by name; sections without one, by name: the
        settings of a model found elsewhere).

    Raises:
        ConfigError: the file cannot be read, a line is not INI, a key is outside a
            section, or a section downloads its model.
    """
    where = f"models_preset {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    sections: dict[str, dict[str, str]] = {}
    shared: dict[str, str] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        if not line:
            continue
        at = f"{where}, line {number}"
        if header := _HEADER.fullmatch(line):
            name = header.group(1)
            if name in sections:
                raise ConfigError(f"{at}: section [{name}] appears twice")
            current = shared if name == "*" else sections.setdefault(name, {})
            continue
        pair = _KEY_VALUE.fullmatch(line)
        if pair is None:
            raise ConfigError(f"{at}: expected [section] or key = value, got {line!r}")
        key, value = pair.group(1), pair.group(2).strip()
        if current is None:
            if key == "version":
                continue
            raise ConfigError(f"{at}: {key!r} is outside a section (put it under [*] to "
                              "apply it to every model)")
        current[key] = value
    with_model: dict[str, dict[str, Any]] = {}
    without: dict[str, dict[str, Any]] = {}
    for name, settings in sections.items():
        table = _table({**shared, **settings}, f"{where}, [{name}]")
        (with_model if "model" in table else without)[name] = table
    return with_model, without


def _strip_comment(line: str) -> str:
    """The line without its comment (from the first ``;`` or ``#``) and outer blanks."""
    cut = min((i for i in (line.find(";"), line.find("#")) if i >= 0), default=len(line))
    return line[:cut].strip()


def _table(settings: dict[str, str], where: str) -> dict[str, Any]:
    """One section's arguments as a catalog table."""
    table: dict[str, Any] = {}
    extra: list[str] = []
    for key, value in settings.items():
        if key in _DOWNLOADS:
            raise ConfigError(f"{where}: {key!r} downloads a model; llamad serves local "
                              "files: set model = PATH")
        if key in _DROPPED:
            continue
        mapped = _MAPPED.get(key)
        if mapped == "aliases":
            table["aliases"] = [a.strip() for a in value.split(",") if a.strip()]
        elif mapped == "embedding":
            if value.lower() in _TRUE:
                table["role"] = Role.EMBEDDING
        elif mapped == "preload":
            table["preload"] = value.lower() in _TRUE
        elif mapped is not None:
            table[mapped] = value
        else:
            extra.extend(_argument(key, value))
    if extra:
        table["extra_args"] = " ".join(extra)
    return table


def _argument(key: str, value: str) -> list[str]:
    """A llama-server argument not mapped to a setting, as command-line words."""
    if key.startswith("LLAMA_ARG_"):
        key = key.removeprefix("LLAMA_ARG_").lower().replace("_", "-")
    flag = ("-" if key in _SHORT else "--") + key
    if value.lower() in ("true", "false") and not value.isdigit():
        if value.lower() == "true":
            return [flag]
        return [f"--no-{key}"] if not key.startswith("no-") else [f"--{key[3:]}"]
    if any(c.isspace() for c in value):
        raise ConfigError(f"models_preset: {key} = {value!r}: a value with spaces cannot be "
                          "passed to the child as one argument")
    return [flag, value]
