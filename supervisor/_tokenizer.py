"""The tokenizer's calls of an :class:`~supervisor._client.InferenceClient`: text to
token ids, token ids to text, and a chat rendered by the child's own template. Each
runtime keeps them at its own paths (:class:`~supervisor._client.ApiShape`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._tools import Message, ToolUse, messages_json
from .errors import ChildRequestError, TokenizeUnavailableError

if TYPE_CHECKING:  # the client module mixes this in: no import at run time
    from ._client import ApiShape


class TokenizerCalls:
    """Mixed into the client, whose ``_api`` names the paths and whose ``_json`` sends."""

    _api: ApiShape

    async def _json(self, method: str, path: str, body: dict[str, Any] | None, *,
                    timeout: float | None = None) -> dict[str, Any]:
        raise NotImplementedError

    async def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids of ``text`` from the child's own tokenizer."""
        body: dict[str, Any] = {self._api.tokenize_field: text}
        if self._api.tokenize_special_field:
            body[self._api.tokenize_special_field] = add_special
        data = await self._json("POST", self._api.tokenize_path, body)
        try:
            return [int(t) for t in data["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ChildRequestError(f"{self._api.tokenize_path}: malformed answer") from exc

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids of the child's own tokenizer (ids the caller checked:
        llama-server answers an id outside its vocabulary with a 500)."""
        path = self._api.detokenize_path
        text = (await self._json("POST", path, {"tokens": list(tokens)})).get(
            self._api.detokenize_field)
        if not isinstance(text, str):
            raise ChildRequestError(f"{path}: malformed answer")
        return text

    async def apply_template(self, messages: Sequence[Message],
                             tools: ToolUse | None = None) -> str:
        """The prompt the child's chat template renders for ``messages`` and ``tools``
        (llama-server's ``/apply-template``: what ``/v1/chat/completions`` would
        tokenize).

        Raises:
            TokenizeUnavailableError: the runtime renders no template on request.
        """
        path = self._api.apply_template_path
        if path is None:
            raise TokenizeUnavailableError(
                "this runtime does not render its chat template on request (llama-server's "
                "/apply-template; the bundled llama-cpp-python runtime has none)")
        body = {"messages": messages_json(messages),
                **(tools.to_json() if tools is not None else {})}
        prompt = (await self._json("POST", path, body)).get("prompt")
        if not isinstance(prompt, str):
            raise ChildRequestError(f"{path}: malformed answer")
        return prompt
