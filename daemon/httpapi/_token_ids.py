"""Token-id input (``input`` of ``/v1/embeddings``, ``prompt`` of ``/v1/completions``
given as integers): refused unless the caller states the ids are the model's own.

OpenAI's API takes token ids of OpenAI's tokenizers, and clients send them unasked:
LangChain's ``OpenAIEmbeddings`` tokenizes with tiktoken's cl100k and posts the ids by
default. Read as the served model's ids they name other words, and the embedding is of
another text without any error (measured: cosine 0.13 to the text's own embedding). So
token ids are a 400 that says how to send text, unless the body has
``"llamad_token_ids": "model"`` (llamad's extension: "these are the model's own ids").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import ParamError

FIELD = "llamad_token_ids"
"""The extension field stating whose token ids the input holds."""
OWN = "model"
"""Its one value: the ids are the serving model's own (``POST /tokenize`` of llama.cpp,
or the model's tokenizer)."""


def declared_own(body: Mapping[str, Any]) -> bool:
    """Whether the body states its token ids are the model's own.

    Raises:
        ParamError: ``llamad_token_ids`` is present with another value.
    """
    value = body.get(FIELD)
    if value is None:
        return False
    if value != OWN:
        raise ParamError(FIELD, f'{FIELD} must be "{OWN}" (the token ids are the serving '
                         f"model's own) or absent, got {str(value)[:40]!r}")
    return True


def refuse_foreign(param: str, *, own_accepted: bool) -> ParamError:
    """The refusal of token ids in ``param`` whose tokenizer was not stated."""
    tail = (f', or, if the ids are the serving model\'s own tokens, set "{FIELD}": "{OWN}"'
            if own_accepted else " (this route takes text only)")
    return ParamError(param, f"{param} is token ids, and llamad cannot tell which tokenizer "
                      "made them: ids of another tokenizer (OpenAI's cl100k, which "
                      "LangChain's OpenAIEmbeddings sends by default) would be read as this "
                      "model's own and stand for other text. Send the text instead "
                      "(LangChain: OpenAIEmbeddings(..., check_embedding_ctx_length=False))"
                      + tail)
