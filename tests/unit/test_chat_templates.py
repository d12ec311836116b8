"""Chat templates: a model's own, a known one by architecture and name, or none."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from daemon.errors import FailedPrecondition
from daemon.models.backend import ChildBackend
from daemon.models.children import ModelFacts, Setup
from supervisor import (
    BundledRuntime,
    GGUFInfo,
    LaunchSpec,
    LlamaServerRuntime,
    Sampling,
    choose_chat_template,
    fallback_chat_template,
)
from supervisor._templates import template_file


def info(architecture: str, name: str, *, has_template: bool = False,
         path: str = "/m/model.gguf") -> GGUFInfo:
    return GGUFInfo(path=path, size=1, version=3, architecture=architecture, name=name,
                    context_length=2048, embedding_length=64, tensor_count=1,
                    file_type="Q4_K_M", has_chat_template=has_template)


def render(name: str, messages: list[dict[str, str]]) -> str:
    source = template_file(name).read_text()
    # A chat prompt, not HTML: escaping would change it (llama.cpp does not escape).
    env = jinja2.Environment()  # noqa: S701
    return env.from_string(source).render(
        messages=messages, add_generation_prompt=True, bos_token="<bos>")


def test_a_model_with_its_own_template_keeps_it() -> None:
    """A GGUF carrying tokenizer.chat_template uses it, whatever its architecture."""
    chosen = choose_chat_template(info("gemma3", "Gemma 3 270m", has_template=True))
    assert (chosen.source, chosen.name, chosen.usable) == ("model", "", True)
    assert fallback_chat_template("gemma3", True, "Gemma 3 270m") is None


def test_a_gemma_without_a_template_gets_gemmas_turn_format() -> None:
    """gemma-3-270m's GGUF has no template: Gemma's own turn format is chosen, and
    Status can say so."""
    chosen = choose_chat_template(info("gemma3", "Gemma 3 270m"))
    assert (chosen.source, chosen.name) == ("known", "gemma")
    assert "gemma" in chosen.describe() and "no tokenizer.chat_template" in chosen.describe()
    assert fallback_chat_template("gemma3", False, "Gemma 3 270m") == "gemma"


def test_a_llama_architecture_file_is_chatml_only_when_named_smollm() -> None:
    """SmolLM2 (llama architecture) without a template gets ChatML, by its name or file
    name; another llama-architecture model without one gets none, and Chat is refused."""
    assert choose_chat_template(info("llama", "SmolLM2 135M")).name == "chatml"
    assert choose_chat_template(
        info("llama", "", path="/m/SmolLM2-135M-Instruct.gguf")).name == "chatml"
    unknown = choose_chat_template(info("llama", "Llama 2 7B Chat"))
    assert (unknown.source, unknown.usable) == ("none", False)
    assert "Llama 2 7B Chat" in unknown.reason and "refused" in unknown.reason
    assert fallback_chat_template("llama", False, "Llama 2 7B Chat") is None


def test_the_gemma_template_renders_gemmas_turns() -> None:
    """The shipped Gemma template folds the system message into the first user turn,
    names the assistant "model", and ends with the model's turn opened."""
    prompt = render("gemma", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How do I restart nginx?"},
        {"role": "assistant", "content": "systemctl restart nginx"},
        {"role": "user", "content": "And check it?"},
    ])
    assert prompt == (
        "<bos><start_of_turn>user\nBe brief.\n\nHow do I restart nginx?<end_of_turn>\n"
        "<start_of_turn>model\nsystemctl restart nginx<end_of_turn>\n"
        "<start_of_turn>user\nAnd check it?<end_of_turn>\n<start_of_turn>model\n")


def test_the_chatml_template_renders_chatml_turns() -> None:
    """The shipped ChatML template writes each message as an im_start/im_end block and
    opens the assistant's."""
    prompt = render("chatml", [{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_llama_server_gets_the_template_as_a_file() -> None:
    """llama-server is given the known template's Jinja file (--chat-template NAME would
    be taken as the template's source), and nothing for a model with its own."""
    spec = LaunchSpec(role="generation", model=Path("/m/g.gguf"), chat_template="gemma")
    argv = LlamaServerRuntime("llama-server").command(spec, socket=Path("/r/c.sock"), alias="a")
    assert "--chat-template" not in argv
    path = Path(argv[argv.index("--chat-template-file") + 1])
    assert path.is_file() and "<start_of_turn>" in path.read_text()
    own = LaunchSpec(role="generation", model=Path("/m/s.gguf"))
    assert "--chat-template-file" not in LlamaServerRuntime("llama-server").command(
        own, socket=Path("/r/c.sock"), alias="a")


def test_the_bundled_runtime_gets_its_chat_format_name() -> None:
    """llama-cpp-python takes the same template by its --chat_format name."""
    spec = LaunchSpec(role="generation", model=Path("/m/g.gguf"), chat_template="chatml")
    argv = BundledRuntime().command(spec, socket=Path("/r/c.sock"), alias="a")
    assert argv[argv.index("--chat_format") + 1] == "chatml"


# --- Chat and Ask on a model without a usable template ---------------------------------


class _Client:
    """Records the chats it is asked for (the child's HTTP client is not reached)."""

    model_name = "m"
    tools_refusal = ""

    def __init__(self) -> None:
        self.chats: list[object] = []

    def stream_chat(self, messages: object, sampling: Sampling, tools: object = None
                    ) -> object:
        self.chats.append(messages)
        return iter(())


def _backend(architecture: str, name: str, client: _Client) -> ChildBackend:
    facts = ModelFacts(Path("/m/model.gguf"), info(architecture, name))
    spec = LaunchSpec(role="generation", model=facts.path)
    setup = Setup(spec, LlamaServerRuntime("llama-server"), facts)
    return ChildBackend(client, setup)  # type: ignore[arg-type]


def test_chat_is_refused_on_a_model_without_a_usable_template() -> None:
    """A model whose GGUF has no template and none is known: Chat (and Ask, which chats
    too) is FAILED_PRECONDITION naming the problem, and the child is not asked."""
    client = _Client()
    with pytest.raises(FailedPrecondition, match=r"no tokenizer\.chat_template"):
        _backend("llama", "Llama 2 7B Chat", client).stream_chat([("user", "hi")], Sampling())
    assert client.chats == []


def test_chat_goes_through_with_a_known_or_own_template() -> None:
    """A Gemma without a template (a known one is used) chats as usual."""
    client = _Client()
    _backend("gemma3", "Gemma 3 270m", client).stream_chat([("user", "hi")], Sampling())
    assert client.chats == [[("user", "hi")]]
