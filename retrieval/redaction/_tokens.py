"""Provider token formats: secrets recognisable by their own shape, wherever they are.

Each rule is anchored by the provider's literal prefix (``sk_live_``, ``glpat-``,
``AKIA``, ...) and checks the body's alphabet and length; where a prefix also starts
identifiers (``hf_``, ``npm_``, ``key-``), the body must look generated, not like words
(:func:`looks_random`). The bare AWS secret access key has no prefix at all: see
:func:`_aws_secret_bare` for what it must look like to be taken for one.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable

from ._base import (
    B64URL,
    CI,
    Rule,
    Span,
    entropy,
    has_digit,
    lead,
    mixed_case,
    rule,
    windowed,
)

Accept = Callable[[re.Match[str]], bool]

# Runs a camelCase/snake_case word splits into; generated tokens split into short ones.
# (``[A-Z]+`` gives back one letter at most: "HTTPServer" -> HTTP, Server. Linear.)
_SEGMENT = re.compile(r"[A-Z]?[a-z]++|[A-Z]+(?![a-z])|[0-9]++")


def looks_random(value: str) -> bool:
    """True when ``value`` reads as generated, not as words: its letter and digit runs
    (``getUserName2`` -> get, User, Name, 2) average under 3.5 characters. (Random
    base64 averages 1.9, and 3.2 at the 99.9th percentile; identifiers and paths 3.8 up.)
    Only the first 256 characters are read."""
    runs = [len(m.group()) for m in _SEGMENT.finditer(value, 0, 256)]
    return sum(runs) < 3.5 * max(1, len(runs))


def _body(skip: int, check: Callable[[str], bool]) -> Accept:
    """An ``accept`` check of the match after its ``skip``-character prefix."""
    return lambda m: check(m.group(0)[skip:])


def _generated(body: str) -> bool:
    return has_digit(body) or looks_random(body)


_B64 = rf"[{B64URL}]"
_NOT_B64_AFTER = rf"(?![{B64URL}])"


def _back(n: int, kind: str) -> Callable[[re.Match[str]], Span | None]:
    """A handler for patterns matched from a literal in the middle of the token: the
    token starts ``n`` characters before the match (checked by the pattern's lookbehind)."""
    return lambda m: (m.start() - n, m.end(), kind)


# JSON Web Tokens: three base64url segments, the first (the header) starting with eyJ.
JWT = rule(lead("eyJ", before=_B64) + rf"{_B64}{{8,}}+\.{_B64}{{8,}}+\.{_B64}*+",
           "jwt", ("eyj",))

# Access key ids (AKIA: long-term, ASIA: temporary; ABIA, ACCA: other partitions).
AWS_KEY = rule(lead("AKIA", "ASIA", "ABIA", "ACCA", before="[A-Za-z0-9]")
               + r"[A-Z0-9]{16}(?![A-Za-z0-9])", "aws_key", ("akia", "asia", "abia", "acca"))

AWS_SECRET = rule(
    r"(?:" + lead("aws") + r"_?secret_?(?:access_?)?key|" + lead("secret") + r"_?access_?key)"
    r"[\"']?[ \t]*+(?::=|=>|=|:)[ \t]*+[\"']?(?P<v>[a-z0-9/+=]{40})(?![a-z0-9/+=])",
    "aws_secret", ("secret",), flags=CI,
)

GCP_KEY = rule(lead("AIza", before=_B64) + rf"{_B64}{{35}}{_NOT_B64_AFTER}", "gcp_key",
               ("aiza",))
GCP_OAUTH = rule(
    rf"(?:{lead('GOCSPX-', before=_B64)}{_B64}{{28}}|{lead('ya29.', before=_B64)}{_B64}{{30,}}+"
    rf"|{lead('1//0', before=_B64)}{_B64}{{40,}}+){_NOT_B64_AFTER}",
    "gcp_key", ("gocspx-", "ya29.", "1//0"),
)
GCP_PRIVATE_KEY_ID = rule(
    lead("private_key_id") + r"[\"']?[ \t]*+[:=][ \t]*+[\"']?(?P<v>[0-9a-f]{40})(?![0-9a-f])",
    "gcp_key", ("private_key_id",),
)

GITHUB = rule(
    r"(?:" + lead("gh", before="[A-Za-z0-9_]") + r"[pousr]_[A-Za-z0-9]{36,255}+|"
    + lead("github_pat_", before="[A-Za-z0-9_]") + r"[A-Za-z0-9_]{22,255}+)(?![A-Za-z0-9_])",
    "github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
)
_GITLAB_PREFIXES = ("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "glsoat-", "glft-",
                    "glimt-", "glagent-", "gloas-", "glffct-")
GITLAB = rule(
    r"(?:" + lead("gl") + r"(?:pat|dt|rt|ptt|cbt|soat|ft|imt|agent|oas|ffct)-"
    r"[A-Za-z0-9_\-]{20,}+|" + lead("GR1348941") + r"[A-Za-z0-9_\-]{20,}+)",
    "gitlab_token", (*_GITLAB_PREFIXES, "gr1348941"),
)

SLACK = rule(
    r"(?:" + lead("xox", before="[A-Za-z0-9-]") + r"(?:[abposre]-|e\.xox[bp]-)|"
    + lead("xapp-", before="[A-Za-z0-9-]") + r")[A-Za-z0-9-]{10,}+",
    "slack_token", ("xox", "xapp-"),
)
SLACK_WEBHOOK = rule(
    r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<v>[a-z0-9_\-]++/[a-z0-9/_\-]++)",
    "slack_token", ("hooks.slack.com",), flags=CI,
)
DISCORD_WEBHOOK = rule(
    r"discord(?:app)?\.com/api/webhooks/[0-9]{17,20}+/(?P<v>[a-z0-9_\-]{60,}+)",
    "discord_token", ("discord",), flags=CI,
)


def _discord_accept(m: re.Match[str]) -> bool:
    """The first part of a Discord bot token is the bot's numeric id, base64-encoded."""
    first = m.group(0).split(".", 1)[0]
    try:
        decoded = base64.b64decode(first + "=" * (-len(first) % 4), altchars=b"-_")
    except (binascii.Error, ValueError):
        return False
    return decoded.isdigit() and len(decoded) >= 15


DISCORD_BOT = rule(
    lead("M", "N", "O", before=r"[\w.-]")
    + r"[A-Za-z0-9_\-]{23,27}+\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}+(?![\w-])",
    "discord_token", (), accept=_discord_accept,
)
def _telegram_handle(m: re.Match[str]) -> Span | None:
    """The bot id before ":AA": 8 to 10 digits, after a non-word character or "/bot"."""
    text, i = m.string, m.start()
    while i > m.start() - 11 and i > 0 and text[i - 1].isdigit():
        i -= 1
    if not 8 <= m.start() - i <= 10:
        return None
    before = text[max(0, i - 4) : i]
    if before.endswith("/bot") or not before or not (before[-1].isalnum() or before[-1] in "_:"):
        return i, m.end(), "telegram_token"
    return None


# 123456789:AA...: found from ":AA", the bot id read back.
TELEGRAM_BOT = Rule(windowed(
    re.compile(r":AA(?<=[0-9]{8}:AA)[A-Za-z0-9_\-]{33}(?![\w-])"), _telegram_handle, (":aa",)),
    (":aa",))


STRIPE = rule(r"(?:" + lead("sk_", "rk_", before="[A-Za-z0-9_]") + r"(?:live|test)_"
              r"[A-Za-z0-9]{16,}+|" + lead("whsec_", before="[A-Za-z0-9_]")
              + r"[A-Za-z0-9+/=]{24,}+)",
              "stripe_key", ("k_live_", "k_test_", "whsec_"),
              accept=_body(8, _generated))
SQUARE = rule(r"(?:" + lead("sq0") + r"(?:atp|csp|idp)-[A-Za-z0-9_\-]{22,}+|" + lead("EAA")
              + r"[A-Za-z0-9_\-]{60,}+)",
              "square_token", ("sq0", "eaa"), accept=_body(3, mixed_case))
SHOPIFY = rule(lead("shp") + r"(?:at|ca|pa|ss)_[a-fA-F0-9]{32}(?![\w-])",
               "shopify_token", ("shp",))

# Prefix, body: providers whose tokens carry their name.
_SAAS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("npm_",), r"[A-Za-z0-9]{36}", "npm_token"),
    (("pypi-AgEIcHlwaS5vcmc", "pypi-AgENdGVzdC5weXBpLm9yZw"), r"[A-Za-z0-9_\-]{50,}+",
     "pypi_token"),
    (("dop_v1_", "doo_v1_", "dor_v1_"), r"[a-f0-9]{64}", "digitalocean_token"),
    (("ATATT3", "ATCTT3"), r"[A-Za-z0-9_\-=]{32,}+", "atlassian_token"),
    (("HRKU-",), r"[A-Za-z0-9_\-]{30,}+", "heroku_key"),
    (("PMAK-",), r"[a-f0-9]{24}-[a-f0-9]{34}", "postman_key"),
    (("NRAK-",), r"[A-Z0-9]{27}", "newrelic_key"),
    (("sntrys_", "sntryu_"), r"[A-Za-z0-9+/=_]{60,}+", "sentry_token"),
    (("glsa_",), r"[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}", "grafana_token"),
    (("glc_",), r"[A-Za-z0-9+/]{32,}+={0,2}", "grafana_token"),
    (("dapi",), r"[a-f0-9]{32}(?:-[0-9])?", "databricks_token"),
    (("dp.pt.", "dp.st.", "dp.ct.", "dp.sa.", "dp.scim.", "dp.audit."), r"[A-Za-z0-9]{40,}+",
     "doppler_token"),
    (("lin_api_",), r"[A-Za-z0-9]{40}", "linear_key"),
    (("secret_",), r"[A-Za-z0-9]{43}", "notion_token"),
    (("ntn_",), r"[A-Za-z0-9]{40,}+", "notion_token"),
    (("LTAI",), r"[A-Za-z0-9]{12,20}+", "alibaba_key"),
    (("AKCp",), r"[A-Za-z0-9]{69}", "artifactory_key"),
    (("AGE-SECRET-KEY-1",), r"[0-9A-Z]{58}", "age_key"),
    (("hf_", "api_org_"), r"[A-Za-z0-9]{34,40}+", "huggingface_token"),
    (("key-",), r"[0-9a-zA-Z]{32}", "mailgun_key"),
    (("hvs.", "hvb.", "hvr."), r"[A-Za-z0-9_\-]{24,}+", "vault_token"),
)


def _saas_rule(prefixes: tuple[str, ...], body: str, kind: str) -> Rule:
    pattern = re.compile(f"(?P<p>{lead(*prefixes)}){body}(?![\\w-])")

    def handle(m: re.Match[str]) -> Span | None:
        if not _generated(m.group(0)[len(m.group("p")) :]):
            return None
        return m.start(), m.end(), kind

    lowered = [prefix.lower() for prefix in prefixes]
    common = lowered[0]
    while not all(prefix.startswith(common) for prefix in lowered):
        common = common[:-1]
    needles = (common,) if len(common) >= 3 else tuple(lowered)
    return Rule(windowed(pattern, handle, needles), needles)


SAAS_TOKENS = tuple(_saas_rule(*entry) for entry in _SAAS)
TERRAFORM = Rule(windowed(
    re.compile(r"\.atlasv1\.(?<=(?<![\w.-])[A-Za-z0-9]{14}\.atlasv1\.)[A-Za-z0-9_\-=]{60,}+"),
    _back(14, "terraform_token"), (".atlasv1.",)), (".atlasv1.",))

VAULT_LEGACY = rule(lead("s.", before=r"[\w.]") + r"[A-Za-z0-9]{24}(?![\w.])", "vault_token",
                    ("s.",), accept=_body(2, lambda b: mixed_case(b) and looks_random(b)))
SENDGRID = rule(lead("SG.", before=r"[\w.-]")
                + r"[A-Za-z0-9_\-]{16,32}+\.[A-Za-z0-9_\-]{16,64}+(?![\w.-])",
                "sendgrid_key", ("sg.",), accept=_body(3, _generated))
TWILIO = rule(r"(?:" + lead("SK", before="[A-Za-z0-9]") + r"[0-9a-fA-F]{32}|"
              + lead("AC", before="[A-Za-z0-9]") + r"[0-9a-f]{32})(?![A-Za-z0-9])",
              lambda m: "twilio_key" if m.group(0)[0] == "S" else "twilio_sid", ("sk", "ac"),
              accept=_body(2, has_digit))
MAILCHIMP = Rule(windowed(
    re.compile(r"-us(?<=(?<![\w-])[0-9a-f]{32}-us)[0-9]{1,2}(?![\w-])"),
    _back(32, "mailchimp_key"), ("-us",)), ("-us",))
FIREBASE = Rule(windowed(
    re.compile(r":APA91b(?<=(?<![\w-])AAAA[A-Za-z0-9_\-]{7}:APA91b)[A-Za-z0-9_\-]{100,}+"),
    _back(11, "gcp_key"), (":apa91b",)), (":apa91b",))
# Azure AD (Entra) client secrets: three characters, a digit, "Q~", then 31-34 more.
AZURE_CLIENT_SECRET = Rule(windowed(
    re.compile(r"Q~(?<=(?<![\w~.-])[A-Za-z0-9_~.\-]{3}[0-9]Q~)[A-Za-z0-9_~.\-]{31,34}+"
               r"(?![\w~.-])"),
    _back(4, "azure_key"), ("q~",)), ("q~",))
# Azure storage / Service Bus connection strings and SAS tokens; presigned URL signatures.
AZURE_CONNECTION = rule(
    lead("accountkey", "sharedaccesskey", "sharedaccesssignature", "primarykey",
         "secondarykey") + r"[ \t]*+=[ \t]*+(?P<v>[^;\s\"'<>]{8,}+)",
    "azure_key", ("accountkey", "sharedaccess", "primarykey", "secondarykey"), flags=CI,
)
URL_SIGNATURE = rule(
    lead("sig=", "signature=", "x-amz-signature=", "x-goog-signature=")
    + r"(?P<v>[^&;\s\"'<>#]{16,}+)",
    "url_signature", ("sig=", "signature="), flags=CI,
    accept=lambda m: has_digit(m.group("v")) or "%" in m.group("v"),
)


def _anthropic_accept(m: re.Match[str]) -> bool:
    return mixed_case(m.group(0)[7:])


ANTHROPIC = rule(lead("sk-ant-", before=r"[A-Za-z0-9_\-]") + r"[A-Za-z0-9_\-]{32,}+",
                 "anthropic_key", ("sk-ant-",), accept=_anthropic_accept)


def _openai_accept(m: re.Match[str]) -> bool:
    return mixed_case(m.group("v")[3:])


# OpenAI-style keys: sk-..., sk-proj-... (20+ characters of mixed case and digits, so
# kebab-case slugs such as "sk-my-long-deployment-name" survive).
OPENAI = rule(r"(?P<v>" + lead("sk-", before=r"[A-Za-z0-9_\-]") + r"[A-Za-z0-9_\-]{20,}+)",
              "openai_key", ("sk-",), accept=_openai_accept)


# --- the bare AWS secret access key --------------------------------------------------------

_AWS_SECRET_BARE = re.compile(r"(?<![A-Za-z0-9/+=_\-.])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=_\-])")
_PRINTABLE = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}
_B64_LINE = re.compile(r"[A-Za-z0-9+/=]{60,}+\r?\n\Z")


def _is_text_in_base64(value: str) -> bool:
    """True when ``value`` is base64 of ordinary text (30 printable bytes)."""
    try:
        decoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return all(b in _PRINTABLE for b in decoded)


def _aws_secret_bare(m: re.Match[str]) -> bool:
    """Forty characters of base64 with no key name next to them is an AWS secret access
    key only if it looks like one: upper case, lower case and digits mixed as in random
    text (no words, entropy of random base64), not base64 of text, not the tail of a
    wrapped base64 blob (a certificate's last line), not an ssh public key (``AAAA``)."""
    value = m.group(0)
    if value.startswith("AAAA") or not mixed_case(value):
        return False
    if sum(c.isupper() for c in value) < 4 or sum(c.islower() for c in value) < 4:
        return False
    if not looks_random(value) or entropy(value) < 4.0 or _is_text_in_base64(value):
        return False
    text, start = m.string, m.start()
    before = text[max(0, start - 200) : start]
    return _B64_LINE.search(before) is None


AWS_SECRET_BARE = Rule(windowed(
    _AWS_SECRET_BARE,
    lambda m: (m.start(), m.end(), "aws_secret") if _aws_secret_bare(m) else None, ()), ())

# Order matters where prefixes overlap: Anthropic before OpenAI, JWT first (a JWT is a JWT
# inside any header or assignment).
TOKEN_RULES: tuple[Rule, ...] = (
    JWT, AWS_KEY, AWS_SECRET, GCP_KEY, GCP_OAUTH, GCP_PRIVATE_KEY_ID, GITHUB, GITLAB,
    SLACK, SLACK_WEBHOOK, DISCORD_WEBHOOK, DISCORD_BOT, TELEGRAM_BOT, STRIPE, SQUARE,
    SHOPIFY, *SAAS_TOKENS, TERRAFORM, VAULT_LEGACY, SENDGRID, TWILIO, MAILCHIMP, FIREBASE,
    AZURE_CLIENT_SECRET, AZURE_CONNECTION, URL_SIGNATURE, ANTHROPIC, OPENAI,
)
