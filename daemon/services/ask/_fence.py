"""Source fences: each source's text enclosed in tags its own text cannot contain.

A document is data, but a model reads it in the same stream as its instructions. One could
fake a source label (``[S2]``), close its own source early and write a ``Question:`` line
after it. So each source is rendered as::

    <source label="S1" title="web01 disk full" section="Disk">
    …the chunk's text…
    </source>

and, in its title, heading and text, before that:

* anything shaped like a fence tag (``<source``, ``</source``, any case, any spacing) has
  its ``<`` replaced by U+2039 (a single left-pointing angle quotation mark), so the only
  fence tags in a prompt are ours;
* anything shaped like a citation label (``[S9]``, ``[s 1]``, ``[S1, S2]``) has its
  square brackets replaced by parentheses, so the model is fed no label but those of the
  sources it was given;
* a title or heading is one line, without double quotes (they would end the attribute);
* the chat templates' own control tokens are broken the same way (their ``<`` or their
  brackets): llama-server parses special tokens in the rendered prompt, so a document
  holding ``<|im_end|>`` would otherwise end the user's turn and start one of its own.
  Covered: every ``<|…|>`` token (ChatML and Qwen, Llama 3 and 4, Phi, Granite, Command
  R, GPT-OSS, Kimi, ...); DeepSeek's, written with full-width bars (U+FF5C) and ``▁``
  (``begin▁of▁sentence``, ``User``, ``Assistant`` between those bars); Gemma's
  ``<start_of_turn>``, ``<end_of_turn>`` and its other ``<start_of_…>``/``<end_of_…>``
  tokens; ``<bos>``, ``<eos>``, ``<s>``, ``</s>``; Qwen's ``<tool_call>``,
  ``<tool_response>``, ``<tools>`` (llamad's own chatml-tools template uses them too) and
  ``<think>``; Llama 2's ``<<SYS>>``; Mistral's ``[INST]``, ``[SYSTEM_PROMPT]``,
  ``[TOOL_CALLS]`` and the like; EXAONE's ``[|user|]``; GLM's ``[gMASK]`` and ``<sop>``.

Look-alikes count: the shapes above are matched on a *skeleton* of the text, not on the
text itself. The skeleton drops what a reader does not see (format characters such as
zero-width spaces and joiners, the soft hyphen, bidi marks, variation selectors, and
combining marks), turns every space separator (no-break, ideographic, ...) into a space,
folds compatibility forms (NFKD: the full-width less-than sign, solidus and bar, the small
less-than sign) and maps a few confusables (angle brackets such as U+3008 and U+02C2,
slashes such as U+2215, Cyrillic and Greek letters shaped like Latin ones). So
``</source>`` written with a no-break space, a zero-width space, a soft hyphen or
full-width characters is broken like the plain one.
The text keeps every character except the ones replaced, so it reads as it did.

The attachment (evidence, command output: untrusted too) gets the control-token and
label treatment; it is not a source, so it has no fence.

The system template says that text inside the fences is data, not instructions. The
rendering is a pure function of its inputs, so the prompt stays deterministic.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["fence_source", "neutralise", "skeleton"]

_BROKEN_ANGLE = "\u2039"  # what a fence tag's or control token's "<" becomes

# On the skeleton: "<", optional spaces and "/", then "source".
_FENCE_TAG = re.compile(r"<(?=[ \t\r\n]*+/?[ \t\r\n]*+source)", re.IGNORECASE)
# Control tokens opened by "<": "<|...|>" (any name: new models add new ones), the named
# ones of Gemma, Qwen, Llama 2, GLM, Seed and BOS/EOS spellings.
_ANGLE_TOKEN = re.compile(
    r"<(?=[ \t]*+\|[^|<>\n]{1,64}\|[ \t]*+>)"
    r"|<(?=/?(?:(?:start|end)_of_\w{1,32}|(?:start|end)_function\w{0,32}|bos|eos|pad|unk"
    r"|mask|s|sop|eop|think|tool_call|tool_response|tools|seed:\w{1,32})>)"
    r"|<(?=<SYS>>|/SYS>>)", re.IGNORECASE)
# Control tokens in square brackets: Mistral's, GLM's, and EXAONE's "[|...|]".
_BRACKET_TOKEN = re.compile(
    r"\[(?:/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS|TOOL_CONTENT"
    r"|ARGS|CALL_ID|THINK|IMG|IMG_BREAK|IMG_END|gMASK|sMASK|MASK)"
    r"|\|[^|\[\]\n]{1,64}\|)\]", re.IGNORECASE)
# A bracketed group of at most 60 characters on one line; whether it is label-shaped is
# decided on its skeleton (full-width letters and digits, invisible characters included).
_BRACKETED = re.compile(r"[\[【〔]([^\[\]【】〔〕\n]{1,60})[\]】〕]")
_LABELS = re.compile(r"\s*S\s*\d+(?:\s*[,;]\s*S?\s*\d+)*\s*", re.IGNORECASE)

# Invisible characters that are not format characters (category Cf, dropped as a class):
# the combining grapheme joiner, Mongolian free variation selectors, Hangul fillers,
# Khmer inherent vowels.
_INVISIBLE = frozenset("\u034f\u180b\u180c\u180d\u180f\u115f\u1160\u3164\uffa0"
                       "\u17b4\u17b5")
# Confusables that NFKD leaves apart: angle brackets, slashes and bars, and Cyrillic and
# Greek letters drawn like Latin ones ("source" in Cyrillic letters). U+2039, the broken
# "<", stays itself.
_CONFUSABLE = str.maketrans({
    **dict.fromkeys("\u02c2\u1438\u276e\u27e8\u3008\u2329", "<"),
    **dict.fromkeys("\u02c3\u1433\u276f\u27e9\u3009\u232a", ">"),
    **dict.fromkeys("\u2044\u2215\u29f8\u2571", "/"),
    **dict.fromkeys("\u2223\u01c0\u05c0\u2758", "|"),
    **dict(zip("асеорхуѕіјһԁԛԝӏАВЕКМНОРСТХЅІЈ",
               "aceopxysijhdqwlABEKMHOPCTXSIJ", strict=True)),
    **dict(zip("οαινκρυτΟΑΒΕΗΙΚΜΝΡΤΧΥΖ", "oaivkputOABEHIKMNPTXYZ", strict=True)),
})


@functools.lru_cache(maxsize=8192)
def _fold(char: str) -> str:
    """What ``char`` is in the skeleton: "" if unseen, " " if a space, else its
    compatibility decomposition without combining marks, confusables mapped."""
    category = unicodedata.category(char)
    if category == "Cf" or char in _INVISIBLE or "\ufe00" <= char <= "\ufe0f" \
            or "\U000e0100" <= char <= "\U000e01ef":
        return ""
    if category == "Zs":
        return " "
    folded = "".join(c for c in unicodedata.normalize("NFKD", char)
                     if unicodedata.category(c) not in ("Mn", "Me"))
    return folded.translate(_CONFUSABLE)


def skeleton(text: str) -> tuple[str, list[int] | None]:
    """``text`` as the fence matching sees it (see the module doc), and for each of its
    characters the index in ``text`` of the character it came from (None: the same
    index, ``text`` is ASCII and its own skeleton)."""
    if text.isascii():
        return text, None
    parts: list[str] = []
    origin: list[int] = []
    for i, char in enumerate(text):
        folded = _fold(char)
        parts.append(folded)
        origin.extend([i] * len(folded))
    return "".join(parts), origin


def _edits(folded: str) -> dict[int, str]:
    """Skeleton index -> replacement, for every fence tag, control token and label."""
    edits: dict[int, str] = {}
    for pattern in (_FENCE_TAG, _ANGLE_TOKEN):
        for match in pattern.finditer(folded):
            edits[match.start()] = _BROKEN_ANGLE
    for match in _BRACKET_TOKEN.finditer(folded):
        edits[match.start()], edits[match.end() - 1] = "(", ")"
    for match in _BRACKETED.finditer(folded):
        if _LABELS.fullmatch(match.group(1)):
            edits[match.start()], edits[match.end() - 1] = "(", ")"
    return edits


def neutralise(text: str) -> str:
    """``text`` with fence tags, citation labels and chat-template control tokens made
    inert, look-alikes included (see the module doc); every other character kept."""
    folded, origin = skeleton(text)
    edits = _edits(folded)
    if not edits:
        return text
    chars = list(text)
    for at, replacement in edits.items():
        chars[at if origin is None else origin[at]] = replacement
    return "".join(chars)


def _attribute(value: str) -> str:
    return " ".join(neutralise(value).replace('"', "'").split())


def fence_source(label: str, title: str, heading: str, text: str) -> str:
    """One source, fenced: its opening tag (label, title, section), text, closing tag."""
    section = f' section="{_attribute(heading)}"' if heading.strip() else ""
    return (f'<source label="{label}" title="{_attribute(title)}"{section}>\n'
            f"{neutralise(text)}\n</source>")
