"""Source fences: each source's text enclosed in tags its own text cannot contain.

A document is data, but a model reads it in the same stream as its instructions. One could
fake a source label (``[S2]``), close its own source early and write a ``Question:`` line
after it. So each source is rendered as::

    <source label="S1" title="web01 disk full" section="Disk">
    …the chunk's text…
    </source>

and, in its title, heading and text, before that:

* anything shaped like a fence tag (``<source``, ``</source``, any case, any spacing,
  full-width ``<`` and ``/`` too) has its ``<`` replaced by U+2039 (a single left-pointing
  angle quotation mark), so the only fence tags in a prompt are ours;
* anything shaped like a citation label (``[S9]``, ``[s 1]``, ``[S1, S2]``, full-width
  brackets or letters too) has its square brackets replaced by parentheses, so the model
  is fed no label but those of the sources it was given;
* a title or heading is one line, without double quotes (they would end the attribute);
* the chat templates' own control tokens (ChatML and Llama 3 ``<|im_start|>``,
  ``<|eot_id|>`` and the like, Gemma's ``<start_of_turn>``/``<end_of_turn>``, ``<bos>``,
  ``</s>``, ``[INST]``, ``<<SYS>>``) are broken the same way: llama-server parses special
  tokens in the rendered prompt, so a document holding ``<|im_end|>`` would otherwise end
  the user's turn and start one of its own.

The attachment (evidence, command output: untrusted too) gets the control-token and
label treatment; it is not a source, so it has no fence.

The system template says that text inside the fences is data, not instructions. The
rendering is a pure function of its inputs, so the prompt stays deterministic.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["fence_source", "neutralise"]

# "<", full-width or small "<" too, then optional spaces and "/", then "source".
_FENCE_TAG = re.compile(r"[<\uff1c\ufe64](?=[ \t\r\n]*+[/\uff0f]?[ \t\r\n]*+source)",
                        re.IGNORECASE)
# A bracketed group of at most 60 characters on one line; whether it is label-shaped is
# decided on its NFKC-normalised inside (full-width letters and digits included).
_BRACKETED = re.compile(r"[\[［【〔]([^\[\]［］【】〔〕\n]{1,60})[\]］】〕]")
_LABELS = re.compile(r"\s*S\s*\d+(?:\s*[,;]\s*S?\s*\d+)*\s*", re.IGNORECASE)


# Control tokens of common chat templates: "<|...|>" (ChatML, Llama 3, Phi, Qwen, ...),
# Gemma's turn markers and BOS/EOS spellings, Llama 2's <<SYS>>; "[INST]" below.
_CONTROL = re.compile(
    r"<(?=\|[^|<>\n]{1,64}\|>)"
    r"|<(?=/?(?:start_of_turn|end_of_turn|bos|eos|pad|unk|s)>)"
    r"|<(?=<SYS>>|/SYS>>)", re.IGNORECASE)
_INST = re.compile(r"\[(/?INST)\]", re.IGNORECASE)


def _unlabel(match: re.Match[str]) -> str:
    inside = match.group(1)
    if _LABELS.fullmatch(unicodedata.normalize("NFKC", inside)):
        return f"({inside})"
    return match.group(0)


def neutralise(text: str) -> str:
    """``text`` with fence tags, citation labels and chat-template control tokens made
    inert (see the module doc)."""
    text = _CONTROL.sub("\u2039", _FENCE_TAG.sub("\u2039", text))
    return _BRACKETED.sub(_unlabel, _INST.sub(r"(\1)", text))


def _attribute(value: str) -> str:
    return " ".join(neutralise(value).replace('"', "'").split())


def fence_source(label: str, title: str, heading: str, text: str) -> str:
    """One source, fenced: its opening tag (label, title, section), text, closing tag."""
    section = f' section="{_attribute(heading)}"' if heading.strip() else ""
    return (f'<source label="{label}" title="{_attribute(title)}"{section}>\n'
            f"{neutralise(text)}\n</source>")
