"""The fake InferenceService of :class:`clients.testing.FakeLlamad`: text from a word
list, embeddings from hashes, token ids from word lengths."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc

if TYPE_CHECKING:
    from ..testing import FakeLlamad

WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def usage(n: int) -> inference_pb2.Usage:
    """The usage of a fake generation of ``n`` tokens."""
    return inference_pb2.Usage(prompt_tokens=5, completion_tokens=n, total_tokens=5 + n,
                               time_to_first_token_ms=12.5, tokens_per_second=100.0)


def _logprobs(i: int, top: int) -> inference_pb2.TokenLogprobs:
    """Word ``i``'s fake logprobs: itself at -0.1 * (i + 1), then ``top`` - 1 other words."""
    def token(j: int, logprob: float) -> inference_pb2.TokenLogprob:
        word = WORDS[j % len(WORDS)]
        return inference_pb2.TokenLogprob(token=word, logprob=logprob, bytes=word.encode(),
                                          id=j % len(WORDS))
    chosen = token(i, -0.1 * (i + 1))
    others = [token(i + k, chosen.logprob - k) for k in range(1, top)]
    return inference_pb2.TokenLogprobs(chosen=chosen,
                                       top_logprobs=[chosen, *others][:top])


def _check_sampling(sampling: Any, context: grpc.ServicerContext) -> None:
    """The daemon's refusals a client is most likely to meet in a test."""
    if sampling.HasField("top_logprobs") and not sampling.logprobs:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      "sampling.top_logprobs needs sampling.logprobs set")
    if sampling.grammar and sampling.HasField("response_format"):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sampling.grammar and "
                      "sampling.response_format both constrain the output: set one")


class FakeInference(inference_pb2_grpc.InferenceServiceServicer):
    MODEL = "fake-model.gguf"

    def __init__(self, fake: FakeLlamad) -> None:
        self.fake = fake

    def _text(self, sampling: Any, context: grpc.ServicerContext,
              name: str = "") -> Iterator[Any]:
        max_tokens = sampling.max_tokens
        if self.fake.endless:
            for _ in self.fake.until_cancelled(context):
                yield inference_pb2.GenerateResponse(text=" more", tokens=1, model=self.MODEL)
            return
        words = [WORDS[i % len(WORDS)] for i in range(max_tokens or len(WORDS))]
        for i, word in enumerate(words):
            msg = inference_pb2.GenerateResponse(text=word, tokens=1, model=self.MODEL)
            if sampling.logprobs:
                msg.logprobs.append(_logprobs(i, sampling.top_logprobs))
            yield msg
        reason = (inference_pb2.FINISH_REASON_LENGTH if max_tokens
                  else inference_pb2.FINISH_REASON_STOP)
        # The model that served: the one asked for (the fake serves any name), else its
        # default.
        yield inference_pb2.GenerateResponse(model=self.MODEL, finish_reason=reason,
                                             usage=usage(len(words)),
                                             model_name=name or "fake-model")

    def _complete(self, method: str, request: Any, context: grpc.ServicerContext,
                  input_field: str) -> Iterator[Any]:
        """Generate's and Chat's stream: refused when ``input_field`` (the prompt or the
        messages) is empty or the sampling is contradictory, else the word list."""
        self.fake.requests[f"InferenceService/{method}"] = request
        if not getattr(request, input_field):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{input_field} is empty")
        _check_sampling(request.sampling, context)
        return self.fake.stream(f"InferenceService/{method}", context,
                                self._text(request.sampling, context, request.model))

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._complete("Generate", request, context, "prompt")

    def Chat(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self._complete("Chat", request, context, "messages")

    def Embed(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("InferenceService/Embed", context)
        self.fake.requests["InferenceService/Embed"] = request
        vectors = [inference_pb2.Embedding(values=[b / 255 for b in
                                                   hashlib.sha256(t.encode()).digest()[:8]])
                   for t in request.texts]
        return inference_pb2.EmbedResponse(embeddings=vectors, model="fake-embed.gguf",
                                           dimension=8, prompt_tokens=len(request.texts),
                                           model_name=request.model or "fake-embed")

    def Tokenize(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.enter("InferenceService/Tokenize", context)
        self.fake.requests["InferenceService/Tokenize"] = request
        ids = [len(w) for w in request.text.split()]
        return inference_pb2.TokenizeResponse(tokens=ids, count=len(ids), model=self.MODEL,
                                              model_name=request.model or "fake-model")

    def Detokenize(self, request: Any, context: grpc.ServicerContext) -> Any:
        """A word of ``n`` x's per id ``n`` (Tokenize's ids are word lengths)."""
        self.fake.enter("InferenceService/Detokenize", context)
        self.fake.requests["InferenceService/Detokenize"] = request
        return inference_pb2.DetokenizeResponse(
            text=" ".join("x" * t for t in request.tokens), model=self.MODEL,
            model_name=request.model or "fake-model")
