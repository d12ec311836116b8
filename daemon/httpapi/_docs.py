"""The OpenAPI :class:`~._openapi.Doc` of the routes whose handlers speak other APIs'
shapes (OpenAI's, Anthropic's) and of Ask: what the route table (:mod:`._routes`) hangs
on them. Their bodies are described by their main fields and linked to the reference
they follow; the handlers' own checks are the full contract (docs/http-api.md)."""

from __future__ import annotations

from typing import Any

from llamad_protocol.v1 import answer_pb2 as apb

from ._openapi import Doc

_OBJECT: dict[str, Any] = {"type": "object"}
_MODEL = {"type": "string", "description": "A model of GET /v1/models (id or alias)"}
_STREAM = {"type": "boolean", "description": "Answer as server-sent events"}


def _body(description: str, required: tuple[str, ...], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "description": description, "required": list(required),
            "properties": properties}


MODELS = Doc("The models: every model of the pool with its role and whether it is loaded",
             response=_body("OpenAI's model list", ("object", "data"),
                            object={"const": "list"},
                            data={"type": "array", "items": _OBJECT}))
MODEL = Doc("One model, by id or alias", path_params=("id",),
            response=_body("OpenAI's model object", ("id", "object"), id={"type": "string"},
                           object={"const": "model"}))
CHAT = Doc("Chat completions, whole or streamed (OpenAI's API: "
           "https://platform.openai.com/docs/api-reference/chat)",
           body=_body("OpenAI's chat completion request", ("messages",), model=_MODEL,
                      messages={"type": "array", "items": _OBJECT}, stream=_STREAM),
           response=_OBJECT, events=_OBJECT)
COMPLETIONS = Doc("Text completions, whole or streamed (OpenAI's legacy completions API)",
                  body=_body("OpenAI's completion request", ("prompt",), model=_MODEL,
                             prompt={"type": ["string", "array"]}, stream=_STREAM),
                  response=_OBJECT, events=_OBJECT)
RESPONSES = Doc("OpenAI's Responses API, whole or streamed",
                body=_body("OpenAI's response request", ("input",), model=_MODEL,
                           input={"type": ["string", "array"]}, stream=_STREAM),
                response=_OBJECT, events=_OBJECT)
MESSAGES = Doc("Anthropic's Messages API, whole or streamed (x-api-key taken as the token)",
               body=_body("Anthropic's message request", ("messages", "max_tokens"),
                          model=_MODEL, messages={"type": "array", "items": _OBJECT},
                          max_tokens={"type": "integer"}, stream=_STREAM),
               response=_OBJECT, events=_OBJECT, error="AnthropicError")
COUNT_TOKENS = Doc("Anthropic's token count of a Messages request",
                   body=_body("Anthropic's count request", ("messages",), model=_MODEL,
                              messages={"type": "array", "items": _OBJECT}),
                   response=_body("The count", ("input_tokens",),
                                  input_tokens={"type": "integer"}),
                   error="AnthropicError")
EMBEDDINGS = Doc("Embeddings, L2-normalised (OpenAI's API)",
                 body=_body("OpenAI's embedding request", ("input",), model=_MODEL,
                            input={"type": ["string", "array"]},
                            encoding_format={"enum": ["float", "base64"]},
                            dimensions={"type": "integer"}),
                 response=_body("OpenAI's embedding list", ("data",),
                                data={"type": "array", "items": _OBJECT}))
RERANK = Doc("Rerank (no rerank model is served yet: 404 naming model)",
             body=_OBJECT, response=_OBJECT)
ASK = Doc("A grounded answer with citations, whole or streamed",
          tag="knowledge", body=apb.AskRequest, body_required=("question",),
          body_extra={"stream": _STREAM},
          response=_body("The answer in one object", ("text",), text={"type": "string"},
                         sources={"$ref": "#/components/schemas/llamad.v1.AskSources"},
                         done={"$ref": "#/components/schemas/llamad.v1.AskDone"},
                         plan={"$ref": "#/components/schemas/llamad.v1.AskPlan"}),
          events=apb.AskResponse)
OPENAPI = Doc("This document (OpenAPI 3.1)", tag="admin",
              response={"type": "object", "required": ["openapi", "paths"]})
