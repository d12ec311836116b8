"""Request validation: every field checked against a named limit, with a clear message.

Validation happens before anything reaches a child, so a bad request costs nothing and
changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llamad_protocol.v1 import inference_pb2 as pb
from supervisor import Sampling

from .config import Limits
from .errors import InvalidArgument

_ROLES = {
    pb.CHAT_ROLE_SYSTEM: "system",
    pb.CHAT_ROLE_USER: "user",
    pb.CHAT_ROLE_ASSISTANT: "assistant",
}


def _check_text(name: str, text: str, limit: int, *, allow_empty: bool = False) -> None:
    if not text and not allow_empty:
        raise InvalidArgument(f"{name} is empty")
    if len(text) > limit:
        raise InvalidArgument(f"{name} has {len(text)} characters; the limit is {limit} "
                              "(limits.max_prompt_chars)")
    if "\x00" in text:
        raise InvalidArgument(f"{name} contains a NUL character")


def sampling(params: pb.SamplingParams, limits: Limits) -> Sampling:
    """Validate sampling parameters and fill defaults."""
    max_tokens = params.max_tokens if params.HasField("max_tokens") else limits.default_max_tokens
    if max_tokens < 1 or max_tokens > limits.max_tokens:
        raise InvalidArgument(
            f"sampling.max_tokens must be in 1..{limits.max_tokens} (limits.max_tokens), "
            f"got {max_tokens}"
        )
    temperature = params.temperature if params.HasField("temperature") else 0.0
    if not math.isfinite(temperature) or not 0.0 <= temperature <= 5.0:
        raise InvalidArgument(f"sampling.temperature must be in 0..5, got {temperature}")
    top_p: float | None = None
    if params.HasField("top_p"):
        top_p = params.top_p
        if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
            raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {top_p}")
    top_k = params.top_k if params.HasField("top_k") else None
    if top_k is not None and top_k > 100_000:
        raise InvalidArgument(f"sampling.top_k must be at most 100000, got {top_k}")
    seed = params.seed if params.HasField("seed") else None
    if seed is not None and seed >= 2**32:
        raise InvalidArgument("sampling.seed must fit in 32 bits")
    if len(params.stop) > limits.max_stop:
        raise InvalidArgument(
            f"sampling.stop has {len(params.stop)} strings; the limit is {limits.max_stop} "
            "(limits.max_stop)"
        )
    for s in params.stop:
        if not s or len(s) > 256:
            raise InvalidArgument("sampling.stop strings must be 1..256 characters")
    return Sampling(max_tokens, temperature, top_p, top_k, seed, tuple(params.stop))


def prompt(request: pb.GenerateRequest, limits: Limits) -> str:
    _check_text("prompt", request.prompt, limits.max_prompt_chars)
    return request.prompt


def chat_messages(request: pb.ChatRequest, limits: Limits) -> list[tuple[str, str]]:
    if not request.messages:
        raise InvalidArgument("messages is empty")
    if len(request.messages) > limits.max_messages:
        raise InvalidArgument(
            f"{len(request.messages)} messages; the limit is {limits.max_messages} "
            "(limits.max_messages)"
        )
    out: list[tuple[str, str]] = []
    total = 0
    for i, msg in enumerate(request.messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise InvalidArgument(f"messages[{i}].role is unspecified or unknown")
        _check_text(f"messages[{i}].content", msg.content, limits.max_prompt_chars,
                    allow_empty=role == "assistant")
        total += len(msg.content)
        out.append((role, msg.content))
    if total > limits.max_prompt_chars:
        raise InvalidArgument(f"messages have {total} characters in all; the limit is "
                              f"{limits.max_prompt_chars} (limits.max_prompt_chars)")
    if out[-1][0] == "assistant":
        raise InvalidArgument("the last message must not be from the assistant")
    return out


def embed_texts(texts: Sequence[str], limits: Limits) -> list[str]:
    if not texts:
        raise InvalidArgument("texts is empty")
    if len(texts) > limits.max_embed_batch:
        raise InvalidArgument(
            f"{len(texts)} texts; the limit is {limits.max_embed_batch} (limits.max_embed_batch)"
        )
    for i, text in enumerate(texts):
        if not text.strip():
            raise InvalidArgument(f"texts[{i}] is empty")
        if len(text) > limits.max_embed_chars:
            raise InvalidArgument(
                f"texts[{i}] has {len(text)} characters; the limit is {limits.max_embed_chars} "
                "(limits.max_embed_chars)"
            )
        if "\x00" in text:
            raise InvalidArgument(f"texts[{i}] contains a NUL character")
    return list(texts)
