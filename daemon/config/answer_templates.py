"""Ask's answer templates: the packaged set, and an operator's directory over it.

A template is a text file ``<name>.txt``: an optional header of ``# key: value`` lines
(``llamad-template: <name>`` and ``version: <n>``), then its body, a Python format string
whose slots (``{sources}``, ``{question}``, ``{attachment}``) assembly fills. The names:

* ``system``: the preamble (no slots);
* ``answer``, ``explain_output``, ``diagnose``, ``summarize``: one per task; each must have
  ``{sources}`` and ``{question}`` and may have ``{attachment}``;
* ``no_context``: what Ask answers when nothing relevant was retrieved (may have
  ``{question}``).

``answer.templates_dir`` names a directory whose templates replace the packaged ones of
the same name (any subset). It is read and checked when the configuration is loaded and
on every reload: a template missing a required slot, with an unknown slot or a stray
brace, an unknown file name, or over :data:`MAX_TEMPLATE_BYTES` is refused with the file
and the slot named, so a reload with a broken template changes nothing. The set's SHA-256
(over every template's name and text) versions the answers: it is in each answer's
``template_version`` and audit record.

This module sits in :mod:`daemon.config` (the lowest layer) because loading validates the
directory; Ask (:mod:`daemon.services.ask`) reads its templates through it too.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ._options import ConfigError

__all__ = ["MAX_TEMPLATE_BYTES", "NAMES", "Template", "TemplateSet", "load_templates"]

TASK_NAMES = ("answer", "explain_output", "diagnose", "summarize")
NAMES = ("system", *TASK_NAMES, "no_context")
MAX_TEMPLATE_BYTES = 64 * 1024
_REQUIRED = {"system": (), "no_context": (), **{t: ("sources", "question") for t in TASK_NAMES}}
_ALLOWED = {"system": (), "no_context": ("question",),
            **{t: ("sources", "question", "attachment") for t in TASK_NAMES}}


@dataclass(frozen=True)
class Template:
    """One template: its name, version (from its header; "operator" when it has none),
    body, and where it came from ("package" or the file's path)."""

    name: str
    version: str
    text: str
    origin: str


@dataclass(frozen=True)
class TemplateSet:
    """Every template by name, and the SHA-256 of the set (hex)."""

    templates: dict[str, Template]
    sha256: str

    def __getitem__(self, name: str) -> Template:
        return self.templates[name]

    @property
    def operator(self) -> bool:
        """Whether any template came from an operator's directory."""
        return any(t.origin != "package" for t in self.templates.values())


def parse(raw: str, name: str, where: str, *, packaged: bool) -> Template:
    """A template's header and body, its slots checked.

    Raises:
        ConfigError: naming ``where`` and the slot or header at fault.
    """
    header: dict[str, str] = {}
    body: list[str] = []
    for line in raw.splitlines():
        if line.startswith("# ") and ":" in line and not body:
            key, _, value = line[2:].partition(":")
            header[key.strip()] = value.strip()
        else:
            body.append(line)
    if packaged and (header.get("llamad-template") != name or "version" not in header):
        raise ConfigError(f"{where} lacks its 'llamad-template'/'version' header")
    if header.get("llamad-template", name) != name:
        raise ConfigError(f"{where}: its header names template "
                          f"{header['llamad-template']!r}, its file name {name!r}")
    text = "\n".join(body).strip()
    try:
        parsed = [(field, spec, conversion) for _, field, spec, conversion
                  in string.Formatter().parse(text) if field is not None]
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc} (write a literal brace as {{{{ or }}}})") from None
    for field, spec, conversion in parsed:
        if spec or conversion:  # a slot is filled as it is: no padding, no repr
            raise ConfigError(f"{where}: slot {{{field}}} takes no format spec or "
                              "conversion (write a literal brace as {{ or }})")
    slots = {field for field, _, _ in parsed}
    for slot in sorted(slots):
        if slot not in _ALLOWED[name]:
            allowed = ", ".join("{" + s + "}" for s in _ALLOWED[name]) or "none"
            raise ConfigError(f"{where}: unknown slot {{{slot}}} (the {name} template's "
                              f"slots: {allowed}; write a literal brace as {{{{ or }}}})")
    for slot in _REQUIRED[name]:
        if slot not in slots:
            raise ConfigError(f"{where}: the {name} template lacks its required slot "
                              f"{{{slot}}}")
    if not text:
        raise ConfigError(f"{where}: the {name} template is empty")
    return Template(name, header.get("version", "operator"), text,
                    "package" if packaged else where)


def _packaged(name: str) -> Template:
    raw = resources.files("daemon.services.ask").joinpath("templates", f"{name}.txt")
    return parse(raw.read_text(), name, f"packaged template {name}.txt", packaged=True)


def load_templates(directory: str = "") -> TemplateSet:
    """The packaged templates, with those of ``directory`` ("": none) in their place.

    Raises:
        ConfigError: the directory cannot be read, or a template in it is refused
            (module docstring), naming the file and the slot.
    """
    templates = {name: _packaged(name) for name in NAMES}
    if directory:
        root = Path(directory).expanduser()
        where = f"answer.templates_dir {str(root)!r}"
        try:
            files = sorted(p for p in root.iterdir() if p.suffix == ".txt")
        except OSError as exc:
            raise ConfigError(f"{where}: cannot be read ({exc.strerror or exc})") from None
        for path in files:
            if path.stem not in NAMES:
                raise ConfigError(f"{where}: unknown template {path.name} (expected any of "
                                  f"{', '.join(n + '.txt' for n in NAMES)})")
            try:
                data = path.read_bytes()[:MAX_TEMPLATE_BYTES + 1]
                if len(data) > MAX_TEMPLATE_BYTES:
                    raise ConfigError(f"{path}: over {MAX_TEMPLATE_BYTES} bytes")
                raw = data.decode("utf-8")
            except OSError as exc:
                raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
            except UnicodeDecodeError:
                raise ConfigError(f"{path}: not UTF-8 text") from None
            templates[path.stem] = parse(raw, path.stem, str(path), packaged=False)
    digest = hashlib.sha256()
    for name in NAMES:
        digest.update(name.encode() + b"\x00" + templates[name].text.encode() + b"\x01")
    return TemplateSet(templates, digest.hexdigest())
