"""Building the model catalog (:class:`~daemon.config._catalog.Catalog`) at configuration load.

Where models come from, in order (an earlier source wins a name):

1. ``[models.NAME]`` tables of the TOML file: ``model`` (the GGUF path), ``role``
   (``generation`` or ``embedding``; default: what the file's metadata says), ``aliases``,
   ``pin``, ``ttl`` (idle seconds before unload, 0 never), ``preload``, and the launch
   settings of a role section (``runtime``, ``ctx_size``, ``threads``, ``parallel``,
   ``queue_ahead``, ``batch``, ``cache_ram``, ``spin_count``, ``extra_args``,
   ``chat_template``, ``background_instance``), which default to the values of the
   model's role section;
2. the sections of ``models_preset``, llama-server's router preset INI
   (:mod:`daemon.config._catalog_preset`);
3. ``[generation]`` and ``[embedding]``: each role's default model, the one a request
   naming no model gets, named after its file stem (or after the role, when that name is
   taken) with the role's name as an alias; ``[generation] model`` may also name a catalog
   model, which then is the default and runs with its own settings;
4. every GGUF file directly in ``models_dir`` not declared above, named after its stem,
   its role from its metadata (a file that is no valid GGUF, or a reranker, is passed
   over and listed in :attr:`Catalog.skipped`); a preset section without ``model`` that
   names one sets its settings.

Names and aliases share one namespace: a name declared twice is a configuration error,
as is an unknown key, a missing or non-GGUF ``model``, or an unknown role.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from supervisor import InvalidModelError, read_gguf_info

from ._catalog import RESERVED_ROLES, Catalog, CatalogEntry, role_of
from ._catalog_preset import read_preset
from ._checks import check_child
from ._options import ConfigError, _coerce
from ._resolved import ChildConfig
from ._sections import _BY_KEY, RoleSettings, Settings
from .inference_mode import InferenceMode
from .role import Role, background_instance_wanted

_ROLES = ", ".join(Role)

_OWN_KEYS = ("model", "role", "aliases", "pin", "ttl", "preload", "env", "device")
_CHILD_KEYS = ("runtime", "ctx_size", "threads", "parallel", "queue_ahead", "batch",
               "cache_ram", "spin_count", "extra_args", "chat_template",
               "background_instance")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}")
_MAGIC = b"GGUF"


def device_budgets(text: str) -> dict[str, int]:
    """``[models] device_budgets_mb`` (``NAME=MiB,...``) as device -> bytes.

    Raises:
        ValueError: not such pairs (the message says what is wrong).
    """
    budgets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, mib = part.partition("=")
        name = name.strip()
        if not sep or not name or not mib.strip().isdigit() or int(mib) <= 0:
            raise ValueError(f"{part!r} is not NAME=MiB (a positive whole number of MiB)")
        if name in budgets:
            raise ValueError(f"device {name!r} is given twice")
        budgets[name] = int(mib) * 1024 * 1024
    return budgets


def catalog_tables(data: MutableMapping[str, Any], where: str) -> dict[str, Mapping[str, Any]]:
    """Take the ``[models.NAME]`` tables out of a parsed TOML file (what is left under
    ``models`` are ordinary options).

    Raises:
        ConfigError: ``models`` is not a table.
    """
    models = data.get("models")
    if models is None:
        return {}
    if not isinstance(models, Mapping):
        raise ConfigError(f"{where}: 'models' must be a table ([models.NAME] per model)")
    tables = {k: v for k, v in models.items() if isinstance(v, Mapping)}
    rest = {k: v for k, v in models.items() if not isinstance(v, Mapping)}
    if rest:
        data["models"] = rest
    else:
        del data["models"]
    return tables


_DEVICE = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")


def build_catalog(settings: Settings, children: MutableMapping[Role, ChildConfig],
                  tables: Mapping[str, Mapping[str, Any]], models_dir: Path,
                  where: str = "config", *, share_cores: bool = False,
                  share_embedding_cores: bool = False) -> Catalog:
    """The catalog of ``tables`` (the TOML file's), ``settings.models_preset``, the
    roles' ``children`` and ``models_dir``; a role whose model names a catalog model gets
    that model's settings in ``children``. With ``share_cores`` (``generation.threads``
    left at its default), the generation models whose table sets no ``threads`` divide
    the cores among those that stay resident together (:func:`_share_cores`); with
    ``share_embedding_cores`` (``embedding.threads`` left at its default), an embedding
    model with a background instance gets half of them (:func:`_halve_for_instance`).

    Raises:
        ConfigError: see the module docstring.
    """
    try:
        device_budgets(settings.models.device_budgets_mb)
    except ValueError as exc:
        raise ConfigError(f"models.device_budgets_mb: {exc}") from None
    entries: dict[str, CatalogEntry] = {}
    taken: dict[str, str] = {}  # name or alias -> the entry's name

    def add(entry: CatalogEntry) -> None:
        if entry.name in entry.aliases:
            raise ConfigError(f"{entry.origin}: the name {entry.name!r} is already used by "
                              "its own name")
        for name in (entry.name, *entry.aliases):
            if name in taken:
                raise ConfigError(f"{entry.origin}: the name {name!r} is already used by "
                                  f"{entries[taken[name]].origin}")
        entries[entry.name] = entry
        for name in (entry.name, *entry.aliases):
            taken[name] = entry.name

    for name, table in tables.items():
        add(_entry(name, table, settings, f"models.{name}", f"{where}, [models.{name}]"))
    overrides: dict[str, dict[str, Any]] = {}
    given = {name for name, table in tables.items() if "threads" in table}
    if settings.models_preset:
        preset = Path(settings.models_preset).expanduser()
        with_model, overrides = read_preset(preset)
        for name, table in with_model.items():
            add(_entry(name, table, settings, f"models_preset [{name}]",
                       f"models_preset {preset}, [{name}]"))
        given |= {name for name, table in (*with_model.items(), *overrides.items())
                  if "threads" in table}
    defaults: dict[str, str] = {}
    for role in Role:
        default = _role_default(role, children[role], entries, taken)
        if default is None:
            continue
        if default.name in entries:  # a catalog model named by the role section
            children[role] = default.child
        else:
            add(default)
        defaults[role] = default.name
        entries[default.name] = _pin_default(role, entries[default.name],
                                             tables.get(default.name, {}))
    skipped = _scan(models_dir, settings, entries=entries, taken=taken,
                    overrides=overrides, add=add)
    for name in overrides:
        if name not in entries or entries[name].origin != "models_dir":
            raise ConfigError(f"models_preset [{name}]: no model of models_dir is called "
                              f"{name!r}; set model = PATH")
    for entry in entries.values():
        check_child(entry.origin, entry.child.extra_argv, entry.child.env, models_dir)
    if share_cores:
        _share_cores(entries, children, defaults, given, settings)
    if share_embedding_cores:
        _halve_for_instance(entries, children, defaults, given, settings)
    return Catalog(tuple(entries.values()), defaults, tuple(skipped))


def _share_cores(entries: MutableMapping[str, CatalogEntry],
                 children: MutableMapping[Role, ChildConfig], defaults: Mapping[str, str],
                 given: set[str], settings: Settings) -> None:
    """Give the generation models without a ``threads`` of their own the cores divided
    among the generation models that stay resident together: the pinned and preloaded
    ones, at most ``[models] max_resident``.

    llama.cpp's threads meet at a barrier after every operation, so two children on the
    same cores wait on each other's descheduled threads: measured on 2 cores, SmolLM2-135M
    and gemma-3-270m generating at once gave 61.8 tokens/s together with a thread each
    and 48.9 with two each (short OpenMP spins in both). One model alone is faster with
    every core (gemma: 37.6 against 26.8 tokens/s), so a model loaded on demand beside a
    single resident one keeps them all.
    """
    cores = settings.generation.threads  # the default: every core
    resident = sum(1 for e in entries.values()
                   if e.role is Role.GENERATION and (e.pin or e.preload))
    if settings.models.max_resident > 0:
        resident = min(resident, settings.models.max_resident)
    threads = max(1, cores // max(1, resident))
    if threads == cores:
        return
    for name, entry in entries.items():
        if entry.role is not Role.GENERATION or name in given:
            continue
        entries[name] = dataclasses.replace(
            entry, child=dataclasses.replace(entry.child, threads=threads))
        if defaults.get(Role.GENERATION) == name:
            children[Role.GENERATION] = entries[name].child


def _halve_for_instance(entries: MutableMapping[str, CatalogEntry],
                        children: MutableMapping[Role, ChildConfig],
                        defaults: Mapping[str, str], given: set[str],
                        settings: Settings) -> None:
    """Give each embedding model with a background instance (lanes on, its
    ``background_instance`` auto or true) and no ``threads`` of its own half the cores:
    its instance takes the other half ([limits] background_instance_threads).

    The interactive child and its instance run at once by design (a query's embedding
    beside an ingest's), and llama.cpp's threads meet at a barrier after every operation:
    a child whose team spans every core waits, each operation, on whichever thread the
    other child or a chat preempted. Measured on 2 cores with a 5,000-document ingest, 8
    batch Embed clients and a chat beside (bench/RESULTS.md, "Lanes"): Search's query
    embedding p95 31 ms with two threads against 17 idle, hybrid Search p95 3.3x idle;
    with one thread each, see the section.
    """
    if not settings.limits.lanes:
        return
    threads = max(1, settings.embedding.threads // 2)
    for name, entry in entries.items():
        if (entry.role is not Role.EMBEDDING or name in given
                or not background_instance_wanted(entry.child.background_instance,
                                                  entry.role)):
            continue
        entries[name] = dataclasses.replace(
            entry, child=dataclasses.replace(entry.child, threads=threads))
        if defaults.get(Role.EMBEDDING) == name:
            children[Role.EMBEDDING] = entries[name].child


def _entry(name: str, table: Mapping[str, Any], settings: Settings, origin: str,
           where: str) -> CatalogEntry:
    """One catalog model of its table, checked."""
    _check_name(name, where)
    for key in table:
        if key not in _OWN_KEYS and key not in _CHILD_KEYS:
            known = ", ".join((*_OWN_KEYS, *_CHILD_KEYS))
            raise ConfigError(f"{where}: unknown setting {key!r} (known: {known})")
    model = table.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{where}: model must be the path of a GGUF file")
    path = Path(model).expanduser().absolute()
    declared = table.get("role")
    if declared is None:
        read = role_of(_read(path, where))
        if read not in tuple(Role):
            raise ConfigError(f"{where}: {path} is a {read} model, which is not served yet")
        role = Role(read)
    elif declared in RESERVED_ROLES:
        raise ConfigError(f"{where}: role {declared!r} is not served yet (roles: {_ROLES})")
    elif declared not in tuple(Role):
        raise ConfigError(f"{where}: role {declared!r} is not one of {_ROLES}")
    else:
        role = Role(declared)
        _check_magic(path, where)
    aliases = table.get("aliases", [])
    if isinstance(aliases, str):
        aliases = [aliases]
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: aliases must be a list of names")
    for alias in aliases:
        _check_name(alias, f"{where}, alias")
    pin = _coerce(_named(_BOOL, f"models.{name}.pin"), table.get("pin", False), where)
    ttl = _coerce(_named(_TTL, f"models.{name}.ttl"), table.get("ttl", 0.0), where)
    preload = _coerce(_named(_BOOL, f"models.{name}.preload"), table.get("preload", False),
                      where)
    device = table.get("device", "")
    if not isinstance(device, str) or (device and not _DEVICE.fullmatch(device)):
        raise ConfigError(f"{where}: device must be a device name such as cuda0 (its budget "
                          "is in [models] device_budgets_mb)")
    section: RoleSettings = getattr(settings, role)
    overrides = {key: _coerce(_named(_BY_KEY[f"{role}.{key}"], f"models.{name}.{key}"),
                              table[key], where)
                 for key in _CHILD_KEYS if key in table}
    child = dataclasses.replace(
        child_config(dataclasses.replace(section, **overrides), role, str(path)),
        env=_env(table.get("env", {}), where))
    return CatalogEntry(name, role, child, tuple(dict.fromkeys(aliases)), pin, ttl,
                        preload, origin, device)


def _pin_default(role: Role, entry: CatalogEntry, table: Mapping[str, Any]) -> CatalogEntry:
    """A role's default model stays resident (pinned) unless its ``[models.NAME]`` table
    says ``pin = false``: then it loads on demand and is evicted like any other model.
    The embedding role's default stays pinned: the knowledge base embeds every ingest and
    every query with it."""
    if "pin" not in table:
        return dataclasses.replace(entry, pin=True)
    if not entry.pin and role is Role.EMBEDDING:
        raise ConfigError(f"{entry.origin}: pin = false on the embedding role's default "
                          "model: it stays resident (retrieval embeds every ingest and "
                          "query with it); name another embedding model as the role's "
                          "default to let this one be evicted")
    return entry


def child_config(section: RoleSettings, role: Role, model: str) -> ChildConfig:
    """The child settings of a catalog model: its role section's, embedded, running
    ``model``."""
    return ChildConfig.of(section, role, model=model, enabled=True,
                          mode=InferenceMode.EMBEDDED, endpoint_url="", endpoint_model="",
                          api_key_file="", api_key_env="")


def _role_default(role: Role, child: ChildConfig, entries: Mapping[str, CatalogEntry],
                  taken: Mapping[str, str]) -> CatalogEntry | None:
    """The role section's default model: a catalog model it names, or its own entry."""
    if child.mode is InferenceMode.DISABLED:
        return None
    if child.mode is InferenceMode.EMBEDDED and child.model in taken:
        named = entries[taken[child.model]]
        if named.role != role:
            raise ConfigError(f"{role}.model: {child.model!r} is a {named.role} model")
        return named
    stem = Path(child.model).stem if child.mode is InferenceMode.EMBEDDED else role
    name = stem if stem and stem not in taken else role
    if name in taken:
        raise ConfigError(f"{role}: the name {name!r} of its default model is already used "
                          f"by {entries[taken[name]].origin}")
    aliases = (role,) if role not in taken and name != role else ()
    return CatalogEntry(name, role, child, aliases, origin=role)


def _scan(models_dir: Path, settings: Settings, *, entries: Mapping[str, CatalogEntry],
          taken: Mapping[str, str], overrides: Mapping[str, Mapping[str, Any]],
          add: Callable[[CatalogEntry], None]) -> list[tuple[str, str]]:
    """Add every GGUF file directly in ``models_dir`` not declared yet; return the files
    passed over with why."""
    skipped: list[tuple[str, str]] = []
    try:
        files = sorted(p for p in models_dir.iterdir() if p.suffix == ".gguf")
    except OSError:
        return skipped  # no directory: nothing to scan
    known = {_real(e.path) for e in entries.values() if e.path}
    for path in files:
        if _real(str(path)) in known:
            continue
        name = path.stem
        if name in taken:
            skipped.append((str(path), f"the name {name!r} is taken by "
                                       f"{entries[taken[name]].origin}"))
            continue
        try:
            role = role_of(read_gguf_info(path))
        except (InvalidModelError, OSError) as exc:
            skipped.append((str(path), str(exc)))
            continue
        if role not in tuple(Role):
            skipped.append((str(path), f"a {role} model, which is not served yet"))
            continue
        table = {"model": str(path), "role": role, **overrides.get(name, {})}
        origin = "models_dir"
        add(dataclasses.replace(
            _entry(name, table, settings, origin, f"models_dir {path}"),
            origin=origin))
    return skipped


def _env(table: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A model's ``env`` table (``CUDA_VISIBLE_DEVICES = "1"``), checked."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: env must be a table of NAME = \"value\"")
    for name, value in table.items():
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{where}: env: {name!r} is not an environment variable name")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: env.{name} must be a string, not {value!r}")
    return tuple(sorted(table.items()))


def _read(path: Path, where: str) -> Any:
    try:
        return read_gguf_info(path)
    except InvalidModelError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: {path}: {exc.strerror or exc}") from None


def _check_magic(path: Path, where: str) -> None:
    """The file exists and starts as a GGUF does (the full check runs before launch)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ConfigError(f"{where}: {path}: {exc.strerror or exc}") from None
    if head != _MAGIC:
        raise ConfigError(f"{where}: {path} is not a GGUF file")


def _check_name(name: str, where: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r} is not a model name (letters, digits and "
                          "._:/+- , starting with a letter or digit, at most 128)")


def _real(path: str) -> str:
    return str(Path(path).resolve())


def _named(option: Any, key: str) -> Any:
    return dataclasses.replace(option, key=key)


_BOOL = dataclasses.replace(_BY_KEY["generation.enabled"], choices=(), minimum=None)
_TTL = dataclasses.replace(_BY_KEY["drain_grace"], minimum=0)
