"""Generations that cannot end early: a logit bias of -100 on every end-of-generation token
of a model, read from its GGUF.

A test that needs a generation to outlast a deadline, a cancel or a swap must not rely on
the model choosing to talk for long: a fast machine finishes "Count to one thousand" in
22 tokens and 186 ms (SmolLM2-135M, seen on CI). With every token that ends a generation
banned, the child generates until ``max_tokens`` whatever the prompt and the machine.

Which tokens end a generation is llama.cpp's rule (``llama_vocab::impl::load``, the
"eog" set): the vocabulary's end-of-sequence, end-of-turn and end-of-message ids, plus
tokens whose text is one of the end markers chat models use.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator
from pathlib import Path

from llamad_protocol.v1 import inference_pb2 as pb

# The ids the GGUF names, and the texts llama.cpp treats as ending a generation whatever
# the ids say (its list of end-of-generation token texts).
_ID_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")
_END_TEXTS = frozenset({
    "</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>",
    "<|end|>", "<end_of_turn>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<|return|>",
    "<|call|>", "<|end▁of▁sentence|>",
})


@functools.cache
def end_tokens(model: Path) -> tuple[int, ...]:
    """The ids of every token that ends a generation of ``model`` (sorted)."""
    ids: set[int] = set()
    tokens: list[bytes] = []
    for key, value in _metadata(model):
        if key in _ID_KEYS:
            assert isinstance(value, int)
            ids.add(value)
        elif key == "tokenizer.ggml.tokens":
            assert isinstance(value, list)
            tokens = value
    assert tokens, f"{model} has no vocabulary"
    ids.update(i for i, text in enumerate(tokens)
               if text.decode("utf-8", errors="replace") in _END_TEXTS)
    assert ids, f"{model} names no end-of-generation token"
    return tuple(sorted(ids))


# GGUF metadata value types (ggml/include/gguf.h): fixed-size scalars by struct format.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _metadata(model: Path) -> Iterator[tuple[str, object]]:
    """Each metadata key of ``model`` with its value (strings as bytes, arrays as lists).

    A few lines of the GGUF layout instead of ``gguf.GGUFReader``, which builds a numpy
    view per vocabulary entry: a minute for gemma-3's 262k tokens on a busy machine,
    against a fraction of a second here."""
    with model.open("rb") as fh:
        data = fh.read(64 << 20)  # the metadata of these models is a few MiB
    magic, _, _, count = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF", f"{model} is not a GGUF file"
    pos = 24

    def string() -> bytes:
        nonlocal pos
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + length
        return data[pos - length:pos]

    def value(vtype: int) -> object:
        nonlocal pos
        if vtype == _STRING:
            return string()
        if vtype == _ARRAY:
            item, length = struct.unpack_from("<IQ", data, pos)
            pos += 12
            return [value(item) for _ in range(length)]
        fmt = _SCALARS[vtype]
        (scalar,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return scalar

    for _ in range(count):
        key = string().decode()
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        yield key, value(vtype)


def never_end(model: Path) -> list[pb.LogitBias]:
    """Logit biases that keep ``model`` generating until ``max_tokens`` (gRPC form)."""
    return [pb.LogitBias(token=token, bias=-100.0) for token in end_tokens(model)]


def never_end_openai(model: Path) -> dict[str, float]:
    """The same biases in the OpenAI HTTP API's form (``logit_bias``: id -> bias)."""
    return {str(token): -100.0 for token in end_tokens(model)}
