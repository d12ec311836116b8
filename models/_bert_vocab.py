"""The WordPiece vocabulary of a BERT checkpoint as llama.cpp's WPM vocabulary.

Part of :mod:`models._bert_to_gguf` (its reference is the same llama.cpp converter):
``BertModel.set_vocab`` and the ``TextModel``/``SpecialVocab`` pieces it calls, reading
``tokenizer.json`` or ``vocab.txt`` directly instead of through the Hugging Face tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf

from .errors import ConversionError

# Tokenizer defaults of transformers' BertTokenizer, used when no tokenizer config names
# the special tokens.
_BERT_SPECIAL_DEFAULTS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def load_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file as an object.

    Raises:
        ConversionError: the file is missing, unreadable or not a JSON object.
    """
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConversionError(f"missing {path.name} in {path.parent}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return data


def add_vocab(
    writer: gguf.GGUFWriter, model_dir: Path, hparams: dict[str, Any], tokenizer_pre: str
) -> None:
    """BertModel.set_vocab, with the normalizer flags of the newer SpecialVocab."""
    tokens, toktypes = _wordpiece_vocab(model_dir, hparams)
    writer.add_token_type_count(hparams.get("type_vocab_size", 1))

    # Phantom-space vocabulary: llama.cpp's WPM tokenizer marks word starts with U+2581.
    # "##x" continuation pieces lose their prefix, other pieces gain the phantom space,
    # control tokens stay as they are.
    def phantom(tok: str, toktype: gguf.TokenType) -> str:
        if toktype == gguf.TokenType.CONTROL:
            return tok
        if tok.startswith("##"):
            return tok[2:]
        return "\u2581" + tok

    tokens = [phantom(t, k) for t, k in zip(tokens, toktypes, strict=True)]
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre(tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(toktypes)

    special_vocab = gguf.SpecialVocab(model_dir, n_vocab=len(tokens))
    # The vendored gguf-py writes the normalizer flags after the add_* flags and before
    # the chat template; the installed gguf (0.19) does not know them, so write them here
    # in the same place.
    chat_template = special_vocab.chat_template
    special_vocab.chat_template = None
    with _without_cls_handler_warning():
        special_vocab.add_to_gguf(writer, quiet=True)
    lowercase, strip_accents = _normalizer_flags(model_dir)
    if lowercase is not None:
        writer.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    if strip_accents is not None:
        writer.add_bool("tokenizer.ggml.normalizer.strip_accents", strip_accents)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


class _DropClsHandlerWarning(logging.Filter):
    """Hide SpecialVocab's "No handler for special token type cls" warning.

    GGUF has no key for a CLS token id (llama.cpp uses BOS, which is set to the same
    token), so the reference skips it with this warning on every BERT conversion.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No handler for special token type cls")


@contextlib.contextmanager
def _without_cls_handler_warning() -> Iterator[None]:
    log = logging.getLogger("gguf.vocab")
    drop = _DropClsHandlerWarning()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _wordpiece_vocab(
    model_dir: Path, hparams: dict[str, Any]
) -> tuple[list[str], list[gguf.TokenType]]:
    """TextModel.get_vocab_base for a WordPiece tokenizer, read from its files.

    ``tokenizer.json`` is preferred, as transformers' AutoTokenizer prefers the fast
    tokenizer; otherwise ``vocab.txt`` with the special tokens the slow BertTokenizer
    registers as added tokens.
    """
    vocab, added = _read_wordpiece(model_dir)
    if not vocab:
        raise ConversionError(f"{model_dir}: the vocabulary is empty")
    vocab_size = int(hparams.get("vocab_size", len(vocab)))
    if max(vocab.values()) >= vocab_size:
        raise ConversionError(
            f"{model_dir}: token id {max(vocab.values())} is outside vocab_size {vocab_size}"
        )
    reverse = {id_: tok for tok, id_ in vocab.items()}
    tokens: list[str] = []
    toktypes: list[gguf.TokenType] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        # The reference first round-trips non-normalized added tokens through the HF
        # tokenizer's decode(encode(t)); for bracketed special tokens that is the
        # identity, and without transformers it cannot be reproduced in general.
        if token in added:
            if added[token] or _looks_special(token):
                toktypes.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")  # pre-normalize user-defined spaces
                toktypes.append(gguf.TokenType.USER_DEFINED)
        else:
            toktypes.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, toktypes


def _read_wordpiece(model_dir: Path) -> tuple[dict[str, int], dict[str, bool]]:
    """Return (token -> id including added tokens, added token -> is special)."""
    tokenizer_json = model_dir / "tokenizer.json"
    if tokenizer_json.is_file():
        tokenizer = load_json(tokenizer_json)
        model = tokenizer.get("model") or {}
        if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
            raise ConversionError(f"{tokenizer_json}: not a WordPiece tokenizer")
        vocab: dict[str, int] = dict(model["vocab"])
        added: dict[str, bool] = {}
        for item in tokenizer.get("added_tokens", []):
            vocab[item["content"]] = item["id"]
            added[item["content"]] = bool(item.get("special"))
        return vocab, added

    vocab_txt = model_dir / "vocab.txt"
    if not vocab_txt.is_file():
        raise ConversionError(f"{model_dir}: neither tokenizer.json nor vocab.txt")
    vocab = {}
    with vocab_txt.open(encoding="utf-8") as f:
        for index, line in enumerate(f.readlines()):  # transformers' load_vocab
            vocab[line.rstrip("\n")] = index
    specials: dict[str, Any] = dict(_BERT_SPECIAL_DEFAULTS)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            config = load_json(model_dir / name)
            specials.update({k: v for k, v in config.items() if k in _BERT_SPECIAL_DEFAULTS})
    added = {}
    for value in specials.values():
        content = value.get("content") if isinstance(value, dict) else value
        if isinstance(content, str) and content in vocab:
            added[content] = True
    return vocab, added


def _looks_special(token: str) -> bool:
    """TextModel.does_token_look_special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _normalizer_flags(model_dir: Path) -> tuple[bool | None, bool | None]:
    """SpecialVocab._parse_normalizer (gguf-py in llama.cpp, newer than gguf 0.19)."""
    tokenizer_json = model_dir / "tokenizer.json"
    if not tokenizer_json.is_file():
        return None, None
    flags: dict[str, bool | None] = {"lowercase": None, "strip_accents": None}

    def parse(normalizer: dict[str, Any]) -> None:
        kind = normalizer.get("type")
        if kind == "Lowercase":
            flags["lowercase"] = True
        elif kind == "StripAccents":
            flags["strip_accents"] = True
        elif kind == "BertNormalizer":
            if "lowercase" in normalizer:
                flags["lowercase"] = normalizer["lowercase"]
            if "strip_accents" in normalizer:
                flags["strip_accents"] = normalizer["strip_accents"]
        elif kind == "Sequence":
            for item in normalizer.get("normalizers", []):
                parse(item)

    if normalizer := load_json(tokenizer_json).get("normalizer"):
        parse(normalizer)
    return flags["lowercase"], flags["strip_accents"]
