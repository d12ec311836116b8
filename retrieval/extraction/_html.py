"""HTML to text: a small linear-time tokenizer, not :class:`html.parser.HTMLParser`.

The stdlib parser of Python 3.11.x before the CVE-2025-6069 fix (gh-135462) is quadratic on
malformed input (40 KB of ``"<a "`` takes ~20 s on 3.11.7, 20 MB never finishes) and
raises ``AssertionError`` on ``"<!["``. Here every character is looked at a bounded number
of times, nothing recurses, and nesting depth is bounded (``html_too_deep``). Scripts,
styles and the like are dropped; the first ``<title>`` (else the first ``<h1>``) is the
title; block elements become newlines; the first ``<meta>`` naming a date is the page's
own date (:func:`retrieval.extraction._dates.meta_date`).

Text a reader of the page does not see never reaches the index (nor, so, a prompt): a
page can hide instructions for a model where its human reviewer would not look. Dropped
with their content: ``<script>``, ``<style>``, ``<template>`` (inert, never rendered),
``<noscript>`` (what a browser with scripting shows instead is the page itself; the
fallback is typically "enable JavaScript"), ``<iframe>`` and the like, a ``<dialog>``
without ``open``, and any element with the ``hidden`` attribute (``until-found`` too),
``aria-hidden="true"``, or an inline style that hides it (``display: none``,
``visibility: hidden`` or ``collapse``, ``content-visibility: hidden``, ``opacity: 0``,
``font-size: 0``, ``color: transparent``; CSS comments and escapes resolved, entities
decoded). Not recognised: hiding by a style sheet's class rules, by positioning off
screen or clipping (the accessible "visually hidden" pattern, which screen readers read)
or by text drawn in the background's colour; those need a CSS engine. A hidden element
whose end tag may be omitted (``<p hidden>``, ``<li hidden>``) ends where a sibling of
its kind starts, if that comes right inside it, else with its parent: when in doubt more
is dropped, never less.
"""

from __future__ import annotations

import html
import re

from ..errors import ExtractionError
from ._dates import meta_date

_MARKUP = re.compile(r"<[A-Za-z/!?]")  # anything else after "<" is text ("a < b", "<3")
_TAG_OPEN = re.compile(r"<(/?)([A-Za-z][^\s/>]*+)")
# The rest of a tag up to its ">", quoted attribute values included. Possessive, so a tag
# with no ">" fails in one pass; per HTML5 an unterminated tag swallows the rest of the
# input, which is what the tokenizer then does.
_TAG_REST = re.compile(r"(?:[^>\"']++|\"[^\"]*+\"|'[^']*+')*+>")
_SPACE = re.compile(r"[ \t\n\f\r]+")

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr", "keygen", "frame", "basefont",
                   "bgsound", "isindex", "image"})
# End tags that may be omitted: never pushed, so "<p>a<p>b<li>c" does not grow the depth.
_OPTIONAL_END = frozenset({"p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th",
                           "thead", "tbody", "tfoot", "colgroup", "caption", "rb", "rt",
                           "rtc", "rp", "html", "head", "body"})
_RAW_TEXT = frozenset({"script", "style", "xmp", "iframe", "noembed", "noframes", "textarea",
                       "title", "plaintext"})
_RAW_END = {tag: re.compile(rf"</{tag}[\s/>]", re.IGNORECASE) for tag in _RAW_TEXT}
_DROPPED = frozenset({"script", "style", "noscript", "template", "xmp", "iframe", "noembed",
                      "noframes"})
_IN_HEAD = frozenset({"title", "meta", "link", "style", "script", "noscript", "base",
                      "template"})
_BLOCK = frozenset({
    "address", "article", "aside", "blockquote", "center", "dd", "details", "dialog", "dir",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2",
    "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "legend", "li", "main", "menu",
    "nav", "ol", "p", "pre", "section", "summary", "table", "tr", "ul", "caption", "body",
    "html", "listing", "tbody", "thead", "tfoot", "option",
})
_PARAGRAPH = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "blockquote",
                        "ul", "ol", "dl", "section", "article", "figure", "hr"})
_PREFORMATTED = frozenset({"pre", "listing", "textarea"})
# A hidden element whose end tag may be omitted ends at the start of these (when it is the
# innermost open element), as HTML5 closes it; otherwise with its parent.
_ENDED_BY = {
    "p": _BLOCK | {"p"}, "li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"},
    "option": {"option", "optgroup"}, "optgroup": {"optgroup"},
    "tr": {"tr", "tbody", "thead", "tfoot"}, "td": {"td", "th", "tr", "tbody", "thead", "tfoot"},
    "th": {"td", "th", "tr", "tbody", "thead", "tfoot"},
    "rb": {"rb", "rt", "rtc", "rp"}, "rt": {"rb", "rt", "rtc", "rp"},
    "rtc": {"rb", "rtc", "rp"}, "rp": {"rb", "rt", "rtc", "rp"},
}
_ATTRIBUTE = re.compile(r"""([^\s"'>/=]++)(?:\s*+=\s*+(?:"([^"]*+)"|'([^']*+)'|([^\s>]++)))?""")
_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|$)", re.DOTALL)
_CSS_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{1,6})[ \t\n\r\f]?|(.))", re.DOTALL)
_CSS_ZERO = re.compile(r"[+-]?(?:0+\.?0*|\.0+)(?:[a-z]{1,4}|%)?")


def _css_char(match: re.Match[str]) -> str:
    if match.group(1) is None:
        return match.group(2)
    code = int(match.group(1), 16)
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"


def _style_hides(style: str) -> bool:
    """Whether an inline ``style`` hides its element (see the module doc)."""
    css = _CSS_ESCAPE.sub(_css_char, _CSS_COMMENT.sub(" ", style)).lower()
    for declaration in css.split(";"):
        prop, _, value = declaration.partition(":")
        prop = prop.strip()
        value = " ".join(value.replace("!important", " ").split())
        if ((prop == "display" and value == "none")
                or (prop == "visibility" and value in ("hidden", "collapse"))
                or (prop == "content-visibility" and value == "hidden")
                or (prop in ("opacity", "font-size") and _CSS_ZERO.fullmatch(value))
                or (prop == "color" and value == "transparent")):
            return True
    return False


def _hides(tag: str, attributes: str) -> bool:
    """Whether a start tag's ``attributes`` (the text between its name and ``>``) hide
    the element (see the module doc). Linear in their length."""
    lowered = attributes.lower()
    if tag != "dialog" and "hidden" not in lowered and "style" not in lowered:
        return False
    names: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(attributes):
        value = next((v for v in match.group(2, 3, 4) if v is not None), "")
        names.setdefault(match.group(1).lower(), html.unescape(value))
    return ("hidden" in names
            or names.get("aria-hidden", "").strip().lower() == "true"
            or _style_hides(names.get("style", ""))
            or (tag == "dialog" and "open" not in names))


class _HtmlText:
    """Collects rendered text: collapsed whitespace, newlines at block boundaries."""

    def __init__(self, name: str, max_depth: int) -> None:
        self.name = name
        self.max_depth = max_depth
        self.parts: list[str] = []
        self.newlines = 2            # trailing newlines in parts (2 = start of text)
        self.space = False           # a collapsed space is pending
        self.stack: list[str] = []
        self.hiding: list[bool] = []  # per open element: whether it drops its content
        self.dropped = 0             # open elements whose content is dropped
        self.pre = 0                 # open preformatted elements
        self.in_head = False
        self.title: str | None = None
        self.h1: list[str] | None = None
        self.h1_text = ""
        self.date: int | None = None  # the first <meta> date

    # output

    def text(self, data: str) -> None:
        if self.dropped or not data:
            return
        if self.in_head:
            if not data.strip():
                return
            self.in_head = False     # text in <head> starts the body (HTML5 does the same)
        data = html.unescape(data).replace("\xa0", " ")
        if self.h1 is not None:
            self.h1.append(data)
        if self.pre:
            self.parts.append(data)
            body = data.rstrip("\n")
            self.newlines = len(data) - len(body) if body else self.newlines + len(data)
            self.space = False
            return
        words = _SPACE.sub(" ", data)
        if words.startswith(" "):
            self.space = True
        words = words.strip(" ")
        if not words:
            return
        if self.space and self.newlines == 0:
            self.parts.append(" ")
        self.parts.append(words)
        self.newlines = 0
        self.space = data[-1] in " \t\n\f\r"

    def newline(self, count: int = 1) -> None:
        if self.dropped:
            return
        while self.newlines < count:
            self.parts.append("\n")
            self.newlines += 1
        self.space = False

    def hard_break(self) -> None:
        if not self.dropped and self.newlines < 2:
            self.parts.append("\n")
            self.newlines += 1
            self.space = False

    # structure

    def start(self, tag: str, self_closing: bool, hidden: bool = False) -> None:
        if self.stack and self.hiding[-1] and tag in _ENDED_BY.get(self.stack[-1], ()):
            self.end(self.stack[-1])  # a hidden <p>, <li>, ... ended by its sibling
        if tag == "head":
            self.in_head = True
            return
        if self.in_head and tag not in _IN_HEAD:
            self.in_head = False
        if tag == "br":
            self.hard_break()
            return
        if tag in ("td", "th") and not hidden:
            if not self.dropped and self.newlines == 0:
                self.parts.append(" | ")
                self.space = False
            return
        if tag in _BLOCK:
            self.newline(2 if tag in _PARAGRAPH else 1)
        # A hidden element is pushed even if its end tag may be omitted, to drop its content.
        if tag in _VOID or self_closing or (tag in _OPTIONAL_END and not hidden):
            return
        self.push(tag, hides=hidden or tag in _DROPPED)
        if tag in _PREFORMATTED:
            self.pre += 1
        if tag == "h1" and self.h1 is None and not self.h1_text:
            self.h1 = []

    def push(self, tag: str, *, hides: bool) -> None:
        self.stack.append(tag)
        self.hiding.append(hides)
        if len(self.stack) > self.max_depth:
            raise ExtractionError(
                f"{self.name}: HTML elements nested deeper than {self.max_depth} levels "
                "(retrieval.html_max_depth)",
                "html_too_deep")
        if hides:
            self.dropped += 1

    def end(self, tag: str) -> None:
        if tag == "head":
            self.in_head = False
            return
        if tag not in self.stack:
            if tag in _BLOCK:
                self.newline(2 if tag in _PARAGRAPH else 1)
            return                   # stray or optional end tag
        while self.stack:
            popped = self.stack.pop()
            if self.hiding.pop():
                self.dropped -= 1
            if popped in _PREFORMATTED:
                self.pre -= 1
            if popped == "h1" and self.h1 is not None:
                self.h1_text = " ".join("".join(self.h1).split())
                self.h1 = None
            if popped == tag:
                break
        if tag in _BLOCK:
            self.newline(2 if tag in _PARAGRAPH else 1)

    def raw(self, tag: str, content: str, hidden: bool = False) -> None:
        """Content of a raw-text element: script, style, ... are dropped; the first
        <title> is the title (never body text); a <textarea> is preformatted text."""
        if tag == "title":
            if self.title is None:
                self.title = " ".join(html.unescape(content).split())
        elif tag == "textarea":
            self.start(tag, self_closing=False, hidden=hidden)
            self.text(content)
            self.end(tag)

    def result(self) -> tuple[str, str]:
        text = "".join(self.parts).strip("\n")
        return self.title or self.h1_text, text


def html_to_text(source: str, name: str, max_depth: int) -> tuple[str, str]:
    """(title, text) of an HTML document. Linear time; no recursion."""
    title, text, _ = html_document(source, name, max_depth)
    return title, text


def html_document(source: str, name: str, max_depth: int) -> tuple[str, str, int | None]:
    """(title, text, date) of an HTML document: the date (unix seconds) from its first
    ``<meta>`` that names one, else None. Linear time; no recursion."""
    out = _HtmlText(name, max_depth)
    pos, n = 0, len(source)
    while pos < n:
        markup = _MARKUP.search(source, pos)
        if markup is None:
            out.text(source[pos:])
            break
        lt = markup.start()
        if lt > pos:
            out.text(source[pos:lt])
        if source.startswith("<!--", lt):
            end = source.find("-->", lt + 4)
            if end == -1:
                break                # unterminated comment: the rest is comment
            pos = end + 3
            continue
        tag = _TAG_OPEN.match(source, lt)
        if tag is not None:
            rest = _TAG_REST.match(source, tag.end())
            if rest is None:
                break                # unterminated tag: the rest is inside it
            pos = rest.end()
            name_ = tag.group(2).lower()
            if tag.group(1):
                out.end(name_)
                continue
            if name_ == "meta" and out.date is None:
                out.date = meta_date(source[tag.end():pos - 1])
            self_closing = source[pos - 2] == "/" and name_ not in _RAW_TEXT
            if name_ in _RAW_TEXT and name_ != "plaintext":
                found = _RAW_END[name_].search(source, pos)
                out.raw(name_, source[pos : found.start() if found else n],
                        name_ == "textarea" and _hides(name_, source[tag.end():pos - 1]))
                if found is None:
                    break
                gt = source.find(">", found.end() - 1)
                pos = n if gt == -1 else gt + 1
                continue
            if name_ == "plaintext":
                out.text(source[pos:].replace("&", "&amp;"))
                break
            out.start(name_, self_closing, _hides(name_, source[tag.end():pos - 1]))
            continue
        # <!DOCTYPE>, <![CDATA[...]]>, <?pi?>, "</ 3>": skipped up to ">" (HTML5 treats
        # them as bogus comments outside foreign content).
        end = source.find(">", lt + 2)
        if end == -1:
            break                    # unterminated: the rest is inside it
        pos = end + 1
    return (*out.result(), out.date)
