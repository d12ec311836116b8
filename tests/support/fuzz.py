"""The fuzzing properties: what hostile callers and files reach first, each a strategy
and a check.

Each property is a :class:`Property` in :data:`PROPERTIES`. tests/unit/test_fuzz.py runs
every one on a bounded, derandomized number of examples (:data:`CI`); ``python -m
bench.fuzz --minutes 10`` runs the same properties with fresh random seeds and many more
examples. :func:`run` makes the Hypothesis test of one property under given settings.

The properties:

* validation raises nothing but the documented error (``InvalidArgument``,
  ``InvalidDocument``), with a message naming the field; what it accepts is within limits;
* undecodable bytes of any request type become one printable line naming the type, never
  an exception; decodable ones decode exactly as protobuf decodes them;
* chunks are never longer than ``max_chars``, never blank, numbered, deterministic, and
  cover every non-whitespace character of the input (helpers from tests.support.chunks);
* after ``fit_tokens`` every piece fits the embedding model's context in
  tokens, whatever the tokenizer's density;
* redaction is idempotent, counts what it replaced, and never leaves a seeded secret.
"""

from __future__ import annotations

import asyncio
import string
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.checks import validation
from daemon.errors import InvalidArgument
from daemon.grpcapi.answer import question_from
from daemon.grpcapi.inference import _role
from daemon.grpcapi.wire import Malformed, _guard_deserializer
from daemon.models.swaps import check_plan_model
from daemon.services.ask import AnswerSettings
from daemon.services.ask._core import check as check_question
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import control_pb2, retrieval_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from retrieval import KINDS
from retrieval._sizing import fit_tokens
from retrieval.chunking._chunker import Chunk, chunk_text
from retrieval.errors import (
    MAX_DOCUMENT_ID_CHARS,
    InvalidDocument,
    validate_document_id,
    validate_source_id,
)
from retrieval.redaction._redactor import PLACEHOLDER_PREFIX, redact
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.requests import LIMITS, sampling_params

# --- hostile text ----------------------------------------------------------------------------

SPECIAL = st.sampled_from([
    "\x00", "\r", "\r\n", "\n", "\n\n", "\t", "\x0b", "\x0c", "\x1b[31m", "\x7f", "\u0085",
    "\u2028", "\ufeff", "\u200b", "e\u0301", "\U0001f469\u200d\U0001f4bb", "\U0001f600",
    "```", "~~~", "# ", "## ", "===", "---", "- ", "1. ", "> ", "    ", "{", "}", "!", '"',
    "<div>", "</div>", "&amp;", "password=", "://", "@", ".", "? ", "/", "\\", "..", " ",
])
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # any scalar value but surrogates
RUN = st.builds(lambda unit, n: unit * n, st.sampled_from(["a", " ", "\n", ".", "`", "#", "é",
                                                            "\U0001f600", "word ", "x\n"]),
                st.integers(0, 400))
HOSTILE = st.lists(st.one_of(TEXT, SPECIAL, RUN), max_size=30).map("".join)
SHORT = st.lists(st.one_of(TEXT, SPECIAL), max_size=8).map("".join)


@dataclass(frozen=True)
class Property:
    """A check run on values drawn from a strategy.

    Attributes:
        name: what it is called in test ids and in bench/fuzz.py's report.
        strategy: draws one example.
        check: raises AssertionError (or anything) when the property does not hold.
        examples: examples per run inside the test suite.
    """

    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]
    examples: int = 500


# --- request validation ----------------------------------------------------------------------


def _refusal(call: Callable[[], Any], *prefixes: str) -> Any:
    """Run ``call``; an InvalidArgument must name a field (start with a prefix). Returns the
    result, or None when refused."""
    try:
        return call()
    except InvalidArgument as exc:
        message = str(exc)
        assert message.startswith(prefixes), message
        assert "\n" not in message, message
        return None


def check_generate(value: tuple[str, pb.SamplingParams]) -> None:
    prompt, params = value
    request = pb.GenerateRequest(prompt=prompt, sampling=params)
    got = _refusal(lambda: validation.prompt(request, LIMITS), "prompt ")
    if got is not None:
        assert got == prompt
        assert 0 < len(got) <= LIMITS.max_prompt_chars and "\x00" not in got
    sampling = _refusal(lambda: validation.sampling(params, LIMITS), "sampling.")
    if sampling is not None:
        assert 1 <= sampling.max_tokens <= LIMITS.max_tokens
        assert 0.0 <= sampling.temperature <= 5.0
        assert sampling.top_p is None or 0.0 < sampling.top_p <= 1.0
        assert len(sampling.stop) <= LIMITS.max_stop


def check_chat(messages: list[tuple[int, str]]) -> None:
    request = pb.ChatRequest(messages=[pb.ChatMessage(role=r, content=c)  # type: ignore[arg-type]
                                       for r, c in messages])
    got = _refusal(lambda: validation.chat_messages(request, LIMITS), "messages", "the last ",
                   f"{len(messages)} messages")
    if got is None:
        return
    assert 1 <= len(got) <= LIMITS.max_messages
    assert {role for role, _ in got} <= {"system", "user", "assistant"}
    assert got[-1][0] != "assistant"
    assert sum(len(c) for _, c in got) <= LIMITS.max_prompt_chars
    assert [c for _, c in got] == [c for _, c in messages]


def check_embed(texts: list[str]) -> None:
    got = _refusal(lambda: validation.embed_texts(texts, LIMITS), "texts", f"{len(texts)} ")
    if got is None:
        return
    assert got == texts
    assert 1 <= len(got) <= LIMITS.max_embed_batch
    for text in got:
        assert text.strip() and len(text) <= LIMITS.max_embed_chars and "\x00" not in text


_ANSWER_SETTINGS = AnswerSettings(max_question_chars=60, max_attachment_chars=80,
                                 max_history_turns=2, default_max_tokens=16, default_k=5,
                                 min_vector_score=0.3, min_text_score=3.0)


def _invalid(check: Callable[[str], str], value: str) -> str | None:
    """The InvalidDocument message ``check`` raises for ``value``; None when it accepts
    ``value`` (and returns it unchanged)."""
    try:
        accepted = check(value)
    except InvalidDocument as exc:
        return str(exc)
    assert accepted == value
    return None


def check_servicer_fields(value: tuple[str, str, str, int, str, str, list[tuple[int, str]]]
                          ) -> None:
    """Document and source ids, model paths, roles and Ask's fields: the servicers' own
    checks raise their documented error only, and what they accept obeys the rules."""
    doc_id, source_id, model_path, role, question, attachment, history = value
    error = _invalid(validate_document_id, doc_id)
    if error is not None:
        assert error.startswith("document id ") and error.isprintable(), error
    else:
        assert 0 < len(doc_id) <= MAX_DOCUMENT_ID_CHARS
        assert not doc_id.startswith("/") and "\\" not in doc_id
        assert "" not in doc_id.split("/") and ".." not in doc_id.split("/")
        assert all(unicodedata.category(c) not in ("Cc", "Cs") for c in doc_id)
    error = _invalid(validate_source_id, source_id)
    if error is not None:
        assert error.startswith("source id ") and error.isprintable(), error
    else:
        assert set(source_id) <= set(string.ascii_lowercase + string.digits + "_-")
    _refusal(lambda: check_plan_model(model_path), "model_path ")
    name = _refusal(lambda: _role(role), "unknown role ")
    assert name in (None, "generation", "embedding")
    request = apb.AskRequest(question=question, attachment=attachment, history=[
        apb.Turn(role=r, content=c) for r, c in history])  # type: ignore[arg-type]
    checked = _refusal(lambda: check_question(question_from(request), _ANSWER_SETTINGS),
                       "question", "attachment", "history", f"{len(history)} history turns")
    if checked is not None:
        q, turns = checked
        assert q and len(q) <= 60 and "\x00" not in q and q == question.strip()
        assert len(turns) <= 2 and {r for r, _ in turns} <= {"user", "assistant"}


# --- bytes on the wire -----------------------------------------------------------------------

REQUEST_TYPES: tuple[type[Message], ...] = (
    pb.GenerateRequest, pb.ChatRequest, pb.EmbedRequest, pb.TokenizeRequest,
    retrieval_pb2.UpsertDocumentRequest, retrieval_pb2.SearchRequest,
    retrieval_pb2.AddSourceRequest, retrieval_pb2.GetDocumentRequest,
    control_pb2.SwapRequest, control_pb2.SetModeRequest, apb.AskRequest,
)


def _valid_bytes(draw: st.DrawFn, cls: type[Message]) -> bytes:
    """A serialized ``cls`` with string fields (nested ones included) set to any text."""
    texts = st.text(st.characters(codec="utf-8"), max_size=12)
    if cls is pb.ChatRequest:
        message: Message = pb.ChatRequest(messages=[pb.ChatMessage(role=draw(st.integers(0, 3)),  # type: ignore[arg-type]
                                                                   content=draw(texts))
                                                    for _ in range(draw(st.integers(0, 3)))])
    elif cls is pb.EmbedRequest:
        message = pb.EmbedRequest(texts=draw(st.lists(texts, max_size=3)))
    elif cls is retrieval_pb2.SearchRequest:
        message = retrieval_pb2.SearchRequest(query=draw(texts), top_k=draw(st.integers(0, 99)),
                                              filters=retrieval_pb2.SearchFilters(
                                                  sources=draw(st.lists(texts, max_size=2))))
    elif cls is apb.AskRequest:
        message = apb.AskRequest(question=draw(texts), history=[apb.Turn(content=draw(texts))])
    else:
        message = cls()
        for field in cls.DESCRIPTOR.fields:
            if field.type == field.TYPE_STRING and not field.is_repeated:
                setattr(message, field.name, draw(texts))
    data: bytes = message.SerializeToString()
    return data


@st.composite
def wire_payloads(draw: st.DrawFn) -> tuple[type[Message], bytes]:
    cls = draw(st.sampled_from(REQUEST_TYPES))
    data = bytearray(draw(st.one_of(st.binary(max_size=80), st.just(b"")))
                     if draw(st.booleans()) else _valid_bytes(draw, cls))
    for _ in range(draw(st.integers(0, 4))):  # flip, insert, delete, truncate
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "utf8"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 4))]
        elif op == "truncate":
            del data[at:]
        elif op == "utf8" and at < len(data):
            data[at] = draw(st.sampled_from([0x80, 0xC3, 0xFF, 0xED, 0xF4]))
    return cls, bytes(data)


def check_wire(value: tuple[type[Message], bytes]) -> None:
    """Any bytes: the guard decodes exactly what protobuf decodes, or returns one
    printable line naming the type; it never raises."""
    cls, data = value
    guarded = _guard_deserializer(cls.FromString)(data)
    try:
        expected = cls.FromString(data)
    except DecodeError:
        assert isinstance(guarded, Malformed)
        message = guarded.message
        assert message.startswith(f"request is not a valid {cls.DESCRIPTOR.full_name}: ")
        assert message.isprintable() and len(message) < 400, message
        return
    assert not isinstance(guarded, Malformed)
    assert guarded == expected


# --- chunking --------------------------------------------------------------------------------


@st.composite
def chunk_params(draw: st.DrawFn) -> tuple[int, int, int]:
    size = draw(st.one_of(st.integers(1, 40), st.integers(41, 1500)))
    overlap = draw(st.integers(0, size - 1))
    return size, overlap, size + draw(st.one_of(st.just(0), st.integers(0, 800)))


def check_chunk_bounds(value: tuple[str, str, tuple[int, int, int]]) -> None:
    """Bounded, never blank, numbered, deterministic; [] exactly for blank text; bad
    arguments only ever raise ValueError."""
    text, kind, (size, overlap, max_chars) = value
    chunks = chunk_text(text, kind, size=size, overlap=overlap, max_chars=max_chars)
    assert_guarantees(text, kind, size, overlap, max_chars, chunks)
    normalised = text.replace("\r\n", "\n").replace("\r", "\n")
    assert (chunks == []) == (not normalised.strip())
    for bad in ((0, 0, 1), (size, size, max_chars), (size, overlap, size - 1)):
        with pytest.raises(ValueError, match=r"must be"):
            chunk_text(text, kind, size=bad[0], overlap=bad[1], max_chars=bad[2])


def check_chunk_coverage(value: tuple[str, str, tuple[int, int, int]]) -> None:
    """Every non-whitespace character is in some chunk, in order."""
    text, kind, (size, overlap, max_chars) = value
    if kind == "markdown":  # fence lines are added or dropped by design: checked elsewhere
        text = text.replace("`", "'").replace("~", "-")
    chunks = chunk_text(text, kind, size=size, overlap=overlap, max_chars=max_chars)
    assert_covered(text, chunks, kind, size)


_COUNTERS: dict[str, Callable[[str], int]] = {
    # Byte-level BPE at its worst (a token per UTF-8 byte), WordPiece at its worst (a token
    # per character), and a tokenizer whose density jumps between words; each plus two
    # special tokens. No tokenizer makes more tokens than bytes: the engine relies on it.
    "bytes": lambda t: len(t.encode("utf-8")) + 2,
    "chars": lambda t: len(t) + 2,
    "words": lambda t: min(3 * len(t.split()), len(t.encode("utf-8"))) + 2,
}


class _Embedder:
    model_id = "fuzz"

    def __init__(self, context: int, counter: str) -> None:
        self.context = context
        self.count = _COUNTERS[counter]

    async def count_tokens(self, text: str) -> int:
        return self.count(text)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        raise AssertionError("not called")


def check_token_bound(value: tuple[str, str, int, str]) -> None:
    """After fitting, every piece is within the embedding context in tokens (a single
    character always fits the contexts drawn), none is blank, and none is lost."""
    text, kind, context, counter = value
    embedder = _Embedder(context, counter)
    pieces = chunk_text(text, kind, size=400, overlap=80, max_chars=700)
    fitted: list[Chunk] = asyncio.run(fit_tokens(pieces, embedder))  # type: ignore[arg-type]
    assert len(fitted) >= len(pieces)
    for piece in fitted:
        assert piece.text.strip()
        assert embedder.count(piece.text) <= context, (len(piece.text), context)
    squeezed = "".join("".join(p.text.split()) for p in fitted)
    for piece in pieces:  # each original piece's characters survive, in order
        assert all(ch in squeezed for ch in set("".join(piece.text.split())))


# --- redaction -------------------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits
_UPPER = string.ascii_uppercase + string.digits


def _token(draw: st.DrawFn, alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet`` with an upper case letter, a lower case letter and
    a digit where the alphabet has them (real tokens do)."""
    body = draw(st.text(st.sampled_from(alphabet), min_size=n, max_size=n))
    extra = "".join(c for c in "Aa7" if c in alphabet)
    return body[:n - len(extra)] + extra


# A secret with its surroundings: the secret is ``value``, the key one of the drawn names.
_AROUND = {
    "json": '"{key}": "{value}"',
    "env": "export {KEY}={value}",
    "bearer": "curl -H 'X: 1' -H \"Authorization: Bearer {value}\" https://api",
    "auth": "Authorization: Bearer {value}",
    "url": "postgres://app:{value}@db01.internal:5432/app",
    "cisco": "username admin privilege 15 secret 0 {value}",
    "flag": "mysql --password {value} -h db",
    "snmp": "snmp-server community {value} RO",
}
# A token recognised by its own shape: the whole text is the secret.
_WHOLE: dict[str, Callable[[st.DrawFn], str]] = {
    "aws": lambda draw: "AK" + "IA" + _token(draw, _UPPER, 16),
    "github": lambda draw: "gh" + "p_" + _token(draw, _ALNUM, 36),
    "slack": lambda draw: ("xo" + "xb-" + _token(draw, string.digits, 12) + "-"
                           + _token(draw, _ALNUM, 24)),
    "openai": lambda draw: "s" + "k-" + _token(draw, _ALNUM, 40),
    "jwt": lambda draw: ("ey" + "J" + _token(draw, _ALNUM, 20) + "." + _token(draw, _ALNUM, 30)
                         + "." + _token(draw, _ALNUM, 20)),
}


@st.composite
def seeded_secret(draw: st.DrawFn) -> tuple[str, str]:
    """(text holding a secret, the secret). Prefixes are split so that no literal here
    looks like a live credential to a scanner."""
    value = _token(draw, _ALNUM, draw(st.integers(12, 30)))
    kind = draw(st.sampled_from([
        "assign", "json", "env", "aws", "github", "slack", "openai", "jwt", "bearer",
        "auth", "url", "pem", "cisco", "flag", "snmp"]))
    key = draw(st.sampled_from(["password", "db_password", "api_key", "secret", "token",
                                "PASSWORD", "client_secret", "passwd"]))
    if kind == "assign":
        return f"{key}{draw(st.sampled_from(['=', ': ', ' = ', ':=']))}{value}", value
    if kind == "pem":
        body = "\n".join(_token(draw, _ALNUM + "+/", 64) for _ in range(3))
        label = "RSA PRIVATE" + " KEY"
        return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----", body.split("\n")[1]
    if kind in _WHOLE:
        value = _WHOLE[kind](draw)
        return value, value
    return _AROUND[kind].format(key=key, KEY=key.upper(), value=value), value


@st.composite
def seeded_documents(draw: st.DrawFn) -> tuple[str, list[str], bool, bool]:
    """Hostile filler with secrets between line breaks (a secret glued to filler is a
    different token: "xAKIA..." is not an access key)."""
    parts: list[str] = []
    secrets: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        parts.append(draw(SHORT))
        text, secret = draw(seeded_secret())
        parts.append(f"\n{text}\n")
        secrets.append(secret)
    parts.append(draw(SHORT))
    return "".join(parts), secrets, draw(st.booleans()), draw(st.booleans())


def check_redaction(value: tuple[str, list[str], bool, bool]) -> None:
    """Idempotent, counted, and no seeded secret survives, whatever surrounds it."""
    text, secrets, hostnames, ips = value
    once = redact(text, hostnames=hostnames, ips=ips)
    for secret in secrets:
        assert secret not in once.text, (secret, once.text)
    assert once.total >= 1 and all(n > 0 for n in once.counts.values())
    assert once.text.count(PLACEHOLDER_PREFIX) >= once.total
    twice = redact(once.text, hostnames=hostnames, ips=ips)
    assert (twice.text, twice.counts) == (once.text, {})


def check_redaction_hostile(value: tuple[str, bool, bool]) -> None:
    """Any text: never raises, idempotent, placeholders only where something was replaced."""
    text, hostnames, ips = value
    once = redact(text, hostnames=hostnames, ips=ips)
    twice = redact(once.text, hostnames=hostnames, ips=ips)
    assert (twice.text, twice.counts) == (once.text, {})
    if not once.counts:
        assert once.text == text


# --- the registry ----------------------------------------------------------------------------

ROLES = st.one_of(st.integers(-2, 5), st.integers(-(2**31), 2**31 - 1))
PROPERTIES: tuple[Property, ...] = (
    Property("validate_generate", st.tuples(HOSTILE, sampling_params()), check_generate),
    Property("validate_chat", st.lists(st.tuples(ROLES, SHORT), max_size=5), check_chat),
    Property("validate_embed", st.lists(st.one_of(SHORT, RUN), max_size=5), check_embed),
    Property("servicer_fields", st.tuples(
        st.one_of(SHORT, st.lists(st.sampled_from(["seed", "a", "..", "", ".", "b c", "\x00",
                                                   "x" * 300]), max_size=4).map("/".join)),
        st.one_of(SHORT, st.from_regex(r"[a-z0-9][a-z0-9_-]{0,70}", fullmatch=True)),
        st.one_of(SHORT, SHORT.map(lambda s: "/" + s)), ROLES, SHORT, SHORT,
        st.lists(st.tuples(ROLES, SHORT), max_size=3)), check_servicer_fields),
    Property("wire_bytes", wire_payloads(), check_wire, examples=1000),
    Property("chunk_bounds", st.tuples(HOSTILE, st.sampled_from(KINDS), chunk_params()),
             check_chunk_bounds),
    Property("chunk_coverage", st.tuples(HOSTILE, st.sampled_from(KINDS), chunk_params()),
             check_chunk_coverage),
    Property("embedding_token_bound", st.tuples(
        HOSTILE, st.sampled_from(KINDS), st.integers(8, 600), st.sampled_from(sorted(_COUNTERS))),
        check_token_bound, examples=400),
    Property("redaction_seeded_secrets", seeded_documents(), check_redaction, examples=500),
    Property("redaction_hostile_text", st.tuples(HOSTILE, st.booleans(), st.booleans()),
             check_redaction_hostile),
)

CI = settings(deadline=None, derandomize=True, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run(prop: Property, config: settings) -> Callable[[], None]:
    """A Hypothesis test of ``prop`` under ``config`` (call it to run it)."""

    @config
    @given(prop.strategy)
    def fuzz(value: Any) -> None:
        prop.check(value)

    fuzz.__name__ = f"fuzz_{prop.name}"
    return fuzz
