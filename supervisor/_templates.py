"""Chat templates: which one a generation model's child formats Chat messages with.

A GGUF usually carries its own (``tokenizer.chat_template``, a Jinja template that
llama-server renders). Some are published without one — gemma-3-270m's GGUF among them —
and then llama-server silently formats every chat as ChatML, which a Gemma model does not
understand. :func:`choose_chat_template` picks, in order: the one the model's settings
name (``chat_template``, e.g. ``chatml-tools``: ChatML that renders tools, which no
default model's own template does); else the model's own; else a known
template chosen by architecture and model name (shipped as Jinja files beside this
module, passed with ``--chat-template-file``: this llama-server renders
``--chat-template NAME`` as a literal Jinja template, so a built-in name there became the
whole prompt, "gemma"); else none, which the daemon says in Status and refuses Chat and
Ask over, rather than let a generic template answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .gguf._header import GGUFInfo

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

# (architectures, pattern on general.name or the file name, template): the first match
# wins. Gemma (1, 2, 3, 3n) always uses its turn format; a llama-architecture file is
# ChatML only when its name says it is SmolLM (Llama 2/3 and Mistral use other formats).
_KNOWN: tuple[tuple[frozenset[str], re.Pattern[str], str], ...] = (
    (frozenset({"gemma", "gemma2", "gemma3", "gemma3n"}), re.compile(""), "gemma"),
    (frozenset({"qwen2", "qwen3"}), re.compile(""), "chatml"),
    (frozenset({"llama"}), re.compile(r"smollm", re.IGNORECASE), "chatml"),
)

# llama-cpp-python's --chat_format names for the same templates (it renders no tools:
# llamad refuses tools on that runtime, so chatml-tools is plain ChatML there).
BUNDLED_FORMATS = {"gemma": "gemma", "chatml": "chatml", "chatml-tools": "chatml"}

KNOWN_TEMPLATES = ("chatml", "chatml-tools", "gemma")
"""The templates shipped beside this module, which a model's ``chat_template`` may name."""
_TEMPLATE_NAME = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class ChatTemplate:
    """The chat template a generation child uses.

    Attributes:
        source: ``"configured"`` (the model's ``chat_template`` setting names ``name``),
            ``"model"`` (the GGUF's own ``tokenizer.chat_template``), ``"known"`` (the
            GGUF has none: ``name`` was chosen by architecture and model name) or
            ``"none"`` (the GGUF has none and none is known: Chat and Ask are refused).
        name: the known template's name (``"gemma"``, ``"chatml"``); ``""`` otherwise.
        reason: why, in words (for Status and refusals).
    """

    source: str
    name: str = ""
    reason: str = ""

    @property
    def usable(self) -> bool:
        """Whether Chat (and Ask) can format messages for this model."""
        return self.source != "none"

    def describe(self) -> str:
        """One line for Status: which template, and why."""
        if self.source == "configured":
            return f"{self.name} (the model's chat_template setting)"
        if self.source == "model":
            return "the model's own (tokenizer.chat_template)"
        if self.source == "known":
            return f"{self.name} (known template: {self.reason})"
        return f"none: {self.reason}"


def choose_chat_template(info: GGUFInfo, configured: str = "") -> ChatTemplate:
    """The template for ``info``'s model: the ``configured`` one (a name of
    :data:`KNOWN_TEMPLATES`; "" or "auto": none configured), its own, a known one, or
    none."""
    if configured and configured != "auto":
        return ChatTemplate("configured", configured, "set by the model's chat_template")
    if info.has_chat_template:
        return ChatTemplate("model")
    label = info.name or Path(info.path).name
    for architectures, pattern, name in _KNOWN:
        if info.architecture in architectures and (
                pattern.search(info.name) or pattern.search(Path(info.path).name)):
            return ChatTemplate("known", name, f"the GGUF has no tokenizer.chat_template; "
                                f"{label!r} is a {info.architecture} model")
    return ChatTemplate("none", reason=(
        f"the GGUF of {label!r} (architecture {info.architecture}) has no "
        "tokenizer.chat_template and llamad knows no template for it: Chat and Ask are "
        "refused (Generate works); use a GGUF that carries its template"))


def template_file(name: str) -> Path:
    """The Jinja file of the known template ``name``.

    Raises:
        ValueError: no such known template.
    """
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not _TEMPLATE_NAME.fullmatch(name) or not path.is_file():
        raise ValueError(f"no known chat template {name!r}")
    return path


def fallback_chat_template(architecture: str, has_template: bool, name: str = "") -> str | None:
    """The known template's name for a model without its own (by architecture and
    ``general.name``), or None (it has its own, or none is known)."""
    if has_template:
        return None
    for architectures, pattern, template in _KNOWN:
        if architecture in architectures and pattern.search(name):
            return template
    return None
