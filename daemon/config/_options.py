"""The option registry's machinery: what an option is (:class:`Option`), how a section
dataclass declares its options on its fields (:func:`setting`), how the
options are read off those fields (:func:`options_of`), and how a raw value becomes typed.

An option is one field of a frozen section dataclass, declared once: its type is the
field's annotation, its default the field's default, and its help, bounds, choices and
reload kind the field's metadata. Its key is the path of the field from the root
(``generation.model``); its flag, environment variable and TOML key follow from the key.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class ConfigError(Exception):
    """A configuration value is missing or invalid."""


Reload = Literal["apply", "new_child", "restart"]
"""What a reload (SIGHUP) does with a changed option: ``apply`` it to the running daemon,
bring its child to it through a swap or a mode switch (``new_child``), or report that it
needs a ``restart`` and keep the running value (see :mod:`daemon.ops.reload`)."""


@dataclass(frozen=True)
class Option:
    """One setting. ``key`` is ``section.name`` or ``name`` (top level)."""

    key: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    reload: Reload = "restart"
    """What a reload does with a change; an option nobody taught reload to apply needs a
    restart, and the reload says so."""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace(".", "-").replace("_", "-")

    @property
    def env(self) -> str:
        return "LLAMAD_" + self.key.replace(".", "_").upper()

    @property
    def dest(self) -> str:
        return self.key.replace(".", "__")


INSTALLED_MODELS_DIR = "/var/lib/llamad/models"
"""Where the installation (docs/install.md) prepares the models (the unit's StateDirectory)."""


@dataclass(frozen=True)
class _Meta:
    help: str
    choices: tuple[str, ...]
    minimum: float | None
    reload: Reload | None


_OPTION = "llamad.option"

PER_SECTION: Any = dataclasses.MISSING
"""The default of an option that each use of its section gives (the section's field's
``default_factory``, e.g. a :func:`functools.partial` of the section)."""


def setting(default: Any, help: str, *, choices: tuple[str, ...] = (),
            minimum: float | None = None, reload: Reload | None = None) -> Any:
    """A section field that is an option: its ``default`` (or :data:`PER_SECTION`), its
    ``--help`` text (``{section}`` stands for the section's name), its ``choices``, its
    ``minimum``, and what a ``reload`` does with a change (default: the section's
    ``RELOAD``, else "restart"). A field whose value is a dataclass is a section.

    The sections declare an option facts first and its help last, by keyword: on one line
    where it fits, else with the help as a triple-quoted paragraph on the lines below (its
    white space is folded to single spaces here, as ``--help`` reflows it anyway)."""
    return dataclasses.field(default=default, metadata={
        _OPTION: _Meta(" ".join(help.split()), choices, minimum, reload)})


_KINDS: dict[object, type] = {str: str, int: int, float: float, bool: bool,
                              tuple[str, ...]: list}
"""An option's kind by its field's type (a list option is a tuple of strings)."""


def options_of(root: DataclassInstance, prefix: str = "") -> Iterator[Option]:
    """The options declared on the fields of ``root`` and of its sections, in field order,
    with ``root``'s values as their defaults (so a section's default instance gives its
    options' defaults). A field typed with a :class:`enum.StrEnum` is a string option
    whose choices are the enum's values (its section turns the string into the member).

    Raises:
        TypeError: a field that is neither an option nor a section, or of a type no
            option has.
    """
    cls = type(root)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(root):
        value, hint = getattr(root, f.name), hints[f.name]
        meta = f.metadata.get(_OPTION)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from options_of(value, f"{prefix}{f.name}.")
        elif isinstance(meta, _Meta) and (hint in _KINDS or _is_enum(hint)):
            reload: Reload = (meta.reload if meta.reload is not None
                              else getattr(cls, "RELOAD", "restart"))
            kind, choices = _KINDS.get(hint, str), meta.choices
            if _is_enum(hint):
                choices, value = choices or tuple(m.value for m in hint), value.value
            yield Option(f"{prefix}{f.name}", kind, value,
                         meta.help.replace("{section}", prefix.removesuffix(".")),
                         choices, meta.minimum, reload)
        else:
            raise TypeError(f"{cls.__name__}.{f.name} is neither an option nor a section")


def _is_enum(hint: object) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.StrEnum)


_D = TypeVar("_D", bound="DataclassInstance")


def value_of(root: DataclassInstance, key: str) -> Any:
    """The value of option ``key`` in the tree of sections ``root``."""
    value: Any = root
    for name in key.split("."):
        value = getattr(value, name)
    return value


def with_values(root: _D, values: Mapping[str, Any]) -> _D:
    """``root`` with the options of ``values`` (by key) set, each in its section."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    for head, inner in nested.items():
        top[head] = with_values(getattr(root, head), inner)
    return dataclasses.replace(root, **top)


def _coerce(opt: Option, raw: Any, source: str) -> Any:
    where = f"{opt.key} (from {source})"
    try:
        if opt.kind is bool:
            if isinstance(raw, bool):
                value: Any = raw
            elif str(raw).strip().lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).strip().lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(f"not a boolean: {raw!r}")
        elif opt.kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(f"not an integer: {raw!r}")
            value = int(raw)
        elif opt.kind is list:
            # TOML: an array of strings; flag and env: separated by ':' (like PATH).
            if isinstance(raw, str):
                items = raw.split(os.pathsep)
            elif isinstance(raw, list) and all(isinstance(i, str) for i in raw):
                items = raw
            else:
                raise ValueError(f"not a list of strings: {raw!r}")
            value = tuple(i.strip() for i in items if i.strip())
        elif opt.kind is float:
            if isinstance(raw, bool):
                raise ValueError(f"not a number: {raw!r}")
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(f"not a finite number: {raw!r}")
        else:
            if not isinstance(raw, str):
                raise ValueError(f"not a string: {raw!r}")
            value = raw
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if opt.choices and value not in opt.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(opt.choices)}")
    if opt.minimum is not None and value < opt.minimum:
        raise ConfigError(f"{where}: {value} is below the minimum {opt.minimum:g}")
    return value

